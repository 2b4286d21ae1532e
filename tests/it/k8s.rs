//! `imgbuild k8s` (issue 4 part 1): every manifest kind validates offline with
//! kubernetes-validate (strict, Kubernetes 1.33 and 1.37) and carries the image by digest, the
//! GPU limit, the driver affinity and a non-root security context.

use std::process::Command;

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, venv_tool},
    support::{channel::tiny_recipe, shared_channel},
};

const REPOSITORY: &str = "registry.example/ml/train";

/// A built CUDA 11.8 image whose minimum driver is 520.61.05, running as 1001:1002.
fn cuda_image() -> Project {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "train", &["cuda-cudart", "hello 1.0"])
        .replace("[image]\n", "[image]\nuser = \"1001:1002\"\n")
        + "\n[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
}

/// Validates `yaml` with kubernetes-validate (strict, 1.33 and 1.37) and returns its
/// documents as JSON.
pub(super) fn validated(project: &Project, yaml: &str) -> Vec<Value> {
    let file = project.path().join("manifest.yaml");
    fs_err::write(&file, yaml).unwrap();
    for version in ["1.33.0", "1.37.0"] {
        let output = Command::new(venv_tool("kubernetes-validate"))
            .args(["--strict", "-k", version])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kubernetes-validate {version} rejects:\n{yaml}\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // YAML → JSON through Python's yaml (kubernetes-validate's own dependency).
    let output = Command::new(venv_tool("python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Runs `imgbuild k8s` on the image and returns its one validated document.
fn manifest(project: &Project, args: &[&str]) -> Value {
    let mut all = vec!["k8s", "images/train", "--repository", REPOSITORY];
    all.extend_from_slice(args);
    let run = project.run(&all).success();
    let mut docs = validated(project, &run.stdout);
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

fn check_pod(pod: &Value, digest: &str, gpus: &str) {
    let container = &pod["containers"][0];
    assert_eq!(container["image"], format!("{REPOSITORY}@{digest}"));
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], gpus);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["runAsUser"], 1001, "the image's user");
    assert_eq!(security["runAsGroup"], 1002);
    // GPU node pools are tainted `nvidia.com/gpu`: a GPU pod tolerates it.
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    // Nodes whose driver is at least 520.61.05, from GPU feature discovery's labels.
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms.as_array().unwrap().len(), 3, "{terms}");
    assert_eq!(
        terms[0]["matchExpressions"][0]["key"],
        "nvidia.com/cuda.driver.major"
    );
    assert_eq!(terms[0]["matchExpressions"][0]["operator"], "Gt");
    assert_eq!(terms[0]["matchExpressions"][0]["values"][0], "520");
    assert_eq!(
        terms[2]["matchExpressions"][2]["key"],
        "nvidia.com/cuda.driver.rev"
    );
    assert_eq!(terms[2]["matchExpressions"][2]["values"][0], "4");
    // Every term also asks for a Linux node of the image's architecture.
    for term in terms.as_array().unwrap() {
        let expressions = term["matchExpressions"].as_array().unwrap();
        let platform = &expressions[expressions.len() - 2..];
        assert_eq!(
            platform,
            [
                serde_json::json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}),
                serde_json::json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}),
            ],
            "{term}"
        );
    }
}

#[test]
fn job_and_deployment_validate_and_pin_the_image() {
    let project = cuda_image();
    let digest = LayoutView::new(project.path().join("images/train")).manifest_digest();

    let job = manifest(
        &project,
        &[
            "--job",
            "--runtime-class",
            "nvidia",
            "--pull-secret",
            "regcred",
            "--set",
            "command=[\"/opt/conda/bin/hello\"]",
            "--set",
            "memory=8Gi",
            "--set",
            "namespace=ml",
        ],
    );
    assert_eq!(job["kind"], "Job");
    assert_eq!(job["apiVersion"], "batch/v1");
    assert_eq!(job["metadata"]["name"], "train");
    assert_eq!(job["metadata"]["namespace"], "ml");
    let pod = &job["spec"]["template"]["spec"];
    check_pod(pod, &digest, "1");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(pod["containers"][0]["command"][0], "/opt/conda/bin/hello");
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "8Gi");

    let deployment = manifest(
        &project,
        &[
            "--deployment",
            "--set",
            "replicas=3",
            "--set",
            "gpus=2",
            "--set",
            "name=serve",
        ],
    );
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    check_pod(&deployment["spec"]["template"]["spec"], &digest, "2");
}

#[test]
fn bad_overrides_and_references_are_refused() {
    let project = cuda_image();
    project
        .run(&[
            "k8s",
            "images/train",
            "--repository",
            REPOSITORY,
            "--set",
            "memroy=1Gi",
        ])
        .assert_failure_naming(1, &["no key `memroy`", "did you mean `memory`"]);
    project
        .run(&[
            "k8s",
            "images/train",
            "--repository",
            "registry.example/ml/train:v1",
        ])
        .assert_failure_naming(1, &["not a repository", "digest"]);
    project
        .run(&[
            "k8s",
            "images/train",
            "--repository",
            REPOSITORY,
            "--set",
            "user=0",
        ])
        .assert_failure_naming(1, &["non-zero UID"]);
    project
        .run(&["k8s", "images/missing", "--repository", REPOSITORY])
        .assert_clean_failure(1);
    // No embedded smoke test in this image.
    project
        .run(&[
            "k8s",
            "images/train",
            "--repository",
            REPOSITORY,
            "--smoke-job",
        ])
        .assert_failure_naming(1, &["no embedded smoke test", "[smoke] embed = true"]);
}

/// `--smoke-job`: a Job running the embedded `imgbuild-smoke` on one GPU, at the prefix the
/// image was built for, ended after 10 minutes, never retried; it validates.
#[test]
fn smoke_job_runs_the_embedded_smoke_test_on_one_gpu() {
    let project = crate::smoke_embed::embedding_project("gpu-check");
    crate::smoke_embed::build_with(&project, crate::support::smoke_exe()).success();
    let digest = LayoutView::new(project.path().join("images/gpu-check")).manifest_digest();
    let run = project
        .run(&[
            "k8s",
            "images/gpu-check",
            "--repository",
            REPOSITORY,
            "--smoke-job",
            "--runtime-class",
            "nvidia",
        ])
        .success();
    let docs = validated(&project, &run.stdout);
    let job = &docs[0];
    assert_eq!(job["kind"], "Job");
    assert_eq!(job["metadata"]["name"], "gpu-check-smoke");
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 600);
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["runtimeClassName"], "nvidia");
    let container = &pod["containers"][0];
    assert_eq!(container["image"], format!("{REPOSITORY}@{digest}"));
    assert_eq!(
        container["command"],
        serde_json::json!(["/opt/imgbuild/bin/imgbuild-smoke"])
    );
    assert_eq!(
        container["args"],
        serde_json::json!(["--prefix", "/opt/conda"])
    );
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    // The driver affinity of the image's min-driver (520.61.05).
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms[0]["matchExpressions"][0]["values"][0], "520");

    // `inspect` names the layer and the executable.
    let inspect = project.run(&["inspect", "images/gpu-check"]).success();
    assert!(
        inspect
            .stdout
            .contains("smoke        /opt/imgbuild/bin/imgbuild-smoke"),
        "{}",
        inspect.stdout
    );
    assert!(
        inspect.stdout.contains("smoke test executable"),
        "{}",
        inspect.stdout
    );
    assert!(inspect.stdout.contains("image files"), "{}", inspect.stdout);
}

/// `--build-job`: the recipe and every variant's lock in a ConfigMap, and an Indexed Job
/// with one pod per variant building it `--locked` and pushing it; both validate.
#[test]
fn build_job_builds_each_variant_in_its_own_pod() {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "m", &["hello {{hello}}", "{{extra}}"])
        + "\n[matrix]\nhello = [\"1.0\", \"2.0\"]\nextra = [\"pyhello\", \"other\"]\n";
    project.write_recipe(&recipe);
    let job_args = [
        "k8s",
        "--build-job",
        "recipes/image.toml",
        "--builder-image",
        "registry.example/tools/imgbuild@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "--repository",
        "registry.example/ml/m",
        "--push-secret",
        "push-creds",
        "--toleration",
        "dedicated=build:NoSchedule",
        "--cache-repo",
        "registry.example/ci/cache",
    ];
    // No locks yet: the pods build `--locked`, so the command asks for them.
    project
        .run(&job_args)
        .assert_failure_naming(1, &["does not exist", "lock every variant first"]);
    project.build(&[]).success();
    // Every variant would push to `latest`.
    project
        .run(&job_args)
        .assert_failure_naming(1, &["would both push to tag `latest`"]);

    project
        .write_recipe(&recipe.replace("[image]\n", "[image]\ntags = [\"{{hello}}-{{extra}}\"]\n"));
    project.build(&[]).success();
    let run = project.run(&job_args).success();
    assert!(run.stderr.contains("is on this machine"), "{}", run.stderr);
    let docs = validated(&project, &run.stdout);
    assert_eq!(docs.len(), 2);
    let (config, job) = (&docs[0], &docs[1]);
    assert_eq!(config["kind"], "ConfigMap");
    let data = config["data"].as_object().unwrap();
    assert_eq!(
        data["image.toml"],
        fs_err::read_to_string(project.recipe_path()).unwrap()
    );
    assert_eq!(
        data.len(),
        5,
        "the recipe and four locks: {:?}",
        data.keys()
    );
    assert_eq!(
        data["image.extraother-hello1.0.lock"],
        fs_err::read_to_string(
            project
                .path()
                .join("recipes/image.extraother-hello1.0.lock")
        )
        .unwrap()
    );

    assert_eq!(job["kind"], "Job");
    assert_eq!(job["metadata"]["name"], "m-build");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    assert_eq!(job["spec"]["completions"], 4);
    let pod = &job["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "build",
            "/recipes/image.toml",
            "--locked",
            "--push",
            "registry.example/ml/m",
            "--variant",
            "$(VARIANT_INDEX)",
            // The pods share one registry layer cache: a layer already there when a pod
            // reaches it is not compressed again.
            "--cache-repo",
            "registry.example/ci/cache"
        ]
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    // Build pods take `--toleration` (dedicated build nodes), no GPU taint's.
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Equal", "value": "build", "effect": "NoSchedule"}])
    );
    let mut with_env = job_args.to_vec();
    with_env.extend(["--env", "A=b"]);
    project
        .run(&with_env)
        .assert_failure_naming(2, &["--env", "--build-job"]);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "VARIANT_INDEX"
                && e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap()
                    .contains("job-completion-index")),
        "{container}"
    );

    // What a pod runs: variant 2 alone, by index, with its own tag (values in the
    // recipe's order, keys sorted: extra=pyhello before extra=other).
    fs_err::remove_dir_all(project.path().join("images")).unwrap();
    project
        .run(&["build", "recipes/image.toml", "--locked", "--variant", "2"])
        .success();
    let built: Vec<String> = fs_err::read_dir(project.path().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    assert_eq!(built, ["m-extraother-hello1.0"]);
    let layout = LayoutView::new(project.path().join("images/m-extraother-hello1.0"));
    assert_eq!(
        layout.index()["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        "1.0-other"
    );
    project
        .run(&["build", "recipes/image.toml", "--variant", "9"])
        .assert_failure_naming(1, &["no variant `9`", "0: extrapyhello-hello1.0"]);
}

/// The builder image of the `--build-job` tests, by digest.
const BUILDER: &str = "registry.example/tools/imgbuild@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A locked matrix of two variants, each with its own tag.
fn locked_matrix() -> Project {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "m", &["hello {{hello}}"])
        .replace("[image]\n", "[image]\ntags = [\"{{hello}}\"]\n")
        + "\n[matrix]\nhello = [\"1.0\", \"2.0\"]\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
}

/// A container's or pod's field as strings (`args`, `command`).
fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// `--shards 4`: before the variant Job, the ServiceAccount, Role and RoleBinding its pods
/// wait with and an Indexed Job of four pods, each building one shard of the matrix's layers
/// into the cache; the variant pods wait for that Job in init containers (until it completed
/// or failed, then that it completed) and run as the ServiceAccount, which may only read it.
/// All six documents validate; the shard pods are the build pods but for their arguments.
#[test]
fn build_job_shards_fill_the_cache_before_the_variants() {
    let project = locked_matrix();
    let cache = "registry.example/ci/cache";
    let base = [
        "k8s",
        "--build-job",
        "recipes/image.toml",
        "--builder-image",
        BUILDER,
        "--repository",
        "registry.example/ml/m",
        "--push-secret",
        "push-creds",
        "--pull-secret",
        "regcred",
        "--toleration",
        "dedicated=build:NoSchedule",
        "--set",
        "cpu=2",
        "--set",
        "namespace=ci",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        project.run(&args)
    };
    let out = run(&["--cache-repo", cache, "--shards", "4"]).success();
    let docs = validated(&project, &out.stdout);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Job",
            "Job"
        ]
    );
    let [_, account, role, binding, shards, assembly] = &docs[..] else {
        unreachable!()
    };
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"], "ci", "{doc}");
    }
    for doc in [account, role, binding] {
        assert_eq!(doc["metadata"]["name"], "m-build-builder");
    }
    // Reading the shards Job, nothing else: no other verb, resource or name.
    assert_eq!(role["apiVersion"], "rbac.authorization.k8s.io/v1");
    assert_eq!(
        role["rules"],
        serde_json::json!([{
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "resourceNames": ["m-build-shards"],
            "verbs": ["get", "list", "watch"],
        }])
    );
    assert_eq!(
        binding["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "m-build-builder"})
    );
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "m-build-builder", "namespace": "ci"}])
    );

    assert_eq!(shards["metadata"]["name"], "m-build-shards");
    let spec = &shards["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], 4);
    assert_eq!(spec["parallelism"], 4);
    assert_eq!(spec["backoffLimitPerIndex"], 1);
    let shard_pod = pod_of(shards);
    let shard = &shard_pod["containers"][0];
    assert_eq!(
        strings(&shard["args"]),
        [
            "build",
            "/recipes/image.toml",
            "--locked",
            "--shard",
            "$(SHARD_INDEX)/4",
            "--cache-repo",
            cache,
            "--json"
        ]
    );
    let index = shard["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SHARD_INDEX")
        .unwrap_or_else(|| panic!("no SHARD_INDEX: {shard}"));
    assert_eq!(
        index["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    );
    assert!(shard_pod.get("serviceAccountName").is_none(), "{shard_pod}");
    assert!(shard_pod.get("initContainers").is_none(), "{shard_pod}");

    // The assembly: the variant Job as without `--shards`, its pods held back by the waits.
    assert_eq!(assembly["metadata"]["name"], "m-build");
    assert_eq!(assembly["spec"]["completions"], 2);
    let pod = pod_of(assembly);
    assert_eq!(pod["serviceAccountName"], "m-build-builder");
    let builder = &pod["containers"][0];
    assert_eq!(
        strings(&builder["args"]),
        [
            "build",
            "/recipes/image.toml",
            "--locked",
            "--push",
            "registry.example/ml/m",
            "--variant",
            "$(VARIANT_INDEX)",
            "--cache-repo",
            cache
        ]
    );
    // The shard pods are the build pods: same image, security, volumes, mounts, resources,
    // pull secrets and tolerations.
    for key in [
        "securityContext",
        "volumes",
        "imagePullSecrets",
        "tolerations",
        "restartPolicy",
    ] {
        assert_eq!(shard_pod[key], pod[key], "{key}");
    }
    for key in [
        "image",
        "securityContext",
        "volumeMounts",
        "resources",
        "workingDir",
    ] {
        assert_eq!(shard[key], builder[key], "{key}");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 1000);
    assert_eq!(builder["resources"]["requests"]["cpu"], "2");

    let init = pod["initContainers"].as_array().unwrap();
    let names: Vec<&str> = init.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["wait-for-shards", "shards-complete"]);
    // Until the shards Job has a terminal condition (Complete or Failed: a failed shard
    // fails the assembly now, not after the timeout), then that it completed.
    assert_eq!(
        strings(&init[0]["args"]),
        [
            "wait",
            "job/m-build-shards",
            r#"--for=jsonpath={.status.conditions[?(@.type<"Failed~")].status}=True"#,
            "--timeout=24h"
        ]
    );
    assert_eq!(
        strings(&init[1]["args"]),
        [
            "wait",
            "job/m-build-shards",
            "--for=condition=Complete",
            "--timeout=0s"
        ]
    );
    let help = project.run(&["k8s", "--help"]).success().stdout;
    assert!(
        help.contains("(default: `registry.k8s.io/kubectl:v1.33.0`)"),
        "the help names the default: {help}"
    );
    for container in init {
        assert_eq!(container["image"], "registry.k8s.io/kubectl:v1.33.0");
        assert_eq!(strings(&container["command"]), ["kubectl"]);
        assert_eq!(
            container["securityContext"],
            serde_json::json!({
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": true,
            })
        );
        // kubectl's cache on the pod's scratch volume.
        assert_eq!(
            container["env"],
            serde_json::json!([{"name": "HOME", "value": "/work"}])
        );
        assert_eq!(
            container["volumeMounts"],
            serde_json::json!([{"name": "work", "mountPath": "/work"}])
        );
    }

    // Another kubectl image; without a namespace the binding's subject names none (it is
    // the binding's own).
    let mut other = base[..base.len() - 2].to_vec();
    other.extend([
        "--cache-repo",
        cache,
        "--shards",
        "1",
        "--kubectl-image",
        "registry.example/tools/kubectl:v1.34.1",
    ]);
    let docs = validated(&project, &project.run(&other).success().stdout);
    assert_eq!(
        docs[3]["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "m-build-builder"}])
    );
    assert_eq!(docs[4]["spec"]["completions"], 1);
    assert_eq!(
        strings(&pod_of(&docs[4])["containers"][0]["args"])[3..5],
        ["--shard", "$(SHARD_INDEX)/1"]
    );
    let init = &pod_of(&docs[5])["initContainers"];
    assert_eq!(init[0]["image"], "registry.example/tools/kubectl:v1.34.1");
    assert_eq!(init[1]["image"], "registry.example/tools/kubectl:v1.34.1");

    // Refused, naming the flag: no cache for the shards to fill, and N outside 1..=1000.
    run(&["--shards", "4"]).assert_failure_naming(2, &["--cache-repo", "--shards"]);
    for n in ["0", "1001", "four"] {
        run(&["--cache-repo", cache, "--shards", n])
            .assert_failure_naming(2, &["--shards", &format!("'{n}'")]);
    }
    run(&["--cache-repo", cache, "--kubectl-image", "k:1"])
        .assert_failure_naming(2, &["--kubectl-image", "--shards"]);
    // A name that `-shards` would make too long for a Job.
    let long = format!("name={}", "n".repeat(60));
    run(&["--cache-repo", cache, "--shards", "2", "--set", &long])
        .assert_failure_naming(1, &["-shards`", "not a valid Kubernetes name"]);
}

/// The pod spec of a one-document manifest.
fn pod_of(doc: &Value) -> &Value {
    &doc["spec"]["template"]["spec"]
}

/// Issue 18 part 5: `/dev/shm`, environment, PVC and hostPath volumes and tolerations, as
/// GPU clusters need them; sorted where their order means nothing, and valid.
#[test]
fn gpu_pods_get_shm_env_volumes_and_tolerations() {
    let project = cuda_image();
    let settings = [
        "--set",
        "shm=16Gi",
        "--env",
        "HF_HOME=/cache/hf",
        "--env",
        "OPTS=--a=b",
        "--volume",
        "data=pvc:datasets:/data:ro",
        "--volume",
        "cache=host:/mnt/cache:/cache",
        "--toleration",
        "example.com/spot",
        "--toleration",
        "dedicated=ml:NoExecute",
    ];
    let job = manifest(&project, &settings);
    let mut deployment_args = vec!["--deployment"];
    deployment_args.extend_from_slice(&settings);
    let deployment = manifest(&project, &deployment_args);
    for doc in [&job, &deployment] {
        let pod = pod_of(doc);
        assert_eq!(
            pod["volumes"],
            serde_json::json!([
                {"name": "cache", "hostPath": {"path": "/mnt/cache"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": true}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            ])
        );
        let container = &pod["containers"][0];
        assert_eq!(
            container["volumeMounts"],
            serde_json::json!([
                {"name": "cache", "mountPath": "/cache"},
                {"name": "data", "mountPath": "/data", "readOnly": true},
                {"name": "shm", "mountPath": "/dev/shm"},
            ])
        );
        // In the order given: a later value may refer to an earlier `$(NAME)`.
        assert_eq!(
            container["env"],
            serde_json::json!([
                {"name": "HF_HOME", "value": "/cache/hf"},
                {"name": "OPTS", "value": "--a=b"},
            ])
        );
        assert_eq!(
            pod["tolerations"],
            serde_json::json!([
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                {"key": "example.com/spot", "operator": "Exists"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ])
        );
    }
    // The opt-out drops the GPU taint's toleration, not the ones asked for.
    let opted_out = manifest(
        &project,
        &["--no-gpu-toleration", "--toleration", "dedicated=ml"],
    );
    assert_eq!(
        pod_of(&opted_out)["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Equal", "value": "ml"}])
    );
    let none = manifest(&project, &["--no-gpu-toleration"]);
    assert!(pod_of(&none).get("tolerations").is_none(), "{none}");
    // A pod without a GPU goes to no GPU node, so it tolerates no GPU taint.
    let cpu_only = manifest(&project, &["--set", "gpus=0"]);
    assert!(pod_of(&cpu_only).get("tolerations").is_none(), "{cpu_only}");
}

/// `--no-gpu-feature-discovery`: clusters without GPU feature discovery have none of its
/// labels, so the pod requires only a Linux node of its architecture.
#[test]
fn gpu_feature_discovery_labels_are_optional() {
    let project = cuda_image();
    let job = manifest(&project, &["--no-gpu-feature-discovery"]);
    let pod = pod_of(&job);
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        serde_json::json!([{"matchExpressions": [
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        ]}])
    );
    // Still a GPU pod.
    assert_eq!(
        pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
}

/// An image whose user is root runs as root, with a warning, not silently as 1000.
#[test]
fn image_root_user_is_kept_with_a_warning() {
    for user in ["0", "root"] {
        let project = Project::new();
        let recipe = tiny_recipe(shared_channel(), "rooted", &["hello 1.0"])
            .replace("[image]\n", &format!("[image]\nuser = \"{user}\"\n"));
        project.write_recipe(&recipe);
        project.build(&[]).success();
        let args = ["k8s", "images/rooted", "--repository", REPOSITORY];
        let run = project.run(&args).success();
        assert!(
            run.stderr.contains("warning:") && run.stderr.contains("runs as root"),
            "{}",
            run.stderr
        );
        let docs = validated(&project, &run.stdout);
        let pod = pod_of(&docs[0]);
        assert_eq!(pod["securityContext"]["runAsUser"], 0, "{user}");
        assert_eq!(pod["securityContext"]["runAsGroup"], 0);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], false);

        let mut with_user = args.to_vec();
        with_user.extend(["--set", "user=1000"]);
        let run = project.run(&with_user).success();
        assert!(!run.stderr.contains("warning"), "{}", run.stderr);
        let docs = validated(&project, &run.stdout);
        let security = &pod_of(&docs[0])["securityContext"];
        assert_eq!(security["runAsUser"], 1000);
        assert_eq!(security["runAsNonRoot"], true);
    }
}

/// Malformed `--env`, `--volume`, `--toleration` and `--set shm` are refused, naming the
/// flag and the value.
#[test]
fn bad_settings_are_refused_naming_flag_and_value() {
    let project = cuda_image();
    let run = |extra: &[&str]| {
        let mut args = vec!["k8s", "images/train", "--repository", REPOSITORY];
        args.extend_from_slice(extra);
        project.run(&args)
    };
    run(&["--env", "NOVALUE"]).assert_failure_naming(2, &["--env", "`NOVALUE`", "NAME=VALUE"]);
    run(&["--env", "1X=y"]).assert_failure_naming(2, &["--env", "`1X` is not a variable name"]);
    run(&["--volume", "data=nfs:server:/data"])
        .assert_failure_naming(2, &["--volume", "unknown kind `nfs`"]);
    run(&["--volume", "data=host:mnt:/data"])
        .assert_failure_naming(2, &["--volume", "`mnt` is not an absolute path"]);
    run(&["--volume", "data=pvc:datasets"])
        .assert_failure_naming(2, &["--volume", "`data=pvc:datasets`"]);
    run(&["--toleration", "gpu:Never"])
        .assert_failure_naming(2, &["--toleration", "unknown effect `Never`"]);
    run(&["--toleration", "a b=c"])
        .assert_failure_naming(2, &["--toleration", "`a b` is not a taint key"]);
    run(&["--set", "shm=16GB"]).assert_failure_naming(1, &["`--set shm=16GB`", "quantity"]);
    run(&["--set", "shm=1Gi", "--volume", "x=pvc:c:/dev/shm"])
        .assert_failure_naming(1, &["mount path `/dev/shm` is given twice"]);
    run(&["--volume", "x=pvc:c:/a", "--volume", "x=pvc:d:/b"])
        .assert_failure_naming(1, &["volume name `x` is given twice"]);
    run(&["--env", "A=1", "--env", "A=2"]).assert_failure_naming(1, &["`A` is given twice"]);
}

/// The policy document `imgbuild k8s --require-smoke-attestation` prints before the
/// workload, validated with check-jsonschema against the strict `v1` schema of Kyverno's
/// ClusterPolicy CRD (`tests/data/kyverno/`), and the workload as [`validated`] validates it.
/// Returns (the workload's documents, the policy's text, the policy as JSON).
fn with_policy(project: &Project, stdout: &str) -> (Vec<Value>, String, Value) {
    let (policy, workload) = stdout
        .split_once("\n---\n")
        .expect("the policy, then `---` and the workload");
    let policy = format!("{policy}\n");
    let docs = validated(project, workload);
    let file = project.path().join("policy.yaml");
    fs_err::write(&file, &policy).unwrap();
    check_kyverno_schema(&file).unwrap_or_else(|e| panic!("{e}\n{policy}"));
    let output = Command::new(venv_tool("python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success());
    (
        docs,
        policy,
        serde_json::from_slice(&output.stdout).unwrap(),
    )
}

/// check-jsonschema of `file` (YAML or JSON) against Kyverno's ClusterPolicy v1 schema.
fn check_kyverno_schema(file: &std::path::Path) -> Result<(), String> {
    let schema = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kyverno/clusterpolicy-v1.schema.json");
    let output = Command::new(venv_tool("check-jsonschema"))
        .arg("--schemafile")
        .arg(&schema)
        .arg(file)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "check-jsonschema rejects {}:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// What a condition's `{{ a.b }}` key names in a predicate (the dotted JMESPath of the
/// policy's keys, no more).
fn resolve<'a>(predicate: &'a Value, key: &str) -> &'a Value {
    let path = key
        .trim()
        .strip_prefix("{{")
        .and_then(|k| k.strip_suffix("}}"))
        .expect("a `{{ … }}` key")
        .trim();
    path.split('.').fold(predicate, |v, field| &v[field])
}

/// Whether `predicate` meets the policy's conditions, evaluated the way Kyverno evaluates
/// these three operators (every `all` condition and one `any` condition; `AnyIn` matches a
/// value or a `*` wildcard, `GreaterThanOrEquals` compares numbers). A check that the keys
/// name the smoke report's real fields and the values fit them, not Kyverno itself.
fn admits(policy: &Value, predicate: &Value) -> bool {
    let holds = |condition: &Value| {
        let value = resolve(predicate, condition["key"].as_str().unwrap());
        let Some(value) = value.as_str() else {
            return false;
        };
        match condition["operator"].as_str().unwrap() {
            "Equals" => condition["value"] == value,
            "AnyIn" => condition["value"].as_array().unwrap().iter().any(|p| {
                let p = p.as_str().unwrap();
                match p.strip_suffix('*') {
                    Some(prefix) => value.starts_with(prefix),
                    None => p == value,
                }
            }),
            "GreaterThanOrEquals" => {
                let number = |s: &str| s.parse::<f64>().unwrap();
                number(value) >= number(condition["value"].as_str().unwrap())
            }
            other => panic!("an operator the policy does not use: {other}"),
        }
    };
    let attestation = &policy["spec"]["rules"][0]["verifyImages"][0]["attestations"][0];
    attestation["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|block| {
            let list = |k: &str| block[k].as_array().cloned().unwrap_or_default();
            list("all").iter().all(holds)
                && (list("any").is_empty() || list("any").iter().any(holds))
        })
}

/// The H200 attestation kept as issue 21's evidence (a real `imgbuild smoke --attest` run).
fn h200_attestation() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/evidence/issue21/layout-118.intoto.json");
    serde_json::from_str(&fs_err::read_to_string(path).unwrap()).unwrap()
}

/// Issue 21, section 3: `--require-smoke-attestation` adds a Kyverno ClusterPolicy, valid
/// against Kyverno's own schema, that verifies the image's signed GPU smoke attestations
/// (sigstore bundles, a static key, no transparency log) and holds each to `verdict: pass`
/// on a GPU of the compute capabilities the pod's node affinity targets. Its conditions
/// admit the real H200 attestation and refuse it failed or from a GPU outside the class.
#[test]
fn require_smoke_attestation_adds_a_kyverno_policy_for_the_gpu_class() {
    let channel = tempfile::tempdir().unwrap();
    crate::fatbin::write_gpu_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(
        &(tiny_recipe(channel.path(), "gpu", &["libgpu", "libold"])
            + "\n[cuda]\nversion = \"12.1\"\nmin-driver = \"530.30.02\"\n"),
    );
    project.build(&[]).success();
    let repository = "registry.example/ml/gpu";
    let run = project
        .run(&[
            "k8s",
            "images/gpu",
            "--repository",
            repository,
            "--require-smoke-attestation",
            "--set",
            "namespace=ml",
        ])
        .success();
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    let (docs, text, policy) = with_policy(&project, &run.stdout);
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["kind"], "Job");
    // The header says what Kyverno verifies and what the user fills in.
    for needle in [
        "signed sigstore bundles",
        "OCI 1.1 referrers",
        "docs/src/commands/k8s.md",
        "cosign attest --key",
        "Replace the placeholder",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    assert_eq!(policy["apiVersion"], "kyverno.io/v1");
    assert_eq!(policy["kind"], "ClusterPolicy");
    assert_eq!(policy["metadata"]["name"], "gpu-gpu-smoke");
    assert_eq!(policy["spec"]["background"], false);
    assert_eq!(
        policy["spec"]["webhookConfiguration"]["failurePolicy"],
        "Fail"
    );
    let rule = &policy["spec"]["rules"][0];
    assert_eq!(
        rule["match"],
        serde_json::json!({"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["ml"]}}]})
    );
    let verify = &rule["verifyImages"][0];
    assert_eq!(verify["type"], "SigstoreBundle");
    assert_eq!(verify["failureAction"], "Enforce");
    assert_eq!(verify["required"], true);
    assert_eq!(
        verify["imageReferences"],
        serde_json::json!([format!("{repository}@*"), format!("{repository}:*")])
    );
    let attestation = &verify["attestations"][0];
    assert_eq!(
        attestation["type"],
        "https://imgbuild.dev/attestations/gpu-smoke/v1"
    );
    let key = &attestation["attestors"][0]["entries"][0]["keys"];
    assert!(
        key["publicKeys"]
            .as_str()
            .unwrap()
            .contains("REPLACE-WITH-THE-PUBLIC-KEY"),
        "{key}"
    );
    assert_eq!(key["rekor"]["ignoreTlog"], true);
    assert_eq!(key["ctlog"]["ignoreSCT"], true);
    // The class is the affinity's: 8.0 and newer runs both libraries (`major In 8…12` or
    // `major Gt 12`, as tests/it/fatbin.rs checks the node terms).
    let conditions = &attestation["conditions"][0];
    assert_eq!(
        conditions["all"],
        serde_json::json!([{"key": "{{ verdict }}", "operator": "Equals", "value": "pass",
            "message": "an imgbuild GPU smoke attestation of the image does not say `pass`"}])
    );
    let any = conditions["any"].as_array().unwrap();
    assert_eq!(any[0]["key"], "{{ gpu.compute_capability }}");
    assert_eq!(any[0]["operator"], "AnyIn");
    assert_eq!(
        any[0]["value"],
        serde_json::json!(["8.*", "9.*", "10.*", "11.*", "12.*"])
    );
    assert_eq!(any[1]["operator"], "GreaterThanOrEquals");
    assert_eq!(any[1]["value"], "13.0");

    // The conditions on the H200's real attestation (compute capability 9.0, pass).
    let statement = h200_attestation();
    assert_eq!(
        statement["predicateType"], attestation["type"],
        "the policy's type is the one `smoke --attest` writes"
    );
    let predicate = &statement["predicate"];
    assert_eq!(predicate["gpu"]["compute_capability"], "9.0");
    assert!(admits(&policy, predicate));
    let mut failed = predicate.clone();
    failed["verdict"] = "kernel-failure".into();
    assert!(!admits(&policy, &failed));
    let mut no_device = predicate.clone();
    no_device["verdict"] = "no-device".into();
    no_device["gpu"] = Value::Null;
    assert!(!admits(&policy, &no_device));
    let mut volta = predicate.clone();
    volta["gpu"]["compute_capability"] = "7.0".into();
    assert!(!admits(&policy, &volta), "7.0 runs neither library");
    let mut newer = predicate.clone();
    newer["gpu"]["compute_capability"] = "13.1".into();
    assert!(admits(&policy, &newer), "PTX runs on 13.x");

    // The schema is strict: a misspelt field of the policy fails it.
    let mut misspelt = policy.clone();
    let attestation = &mut misspelt["spec"]["rules"][0]["verifyImages"][0]["attestations"][0];
    let conditions = attestation["conditions"].take();
    attestation.as_object_mut().unwrap().remove("conditions");
    attestation["condition"] = conditions;
    let file = project.path().join("misspelt.json");
    fs_err::write(&file, misspelt.to_string()).unwrap();
    let refused = check_kyverno_schema(&file).unwrap_err();
    assert!(refused.contains("'condition' was unexpected"), "{refused}");
}

/// Without a GPU class to hold the image to (no recorded architectures, or the opt-outs),
/// the policy checks the verdict only and says so; a pod without a GPU, the smoke Job and
/// the build Job are refused.
#[test]
fn require_smoke_attestation_without_a_gpu_class_checks_the_verdict_and_warns() {
    let project = cuda_image();
    let base = ["k8s", "images/train", "--repository", REPOSITORY];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.push("--require-smoke-attestation");
        args.extend_from_slice(extra);
        project.run(&args)
    };
    for (extra, why) in [
        (&[][..], "records no GPU architectures"),
        (&["--deployment"][..], "records no GPU architectures"),
        (
            &["--no-gpu-feature-discovery"][..],
            "--no-gpu-feature-discovery",
        ),
    ] {
        let run = with(extra).success();
        assert!(
            run.stderr.contains("warning:")
                && run.stderr.contains("targets no GPU class")
                && run.stderr.contains(why),
            "{}",
            run.stderr
        );
        let (docs, _, policy) = with_policy(&project, &run.stdout);
        assert_eq!(docs.len(), 1);
        let conditions =
            &policy["spec"]["rules"][0]["verifyImages"][0]["attestations"][0]["conditions"];
        assert_eq!(conditions[0]["all"][0]["key"], "{{ verdict }}");
        assert!(conditions[0].get("any").is_none(), "{conditions}");
        assert!(
            policy["spec"]["rules"][0]["match"]["any"][0]["resources"]
                .get("namespaces")
                .is_none()
        );
        let predicate = &h200_attestation()["predicate"];
        assert!(admits(&policy, predicate));
    }
    with(&["--set", "gpus=0"]).assert_failure_naming(1, &["--require-smoke-attestation", "GPU"]);
    with(&["--smoke-job"])
        .assert_failure_naming(2, &["--require-smoke-attestation", "--smoke-job"]);
    // The workload alone is what it was: the flag only adds the policy.
    let plain = project.run(&base).success();
    let run = with(&[]).success();
    assert!(
        run.stdout.ends_with(&format!("---\n{}", plain.stdout)),
        "{}",
        run.stdout
    );
}
