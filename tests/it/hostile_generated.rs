//! Hostile values in the files `imgbuild k8s` and `imgbuild slurm` generate (issue 26):
//! strings YAML 1.1 reads as booleans, numbers or dates stay strings for kubernetes-validate
//! (PyYAML) and kubectl; names, IDs and paths Kubernetes would refuse (or resolve elsewhere)
//! are refused here; and a Pyxis script's `--env` reaches the job step, never the batch shell
//! or the `srun` that runs it (a fake `srun` on `PATH` records what it was given).

use std::{os::unix::fs::PermissionsExt, path::Path, process::Command};

use crate::{
    common::Project,
    k8s::validated,
    support::{channel::tiny_recipe, shared_channel},
};

const REPOSITORY: &str = "registry.example/ml/train";

/// A built image, `images/train`, without CUDA, with an entrypoint for the Slurm step.
fn image() -> Project {
    let project = Project::new();
    project.write_recipe(
        &tiny_recipe(shared_channel(), "train", &["hello 1.0"]).replace(
            "base = \"scratch\"",
            // An empty base: the script is not started here, only written into files.
            "base = \"scratch\"\nentrypoint = [\"/opt/conda/bin/hello\"]\ncheck-entrypoint = false",
        ),
    );
    project.build(&[]).success();
    project
}

fn k8s(project: &Project, args: &[&str]) -> crate::common::Run {
    let mut all = vec!["k8s", "images/train", "--repository", REPOSITORY];
    all.extend_from_slice(args);
    project.run(&all)
}

/// `imgbuild slurm` without GPUs (the test channel's `hello` pulls in the CUDA runtime, so
/// the script would otherwise need an allocation's GPUs to start).
fn slurm(project: &Project, args: &[&str]) -> crate::common::Run {
    let mut all = vec![
        "slurm",
        "images/train",
        "--repository",
        REPOSITORY,
        "--set",
        "gpus=0",
    ];
    all.extend_from_slice(args);
    project.run(&all)
}

/// The YAML 1.1 look-alikes, as `--env` values: each must come back as the same string.
const LOOKALIKES: &[&str] = &[
    "no",
    "on",
    "Off",
    "y",
    "NULL",
    "~",
    "1_000",
    "1:20",
    "2001-12-14",
    "0x1F",
    "1e3",
    ".inf",
    "0o17",
    "+12",
    "=",
    "<<",
];

#[test]
fn yaml_11_lookalikes_stay_strings_for_kubernetes_validate() {
    let project = image();
    let mut args: Vec<String> = Vec::new();
    for (i, value) in LOOKALIKES.iter().enumerate() {
        args.extend(["--env".to_string(), format!("V{i}={value}")]);
    }
    args.extend(
        [
            "--set",
            "name=on",
            "--set",
            "namespace=off",
            "--set",
            r#"args=["yes","1:20","2001-12-14","null"]"#,
            "--toleration",
            "dedicated=on:NoSchedule",
            "--volume",
            "data=pvc:no:/1_000",
        ]
        .map(str::to_string),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = k8s(&project, &args).success();
    // kubernetes-validate --strict (1.33, 1.37) and PyYAML's YAML 1.1 reading.
    let docs = validated(&project, &run.stdout);
    let job = &docs[0];
    assert_eq!(job["metadata"]["name"], "on");
    assert_eq!(job["metadata"]["namespace"], "off");
    let pod = &job["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    for (i, value) in LOOKALIKES.iter().enumerate() {
        assert_eq!(
            container["env"][i],
            serde_json::json!({"name": format!("V{i}"), "value": value}),
            "{}",
            run.stdout
        );
    }
    assert_eq!(
        container["args"],
        serde_json::json!(["yes", "1:20", "2001-12-14", "null"])
    );
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/1_000");
    assert_eq!(
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "no"
    );
    let toleration = pod["tolerations"].as_array().unwrap();
    assert!(
        toleration.iter().any(|t| t["value"] == "on"),
        "{toleration:?}"
    );
}

/// `--build-job --shards`: names derived from a look-alike `--set name` (`on-shards`,
/// `on-builder`), a look-alike namespace in every object and the RoleBinding's subject, and
/// images and a cache repository that are YAML in disguise all come back as the same strings.
#[test]
fn build_job_shard_values_stay_strings() {
    let project = image();
    let kubectl_image = "no\nkind: Secret # not a comment";
    let run = project
        .run(&[
            "k8s",
            "--build-job",
            "recipes/image.toml",
            "--builder-image",
            "yes",
            "--repository",
            REPOSITORY,
            "--cache-repo",
            "registry.example/on/1_000",
            "--shards",
            "3",
            "--kubectl-image",
            kubectl_image,
            "--set",
            "name=on",
            "--set",
            "namespace=off",
        ])
        .success();
    let docs = validated(&project, &run.stdout);
    assert_eq!(docs.len(), 6, "{}", run.stdout);
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"], "off", "{doc}");
    }
    assert_eq!(docs[1]["metadata"]["name"], "on-builder");
    assert_eq!(docs[2]["rules"][0]["resourceNames"][0], "on-shards");
    assert_eq!(docs[3]["subjects"][0]["namespace"], "off");
    let shards = &docs[4]["spec"]["template"]["spec"];
    assert_eq!(shards["containers"][0]["image"], "yes");
    assert_eq!(
        shards["containers"][0]["args"][6],
        "registry.example/on/1_000"
    );
    let assembly = &docs[5]["spec"]["template"]["spec"];
    assert_eq!(assembly["serviceAccountName"], "on-builder");
    for init in assembly["initContainers"].as_array().unwrap() {
        assert_eq!(init["image"], kubectl_image);
        assert_eq!(init["args"][1], "job/on-shards");
    }
}

#[test]
fn shell_and_yaml_metacharacters_in_values_round_trip() {
    let project = image();
    let values = [
        "$(touch /tmp/imgbuild-pwned)",
        "`id`; echo 'q\" \\",
        "line\nnext: injected\n- item",
        "# not a comment",
        "key: value",
        "\u{202e}txt.exe\u{2028}x\u{85}y",
        "{ flow: map }",
        "&anchor *alias !tag %directive @at",
    ];
    let mut args = Vec::new();
    for (i, value) in values.iter().enumerate() {
        args.push("--env".to_string());
        args.push(format!("M{i}={value}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = k8s(&project, &args).success();
    let docs = validated(&project, &run.stdout);
    let env = &docs[0]["spec"]["template"]["spec"]["containers"][0]["env"];
    for (i, value) in values.iter().enumerate() {
        assert_eq!(env[i]["value"], *value, "{}", run.stdout);
    }
    assert_eq!(docs.len(), 1, "one document: {}", run.stdout);

    // The podman script passes them as podman's arguments: bash reads each back unchanged.
    let run = slurm(&project, &[&["--runner", "podman"], &args[..]].concat()).success();
    let recorded = run_script(&project, &run.stdout, &[]);
    for (i, value) in values.iter().enumerate() {
        let arg = format!("--env=M{i}={value}");
        assert!(
            recorded.args.contains(&arg),
            "{arg:?} in {:?}",
            recorded.args
        );
    }
    assert!(!Path::new("/tmp/imgbuild-pwned").exists());
}

#[test]
fn names_ids_and_paths_kubernetes_refuses_are_refused() {
    let project = image();
    for (args, needle) in [
        (&["--set", "name=a\nb"][..], "not a valid Kubernetes name"),
        (&["--set", "name=Job"], "not a valid Kubernetes name"),
        (&["--set", "namespace=a\nb"], "namespace"),
        (&["--set", "namespace=kube.system"], "namespace"),
        (&["--pull-secret", "x\ny"], "Secret"),
        (
            &["--runtime-class", "nvidia\n  privileged: true"],
            "runtime-class",
        ),
        (&["--set", "user=4294967296"], "user=4294967296"),
        (&["--set", "user=2147483648:0"], "user=2147483648:0"),
        (&["--set", "user=1000:-1"], "user=1000:-1"),
    ] {
        k8s(&project, args).assert_failure_naming(1, &[needle]);
    }
    for (volume, needle) in [
        ("data=host:/mnt/../etc:/data", "the node directory"),
        ("data=host:/mnt/..:/data", "the node directory"),
        ("data=pvc:c:/data/../etc", "the mount path"),
        ("data=pvc:c:/../../x", "the mount path"),
    ] {
        k8s(&project, &["--volume", volume]).assert_failure_naming(2, &["--volume", needle]);
    }
    // `.` and `//` are written as the path they mean, so a duplicate shows.
    k8s(
        &project,
        &["--set", "shm=1Gi", "--volume", "x=pvc:c:/dev//./shm/"],
    )
    .assert_failure_naming(1, &["mount path `/dev/shm` is given twice"]);
    let run = k8s(&project, &["--volume", "d=host://mnt/./data/:/data"]).success();
    let docs = validated(&project, &run.stdout);
    let pod = &docs[0]["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/mnt/data");
}

/// What a fake `srun` saw: its arguments and its environment.
pub(super) struct Recorded {
    pub(super) args: Vec<String>,
    pub(super) env: Vec<String>,
}

/// Runs the sbatch `script` with bash (after `bash -n`), a fake `srun` first on `PATH`;
/// `env` is the submitting shell's extra environment.
pub(super) fn run_script(project: &Project, script: &str, env: &[(&str, &str)]) -> Recorded {
    let dir = project.path().join("fake-slurm");
    fs_err::create_dir_all(&dir).unwrap();
    let srun = dir.join("srun");
    fs_err::write(
        &srun,
        "#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$RECORD.args\"\nenv -0 > \"$RECORD.env\"\n",
    )
    .unwrap();
    fs_err::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = project.path().join("job.sbatch");
    fs_err::write(&file, script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(check.status.success(), "bash -n:\n{script}");
    let record = project.path().join("record");
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    let output = Command::new("bash")
        .arg(&file)
        .env("PATH", path)
        .env("RECORD", &record)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(output.status.success(), "{script}\n{output:?}");
    let split = |ext: &str| -> Vec<String> {
        let bytes = fs_err::read(record.with_extension(ext)).unwrap_or_default();
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    Recorded {
        args: split("args"),
        env: split("env"),
    }
}

#[test]
fn pyxis_env_reaches_the_step_never_the_batch_shell() {
    let project = image();
    let values = ["no", "a,b", "$(id) `id` ; x", "two\nlines"];
    let mut args = Vec::new();
    for (i, value) in values.iter().enumerate() {
        args.push("--env".to_string());
        args.push(format!("P{i}={value}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = slurm(&project, &args).success();
    assert!(!run.stdout.contains("export P"), "{}", run.stdout);
    let recorded = run_script(&project, &run.stdout, &[]);
    // Not in srun's (so not in the batch shell's) environment…
    assert!(
        !recorded
            .env
            .iter()
            .any(|e| e.starts_with('P') && e.as_bytes().get(2) == Some(&b'=')),
        "{:?}",
        recorded.env
    );
    // …but in its `--export` list, as Slurm splits it (commas outside quotes; quotes around
    // a whole item stripped), and named for Pyxis to set in the container.
    let export = recorded
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--export="))
        .unwrap_or_else(|| panic!("no --export in {:?}", recorded.args));
    assert_eq!(export, "ALL,P0=no,'P1=a,b',P2=$(id) `id` ; x,P3=two\nlines");
    assert!(
        recorded
            .args
            .contains(&"--container-env=P0,P1,P2,P3".to_string()),
        "{:?}",
        recorded.args
    );
}

#[test]
fn pyxis_env_that_would_steer_the_node_is_refused() {
    let project = image();
    // A `srun` in the directory PATH names: it must never run.
    let trap = project.path().join("trap");
    fs_err::create_dir_all(&trap).unwrap();
    let marker = project.path().join("trap-ran");
    fs_err::write(
        trap.join("srun"),
        format!("#!/bin/sh\ntouch {}\n", marker.display()),
    )
    .unwrap();
    fs_err::set_permissions(trap.join("srun"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path_env = format!("PATH={}", trap.display());
    for (env, needle) in [
        (path_env.as_str(), "`PATH` would choose"),
        ("LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD"),
        ("LD_LIBRARY_PATH=/tmp", "LD_LIBRARY_PATH"),
        ("SLURM_CONF=/tmp/slurm.conf", "SLURM_CONF"),
        ("ENROOT_MOUNT_HOME=yes", "ENROOT_MOUNT_HOME"),
        ("Q=it's", "quote"),
        ("Q=say \"x\"", "quote"),
    ] {
        let run = slurm(&project, &["--env", env]);
        if run.code == 0 {
            // The old script: running it must not run the trap's srun nor preload.
            let recorded = run_script(&project, &run.stdout, &[]);
            assert!(
                !marker.exists(),
                "{env}: the batch shell ran {}",
                trap.display()
            );
            assert!(
                !recorded.env.iter().any(|e| e == env),
                "{env} reached srun's environment:\n{}",
                run.stdout
            );
            panic!("{env} was not refused:\n{}", run.stdout);
        }
        run.assert_failure_naming(1, &[needle, "--runner podman"]);
    }
    // podman passes the same values to the container only: as arguments, not srun's env.
    let run = slurm(
        &project,
        &[
            "--runner",
            "podman",
            "--env",
            &path_env,
            "--env",
            "LD_PRELOAD=/x.so",
        ],
    )
    .success();
    let recorded = run_script(&project, &run.stdout, &[]);
    assert!(
        recorded.args.contains(&format!("--env={path_env}")),
        "{:?}",
        recorded.args
    );
    assert!(
        recorded
            .args
            .contains(&"--env=LD_PRELOAD=/x.so".to_string())
    );
    assert!(!recorded.env.iter().any(|e| e.starts_with("LD_PRELOAD=")));
    assert!(!marker.exists());
}

#[test]
fn jupyter_login_values_and_images_that_cannot_serve_are_refused() {
    let project = image();
    for (flag, value, needle) in [
        (
            "--login-host",
            "-oProxyCommand=touch /tmp/x",
            "is not a host name",
        ),
        ("--login-host", "login;id", "is not a host name"),
        ("--login-host", "$(id)", "is not a host name"),
        ("--login-host", "login\nid", "is not a host name"),
        ("--login-user", "-oProxyCommand=x", "is not a user name"),
        ("--login-user", "a b", "is not a user name"),
        ("--local-port", "0", "--local-port"),
        ("--local-port", "65536", "--local-port"),
    ] {
        let run = slurm(&project, &["--jupyter", &format!("{flag}={value}")]);
        run.assert_failure_naming(2, &[needle]);
    }
    // Given without `--jupyter`, a login value would be ignored: refused instead.
    slurm(&project, &["--login-host", "login1"]).assert_failure_naming(2, &["--jupyter"]);
    // The image has no JupyterLab and runs as root: named, never a script.
    let run = slurm(&project, &["--jupyter", "--runner", "podman"]);
    run.assert_failure_naming(1, &["images/train", "has no JupyterLab", "jupyterlab"]);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    // The token and port are the job's own.
    let run = slurm(&project, &["--jupyter", "--env", "JUPYTER_TOKEN=known"]);
    run.assert_failure_naming(1, &["JUPYTER_TOKEN"]);
}
