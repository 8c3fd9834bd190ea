//! `raylet serve status|delete|deploy` on a CLI cluster, with the test
//! playing the Serve controller: it publishes the controller's status for
//! the dashboard and keeps an application's desired state in the
//! `_raylet_serve` namespace. Status prints the table and the JSON as
//! published; delete removes the desired state and waits until the status
//! drops the application; deploy checks the application's YAML and runs its
//! binary as a job with the YAML shipped beside it and named in
//! RAYLET_SERVE_DEPLOY_FILE (one over 128 KiB too), and fails when the
//! job ends without recording that it deployed.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Daemons, RAYLET, head_address, raylet};
use raylet::{Cluster, Config};
use serde_json::{Value, json};

/// The controller's namespace of desired state.
const SERVE_NAMESPACE: &str = "_raylet_serve";

/// Runs `raylet ARGS --temp-dir TEMP` and returns its output, whatever its status.
fn raylet_output(temp: &Path, args: &[&str]) -> Output {
    Command::new(RAYLET)
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .env_remove("RAYLET_TOKEN")
        .env_remove("RAYLET_ADDRESS")
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A status as the controller publishes it, listing these applications,
/// each with one autoscaling deployment of a running and a starting replica.
fn status_listing(apps: &[&str]) -> Value {
    let apps: Vec<Value> = apps
        .iter()
        .map(|name| {
            json!({
                "name": name, "route_prefix": format!("/{name}"), "public": false,
                "state": "RUNNING", "message": "",
                "deployments": [{
                    "name": "echo", "class": "demo::Echo", "version": "5e1f00d1",
                    "target_replicas": 2, "max_ongoing_requests": 4,
                    "replicas": [
                        {"name": format!("replica:{name}:echo:5e1f00d1:1"), "state": "RUNNING",
                         "version": "5e1f00d1", "node_id": "c0ffee00c0ffee00", "pid": 4343, "ongoing": 1},
                        {"name": format!("replica:{name}:echo:5e1f00d1:2"), "state": "STARTING",
                         "version": "5e1f00d1", "node_id": "c0ffee00c0ffee00", "pid": 0, "ongoing": 0}
                    ],
                    "requests": {"total": 17, "errors": 2},
                    "autoscaling": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1.0,
                        "current": 1, "desired": 2, "average_ongoing": 1.5, "queued": 0,
                        "decision": "scale up to 2 in 0.2 s (held 0.8 s of 1.0 s)"}
                }]
            })
        })
        .collect();
    json!({
        "updated_at_ms": 1_764_180_000_000u64,
        "controller": {"node_id": "c0ffee00c0ffee00", "pid": 4242},
        "proxies": [{"node_id": "c0ffee00c0ffee00", "address": "127.0.0.1:8123"}],
        "apps": apps,
    })
}

/// Starts a head under `temp`; returns a driver of it.
fn start_head(temp: &Path) -> Cluster {
    raylet(temp, &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    raylet::init_with(Config::new().address(head_address(temp)).temp_dir(temp)).unwrap()
}

/// Plays the controller for a deleted application: waits until `raylet
/// serve delete` has removed the desired state of `app`.
fn wait_until_deleted(cluster: &Cluster, app: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let key = format!("apps/{app}");
    while cluster.kv_namespace(SERVE_NAMESPACE).get(&key).unwrap().is_some() {
        assert!(Instant::now() < deadline, "`raylet serve delete` left {key}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_status_shows_what_the_controller_published_and_delete_waits_for_the_teardown() {
    let temp = tempfile::tempdir().unwrap();
    let temp = temp.path();
    let _daemons = Daemons(temp);
    let cluster = start_head(temp);
    let absent = raylet(temp, &["serve", "status"]);
    assert_eq!(absent.trim(), "Serve is not running on this cluster");
    let absent_json = raylet_output(temp, &["serve", "status", "--format", "json"]);
    assert!(absent_json.status.success(), "{}", stderr(&absent_json));
    assert_eq!(stdout(&absent_json).trim(), "null");

    let published = status_listing(&["demo"]);
    cluster.publish_to_dashboard("serve", "status", &published).unwrap();
    let serve = cluster.kv_namespace(SERVE_NAMESPACE);
    serve.put("apps/demo", b"the desired state").unwrap();

    let table = raylet(temp, &["serve", "status", "--format", "table"]);
    for expected in [
        "Controller: pid 4242 on node c0ffee00",
        "demo  /demo  no      RUNNING  -",
        "demo  echo        demo::Echo  5e1f00d1  2       1 RUNNING, 1 STARTING  1        17        2",
        "  autoscaling 1..4 replicas, 1 ongoing each: average 1.5 ongoing, 0 queued, desired 2: \
         scale up to 2 in 0.2 s (held 0.8 s of 1.0 s)",
        "127.0.0.1:8123  c0ffee00",
    ] {
        assert!(table.contains(expected), "{expected:?} in:\n{table}");
    }
    let printed: Value = serde_json::from_str(&raylet(temp, &["serve", "status", "--format", "json"])).unwrap();
    assert_eq!(printed, published);

    let nosuch = raylet_output(temp, &["serve", "delete", "nosuch"]);
    assert_eq!(nosuch.status.code(), Some(1), "{}", stderr(&nosuch));
    assert!(
        stderr(&nosuch).contains("no Serve application `nosuch`"),
        "{}",
        stderr(&nosuch)
    );

    let deleting = Command::new(RAYLET)
        .args(["serve", "delete", "demo", "--temp-dir"])
        .arg(temp)
        .env_remove("RAYLET_TOKEN")
        .env_remove("RAYLET_ADDRESS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut deleting = Running(Some(deleting));
    wait_until_deleted(&cluster, "demo");
    std::thread::sleep(Duration::from_millis(800));
    assert!(!deleting.has_exited(), "delete waits while the status lists demo");
    cluster
        .publish_to_dashboard("serve", "status", &status_listing(&[]))
        .unwrap();
    let deleted = deleting.output();
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert_eq!(stdout(&deleted), "deleted demo\n");
    assert!(raylet(temp, &["serve", "status"]).contains("Applications\n---"));

    cluster
        .publish_to_dashboard("serve", "status", &status_listing(&["stuck"]))
        .unwrap();
    serve.put("apps/stuck", b"the desired state").unwrap();
    let started = Instant::now();
    let stuck = raylet_output(temp, &["serve", "delete", "stuck", "--timeout", "1"]);
    assert_eq!(stuck.status.code(), Some(1), "{}", stderr(&stuck));
    assert!(
        stderr(&stuck).contains("did not tear down `stuck` within 1 s"),
        "{}",
        stderr(&stuck)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(serve.get("apps/stuck").unwrap(), None);
    cluster.shutdown().unwrap();
}

/// A spawned `raylet`, ended if the test fails before it exits.
struct Running(Option<Child>);

impl Running {
    fn has_exited(&mut self) -> bool {
        let child = self.0.as_mut().unwrap();
        child.try_wait().unwrap().is_some()
    }

    fn output(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes `app.yaml` naming `bin/deploy` (a shell script with `body`) under `dir`.
fn app_file(dir: &Path, yaml: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let script = dir.join("bin/deploy");
    std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("app.yaml");
    std::fs::write(&file, yaml).unwrap();
    file.to_str().unwrap().to_string()
}

const APP_YAML: &str = "binary: bin/deploy\nname: demo\nroute_prefix: /demo\n\
                        deployments:\n  - name: echo\n    class: demo::Echo\n    num_replicas: 2\n";

#[test]
fn serve_deploy_checks_the_file_then_runs_its_binary_as_a_job_with_the_yaml() {
    let temp = tempfile::tempdir().unwrap();
    let temp = temp.path();
    let _daemons = Daemons(temp);
    let cluster = start_head(temp);
    let app = temp.join("app");

    let missing = app_file(&app, &APP_YAML.replace("bin/deploy", "bin/not_built"), "exit 0");
    let output = raylet_output(temp, &["serve", "deploy", &missing]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let error = stderr(&output);
    assert!(error.contains("bin/not_built that "), "{error}");
    assert!(error.contains("does not exist: build it first"), "{error}");

    let cases = [
        ("binary: bin/deploy\nname: [demo\n", "is not a Serve application's YAML"),
        ("binary: bin/deploy\ndeployments: []\n", "missing field `name`"),
        ("binary: bin/deploy\nname: demo\n", "missing field `deployments`"),
        ("name: demo\ndeployments: [{name: echo}]\n", "missing field `binary`"),
    ];
    for (yaml, expected) in cases {
        let file = app_file(&app, yaml, "exit 0");
        let output = raylet_output(temp, &["serve", "deploy", &file]);
        assert_eq!(output.status.code(), Some(1), "{yaml}: {}", stderr(&output));
        assert!(stderr(&output).contains(expected), "{yaml}: {}", stderr(&output));
    }
    let nothing = raylet_output(temp, &["serve", "deploy", &temp.join("nothing.yaml").to_string_lossy()]);
    assert_eq!(nothing.status.code(), Some(1));
    assert!(
        stderr(&nothing).contains("nothing.yaml: No such file"),
        "{}",
        stderr(&nothing)
    );
    let no_file = raylet_output(temp, &["serve", "deploy"]);
    assert_eq!(no_file.status.code(), Some(2), "a usage error: {}", stderr(&no_file));

    let failing = app_file(
        &app,
        APP_YAML,
        "printf 'deploying:\\n'\ncat \"$RAYLET_SERVE_DEPLOY_FILE\"\nexit 3",
    );
    let failed = raylet_output(temp, &["serve", "deploy", &failing]);
    assert_eq!(
        failed.status.code(),
        Some(3),
        "the job's exit code: {}",
        stderr(&failed)
    );
    assert_eq!(stdout(&failed), format!("deploying:\n{APP_YAML}"));
    assert!(
        stderr(&failed).contains("deploying Serve application `demo` failed: job "),
        "{}",
        stderr(&failed)
    );

    // Issue 47, item 13: a deploy file over the 128 KiB that Linux allows
    // one environment variable reaches the job whole, as a shipped file.
    let large_yaml = format!("{APP_YAML}# {}\n", "x".repeat(200 << 10));
    let large = app_file(&app, &large_yaml, "wc -c < \"$RAYLET_SERVE_DEPLOY_FILE\"\nexit 3");
    let deployed = raylet_output(temp, &["serve", "deploy", &large]);
    assert_eq!(deployed.status.code(), Some(3), "the job ran: {}", stderr(&deployed));
    assert_eq!(
        stdout(&deployed).trim(),
        large_yaml.len().to_string(),
        "{}",
        stderr(&deployed)
    );
    println!(
        "a {} KiB deploy file reached the deploy job whole",
        large_yaml.len() >> 10
    );

    // Issue 47, item 9: a binary that exits 0 without deploying anything
    // (one that does not link raylet-serve, or /bin/true) is no success.
    let pretending = app_file(&app, APP_YAML, "echo the application is RUNNING");
    let pretended = raylet_output(temp, &["serve", "deploy", &pretending]);
    assert_eq!(pretended.status.code(), Some(1), "{}", stdout(&pretended));
    assert_eq!(stdout(&pretended), "the application is RUNNING\n");
    let error = stderr(&pretended);
    assert!(
        error.contains("exited 0 without deploying Serve application `demo`") && error.contains("raylet-serve"),
        "{error}"
    );
    assert!(!error.contains("deployed demo"), "{error}");
    let true_yaml = APP_YAML.replace("binary: bin/deploy", "binary: /bin/true");
    std::fs::write(app.join("true.yaml"), true_yaml).unwrap();
    let nothing = raylet_output(temp, &["serve", "deploy", &app.join("true.yaml").to_string_lossy()]);
    assert_eq!(nothing.status.code(), Some(1), "{}", stdout(&nothing));
    assert!(
        stderr(&nothing).contains("/bin/true exited 0 without deploying Serve application `demo`"),
        "{}",
        stderr(&nothing)
    );
    let jobs = cluster.jobs().unwrap();
    assert!(jobs.iter().any(|job| job.name == "serve deploy demo"), "{jobs:?}");
    cluster.shutdown().unwrap();
}
