#!/bin/bash
# Checks the attestations the H200 run returned (run here, not on the device), as
# tests/it/smoke.rs's attest test does: the in-toto project's `in-toto-attestation` package
# (PyPI) parses each as a Statement v1 and validates it; then its subject digest must be the
# manifest digest of the layout that ran (images/.ev21/layout-118, index.json), its predicate
# the --json report's fields, MIG state (`mig`, from NVML) included. Run from the repository root:
#   docs/evidence/issue21/validate.sh > docs/evidence/issue21/validation.txt 2>&1
set -u
py=tests/.cache/venv/bin/python
dir=docs/evidence/issue21
echo "\$ $py -m pip show in-toto-attestation | head -2"
$py -m pip show in-toto-attestation 2>/dev/null | head -2
layout_digest=$($py -c "import json; print(json.load(open('images/.ev21/layout-118/index.json'))['manifests'][0]['digest'])")
echo "layout images/.ev21/layout-118: manifest $layout_digest"
for f in $dir/layout-118.intoto.json $dir/layout-118.json.intoto.json; do
  echo
  echo "### $f (sha256 $(sha256sum "$f" | cut -d' ' -f1))"
  $py - "$f" "$layout_digest" <<'PY'
import json, sys
import google.protobuf.json_format as j
from in_toto_attestation.v1 import statement, statement_pb2
path, layout_digest = sys.argv[1], sys.argv[2]
pb = j.Parse(open(path).read(), statement_pb2.Statement())
statement.Statement.copy_from_pb(pb).validate()
print("in_toto_attestation.v1 Statement.validate(): valid")
print("_type        ", pb.type)
print("predicateType", pb.predicate_type)
subject = pb.subject[0]
print("subject      ", subject.name, "sha256:" + subject.digest["sha256"])
assert "sha256:" + subject.digest["sha256"] == layout_digest, "subject is not the layout's manifest"
print("subject digest == the layout's manifest digest: yes")
p = json.load(open(path))["predicate"]
gpu = p["gpu"]
print("predicate     verdict=%s gpu=%s compute_capability=%s driver=%s driver_cuda=%s image_cuda=%s" % (
    p["verdict"], gpu["name"], gpu["compute_capability"], p["driver_version"], p["driver_cuda"], p["image_cuda"]))
print("              kernel=%s imgbuild=%s" % (p["kernel"], p["imgbuild"]))
mig = p["mig"]
print("              mig: mode=%s pending=%s instance=%s source=%s reason=%s" % (
    mig["mode"], mig["pending"], mig["instance"], mig["source"], mig["reason"]))
assert mig["source"] == "nvml" and mig["mode"] in ("disabled", "enabled", "not-supported", "unknown")
PY
  echo "exit=$?"
done
echo
echo "### the --json run's report is its attestation's predicate (without the imgbuild version)"
$py - $dir/layout-118.json $dir/layout-118.json.intoto.json <<'PY'
import json, sys
report = json.loads(open(sys.argv[1]).readline())
predicate = json.load(open(sys.argv[2]))["predicate"]
version = predicate.pop("imgbuild")
print("equal:", report == predicate, "; imgbuild", version)
PY
echo "exit=$?"
echo
echo "### the same check refuses the attestation with its subject's digest removed (a control)"
$py - $dir/layout-118.intoto.json <<'PY'
import json, sys
import google.protobuf.json_format as j
from in_toto_attestation.v1 import statement, statement_pb2
s = json.load(open(sys.argv[1]))
s["subject"][0]["digest"] = {}
pb = j.Parse(json.dumps(s), statement_pb2.Statement())
try:
    statement.Statement.copy_from_pb(pb).validate()
    print("valid (the control failed)")
    sys.exit(1)
except ValueError as e:
    print("refused:", e)
PY
echo "exit=$?"
