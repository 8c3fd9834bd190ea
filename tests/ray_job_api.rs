//! Ray's own job tooling against a raylet head's HTTP port, unmodified:
//! `ray job submit --working-dir` uploads a directory, the job runs a
//! raylet driver whose tasks run on the cluster, and the CLI follows its
//! output to the end; `ray job status|logs|list` read it; a failing job
//! fails the CLI and `raylet job delete` forgets it; Ray's SDK
//! (`JobSubmissionClient`, tests/ray_job_client.py) submits, tails, stops
//! and deletes jobs; and what raylet cannot honour
//! (pip, an image, an unknown field, a reused id, deleting a running job,
//! a package over the limit, no token) is refused saying why. Ray's client
//! lives in the venv `target/ray-venv`, which `tools/test.sh` installs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use raylet::prelude::*;

use crate::common;

use common::http::start_head_with_dashboard;
use common::{Daemons, raylet};

/// The `ray` release `tools/test.sh` installs.
const RAY_VERSION: &str = "2.60.0";

#[raylet::remote]
fn square(x: u64) -> u64 {
    x * x
}

#[test]
#[ignore = "a job driver: `rays_job_cli_and_sdk_drive_raylet_jobs...` runs it through Ray's CLI"]
fn driver_ray_job_squares() {
    let cluster = raylet::init().unwrap();
    let refs: Vec<ObjectRef<u64>> = (0..4).map(|x| square::remote(&cluster, x).unwrap()).collect();
    println!("squares {:?}", cluster.get_all(&refs).unwrap());
    cluster.shutdown().unwrap();
}

fn venv_bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/ray-venv/bin")
        .join(name);
    assert!(
        path.exists(),
        "Ray's client venv is missing: tools/test.sh makes it, or run python3 -m venv target/ray-venv && \
         target/ray-venv/bin/pip install ray=={RAY_VERSION} aiohttp pydantic"
    );
    path
}

/// `ray job ARGS` against the head's HTTP port at `dashboard`, with the
/// cluster's token as the bearer.
fn ray_job(dashboard: &str, token: &str, args: &[&str]) -> Output {
    let headers = serde_json::json!({"Authorization": format!("Bearer {token}")});
    Command::new(venv_bin("ray"))
        .arg("job")
        .args(args)
        .env("RAY_ADDRESS", format!("http://{dashboard}"))
        .env("RAY_JOB_HEADERS", headers.to_string())
        .env_remove("RAY_API_SERVER_ADDRESS")
        .output()
        .expect("Ray's CLI starts")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A working directory: a script that reads a shipped file and the
/// environment, then runs this binary's raylet driver.
fn working_dir(root: &Path) -> PathBuf {
    let dir = root.join("project");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/greeting.txt"), "hello from the working dir\n").unwrap();
    let script = "#!/bin/sh\n\
        echo \"working dir has: $(cat data/greeting.txt)\"\n\
        echo \"MODE is $MODE\"\n\
        if [ -n \"$DRIVER\" ]; then exec \"$DRIVER\" ray_job_api::driver_ray_job_squares --exact --ignored --nocapture; fi\n";
    std::fs::write(dir.join("run.sh"), script).unwrap();
    dir
}

/// A working directory over the head's package limit.
fn big_dir(root: &Path) -> PathBuf {
    let dir = root.join("big");
    std::fs::create_dir_all(&dir).unwrap();
    let noise: Vec<u8> = (0..70u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("weights.bin"), noise).unwrap();
    dir
}

#[test]
fn rays_job_cli_and_sdk_drive_raylet_jobs_and_what_raylet_cannot_honour_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (dashboard, token) = start_head_with_dashboard(temp.path(), "2");
    let project = working_dir(temp.path());
    let env = serde_json::json!({"env_vars": {
        "MODE": "cli",
        "DRIVER": std::env::current_exe().unwrap().to_str().unwrap(),
    }})
    .to_string();

    let project_arg = project.to_str().unwrap();
    let submit = [
        "submit",
        "--submission-id",
        "cli-1",
        "--working-dir",
        project_arg,
        "--runtime-env-json",
        &env,
        "--",
        "sh",
        "run.sh",
    ];
    let submitted = ray_job(&dashboard, &token, &submit);
    let said = text(&submitted);
    println!("ray job submit:\n{said}");
    assert!(submitted.status.success(), "{said}");
    for line in [
        "working dir has: hello from the working dir",
        "MODE is cli",
        "squares [0, 1, 4, 9]",
        "Job 'cli-1' succeeded",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    let status = text(&ray_job(&dashboard, &token, &["status", "cli-1"]));
    assert!(status.contains("Job 'cli-1' succeeded"), "{status}");
    let logs = text(&ray_job(&dashboard, &token, &["logs", "cli-1"]));
    assert!(logs.contains("squares [0, 1, 4, 9]"), "{logs}");
    let listed = text(&ray_job(&dashboard, &token, &["list"]));
    assert!(
        listed.contains("submission_id='cli-1'") && listed.contains("entrypoint='sh run.sh'"),
        "{listed}"
    );
    let raylet_list = raylet(temp.path(), &["job", "list"]);
    assert!(
        raylet_list.contains("cli-1") && raylet_list.contains("SUCCEEDED"),
        "{raylet_list}"
    );
    println!("ray job status, logs and list read the job; raylet job list shows it:\n{raylet_list}");

    let again = ray_job(&dashboard, &token, &submit);
    assert!(
        !again.status.success() && text(&again).contains("already exists"),
        "{}",
        text(&again)
    );
    let failing = ray_job(
        &dashboard,
        &token,
        &[
            "submit",
            "--submission-id",
            "cli-fails",
            "--",
            "sh",
            "-c",
            "echo doomed; exit 3",
        ],
    );
    let said = text(&failing);
    assert_eq!(failing.status.code(), Some(1), "{said}");
    assert!(
        said.contains("doomed") && said.contains("Job 'cli-fails' failed"),
        "{said}"
    );
    let jobs: serde_json::Value =
        serde_json::from_str(&raylet(temp.path(), &["job", "list", "--format", "json"])).unwrap();
    let failed = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["name"] == "cli-fails")
        .unwrap();
    let deleted = raylet(temp.path(), &["job", "delete", failed["id"].as_str().unwrap()]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let gone = text(&ray_job(&dashboard, &token, &["status", "cli-fails"]));
    assert!(gone.contains("Job cli-fails does not exist"), "{gone}");
    println!("a reused submission id is refused; a job that exits 3 fails the CLI; raylet job delete forgets it");

    let big = big_dir(temp.path());
    let sdk = Command::new(venv_bin("python"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ray_job_client.py"))
        .args([
            &format!("http://{dashboard}"),
            &token,
            project_arg,
            big.to_str().unwrap(),
        ])
        .output()
        .expect("python starts");
    let said = text(&sdk);
    println!("ray_job_client.py:\n{said}");
    assert!(sdk.status.success(), "{said}");
}
