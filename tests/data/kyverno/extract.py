"""Writes clusterpolicy-v1.schema.json from Kyverno's ClusterPolicy CRD (see MANIFEST.md).

    python extract.py kyverno.io_clusterpolicies.yaml > clusterpolicy-v1.schema.json

The input is Kyverno's `config/crds/kyverno/kyverno.io_clusterpolicies.yaml`. The output is
the `openAPIV3Schema` of its `v1` version as a JSON Schema, changed in three ways only:
descriptions are left out (they do not validate anything); every object schema that lists
`properties` and says nothing of other keys (no `additionalProperties`, no
`x-kubernetes-preserve-unknown-fields`) gets `additionalProperties: false`, the strict form
kubeconform's openapi2jsonschema writes, so a misspelt field fails instead of being pruned
silently by the API server; and `apiVersion` and `kind` must be `kyverno.io/v1` and
`ClusterPolicy`. Needs PyYAML.
"""

import json
import sys

import yaml

SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
SCHEMA_ONE = ("items", "additionalProperties", "not")


def strict(schema):
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in SCHEMA_MAPS:
            out[key] = {name: strict(s) for name, s in value.items()}
        elif key in SCHEMA_LISTS:
            out[key] = [strict(s) for s in value]
        elif key in SCHEMA_ONE:
            out[key] = strict(value)
        else:
            out[key] = value
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main():
    crd = yaml.safe_load(open(sys.argv[1]))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"]["enum"] = ["kyverno.io/v1"]
    schema["properties"]["kind"]["enum"] = ["ClusterPolicy"]
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "spec"})
    json.dump(schema, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


main()
