//! Multi-process tests of the real `raylet` binary on loopback: start a head
//! and nodes as daemons, read `raylet status`, kill, pause (and fence) and
//! stop nodes, and feed the CLI bad input.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const RAYLET: &str = env!("CARGO_BIN_EXE_raylet");

/// A temp root for one test's cluster; dropping it runs `raylet stop --force`.
struct TestCluster {
    temp: tempfile::TempDir,
}

impl TestCluster {
    fn new() -> Self {
        TestCluster {
            temp: tempfile::tempdir().unwrap(),
        }
    }

    fn root(&self) -> &Path {
        self.temp.path()
    }

    fn raylet(&self, args: &[&str]) -> Output {
        Command::new(RAYLET)
            .args(args)
            .arg("--temp-dir")
            .arg(self.root())
            .env_remove("RAYLET_TOKEN")
            .env_remove("RAYLET_ADDRESS")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.raylet(args);
        assert!(output.status.success(), "raylet {args:?} failed:\n{}", text(&output));
        String::from_utf8(output.stdout).unwrap()
    }

    fn start_head(&self, extra: &[&str]) -> String {
        let mut args = vec!["start", "--head", "--port", "0"];
        args.extend_from_slice(extra);
        self.ok(&args);
        self.head_address()
    }

    fn start_node(&self, extra: &[&str]) {
        let address = self.head_address();
        let mut args = vec!["start", "--address", &address];
        args.extend_from_slice(extra);
        self.ok(&args);
    }

    fn head_address(&self) -> String {
        let path = self.root().join("session_latest/head_address");
        std::fs::read_to_string(path).unwrap().trim().to_string()
    }

    fn status(&self) -> Value {
        serde_json::from_str(&self.ok(&["status", "--format", "json"])).unwrap()
    }

    /// Polls `raylet status` until `done` holds; panics after `timeout`.
    fn wait_for_status(&self, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status();
            if done(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "status never matched:\n{status:#}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Pids of the daemons with this role, from the session's process records.
    fn pids(&self, role: &str) -> Vec<i32> {
        let dir = self.root().join("session_latest/processes");
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| serde_json::from_str::<Value>(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
            .filter(|record| record["role"] == role)
            .map(|record| record["pid"].as_i64().unwrap() as i32)
            .collect()
    }

    /// Live raylet processes whose command line names this test's temp root.
    fn live_processes(&self) -> Vec<u32> {
        let root = self.root().to_string_lossy().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let zombie = stat
                    .rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
                cmdline.contains(&root) && cmdline.contains("raylet") && !zombie
            })
            .collect()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = self.raylet(&["stop", "--force"]);
    }
}

fn text(output: &Output) -> String {
    format!(
        "status: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn signal(pid: i32, signal: Signal) {
    kill(Pid::from_raw(pid), signal).unwrap();
}

fn alive_nodes(status: &Value) -> Vec<&Value> {
    let nodes = status["nodes"].as_array().unwrap();
    nodes.iter().filter(|n| n["state"] == "ALIVE").collect()
}

#[test]
fn a_head_and_two_nodes_show_as_three_live_nodes_with_summed_resources() {
    let cluster = TestCluster::new();
    cluster.start_head(&["--num-cpus", "2", "--num-gpus", "0", "--resources", r#"{"TPU": 1.5}"#]);
    cluster.start_node(&["--num-cpus", "1", "--num-gpus", "0.5"]);
    cluster.start_node(&["--num-cpus", "0.25", "--resources", r#"{"TPU": 2}"#]);
    let status = cluster.status();
    assert_eq!(status["alive_nodes"], 3, "{status:#}");
    assert_eq!(status["dead_nodes"], 0);
    assert_eq!(status["total"]["CPU"], 3.25);
    assert_eq!(status["total"]["GPU"], 0.5);
    assert_eq!(status["total"]["TPU"], 3.5);
    let heads: Vec<_> = alive_nodes(&status)
        .into_iter()
        .filter(|n| n["is_head_node"] == true)
        .collect();
    assert_eq!(heads.len(), 1);

    let text = cluster.ok(&["status"]);
    assert!(text.contains("Alive: 3 node(s)"), "{text}");
    assert!(text.contains("0.0/3.25 CPU"), "{text}");
}

#[test]
fn heartbeats_carry_cpu_and_memory_utilization() {
    let cluster = TestCluster::new();
    cluster.start_head(&["--heartbeat-interval", "100ms"]);
    let status = cluster.wait_for_status(Duration::from_secs(10), |s| {
        alive_nodes(s)
            .iter()
            .all(|n| n["stats"]["memory_total_bytes"].as_u64() > Some(0))
    });
    let node = alive_nodes(&status)[0];
    assert!(node["stats"]["memory_used_bytes"].as_u64().unwrap() > 0);
    assert!(node["stats"]["cpu_percent"].as_f64().unwrap() >= 0.0);
}

#[test]
fn a_node_killed_with_sigkill_is_marked_dead_within_the_timeout() {
    let cluster = TestCluster::new();
    cluster.start_head(&["--heartbeat-timeout", "2s", "--heartbeat-interval", "200ms"]);
    cluster.start_node(&["--heartbeat-interval", "200ms"]);
    let node_pid = cluster.pids("node")[0];
    assert_eq!(cluster.status()["alive_nodes"], 2);

    let killed_at = Instant::now();
    signal(node_pid, Signal::SIGKILL);
    let status = cluster.wait_for_status(Duration::from_secs(8), |s| s["dead_nodes"] == 1);
    let detected_after = killed_at.elapsed();
    assert!(detected_after < Duration::from_secs(4), "took {detected_after:?}");
    assert_eq!(status["alive_nodes"], 1);
    let dead = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["state"] == "DEAD")
        .unwrap();
    assert!(
        dead["death_reason"].as_str().unwrap().contains("no heartbeat"),
        "{dead:#}"
    );
    assert!(cluster.ok(&["status"]).contains("Dead: 1 node(s)"));
}

/// Sleeps for `seconds`, keeping a worker busy.
#[raylet::remote]
fn hold(seconds: u64) -> u32 {
    std::thread::sleep(Duration::from_secs(seconds));
    std::process::id()
}

/// The processes whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
            fields.get(1).and_then(|ppid| ppid.parse::<i32>().ok()) == Some(pid) && fields[0] != "Z"
        })
        .collect()
}

#[test]
fn a_paused_node_is_marked_dead_and_returns_as_a_new_incarnation_without_its_old_workers() {
    let cluster = TestCluster::new();
    let head = cluster.start_head(&[
        "--heartbeat-timeout",
        "1s",
        "--heartbeat-interval",
        "100ms",
        "--num-cpus",
        "0",
    ]);
    cluster.start_node(&["--heartbeat-interval", "100ms"]);
    let node_pid = cluster.pids("node")[0];
    let driver = raylet::init_with(raylet::Config::new().address(&head).temp_dir(cluster.root())).unwrap();
    let _held = hold::remote(&driver, 600).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while children(node_pid).is_empty() {
        assert!(Instant::now() < deadline, "the node starts a worker for the task");
        std::thread::sleep(Duration::from_millis(50));
    }
    let old_workers = children(node_pid);

    signal(node_pid, Signal::SIGSTOP);
    cluster.wait_for_status(Duration::from_secs(8), |s| s["dead_nodes"] == 1);
    signal(node_pid, Signal::SIGCONT);
    let status = cluster.wait_for_status(Duration::from_secs(8), |s| s["alive_nodes"] == 2);

    let nodes = status["nodes"].as_array().unwrap();
    let dead = nodes.iter().find(|n| n["state"] == "DEAD").unwrap();
    let reborn = nodes
        .iter()
        .find(|n| n["state"] == "ALIVE" && n["node_id"] == dead["node_id"])
        .expect("the paused node registers again under its node id");
    assert_eq!(dead["incarnation"], 1);
    assert_eq!(reborn["incarnation"], 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_workers.iter().any(|pid| children(node_pid).contains(pid)) {
        assert!(
            Instant::now() < deadline,
            "the old incarnation's workers {old_workers:?} are killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    driver.shutdown().unwrap();
}

#[test]
fn a_node_with_a_wrong_token_is_refused() {
    let cluster = TestCluster::new();
    let address = cluster.start_head(&[]);
    let wrong = "0123456789abcdef-not-the-token";
    let output = cluster.raylet(&["start", "--address", &address, "--token", wrong]);
    assert!(!output.status.success());
    let error = stderr(&output);
    assert!(error.contains("unauthenticated"), "{error}");
    assert!(!error.contains(wrong), "the token leaked: {error}");
    let real = std::fs::read_to_string(cluster.root().join("session_latest/token")).unwrap();
    assert!(!error.contains(real.trim()), "the token leaked: {error}");
    assert_eq!(cluster.status()["alive_nodes"], 1);
}

/// The pids of every process whose command line holds `needle`.
fn processes_whose_command_line_holds(needle: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some((pid, cmdline))
        })
        .collect()
}

#[test]
fn a_token_given_on_the_command_line_stays_out_of_every_daemons_command_line() {
    let cluster = TestCluster::new();
    let address = cluster.start_head(&[]);
    let token = std::fs::read_to_string(cluster.root().join("session_latest/token")).unwrap();
    let token = token.trim();
    cluster.ok(&["start", "--address", &address, "--token", token, "--num-cpus", "1"]);
    cluster.ok(&[
        "start",
        "--address",
        &address,
        &format!("--token={token}"),
        "--num-cpus",
        "1",
    ]);
    cluster.wait_for_status(Duration::from_secs(15), |status| alive_nodes(status).len() == 3);
    let daemons = cluster.live_processes();
    assert!(daemons.len() >= 3, "the daemons run: {daemons:?}");
    let leaks = processes_whose_command_line_holds(token);
    assert!(leaks.is_empty(), "the token is on these command lines: {leaks:?}");
}

#[test]
fn stop_ends_every_daemon_and_leaves_no_raylet_process_behind() {
    let cluster = TestCluster::new();
    cluster.start_head(&[]);
    cluster.start_node(&[]);
    cluster.start_node(&[]);
    assert_eq!(
        cluster.live_processes().len(),
        4,
        "the head, its machine's node and two nodes"
    );

    let output = cluster.ok(&["stop"]);
    assert!(output.contains("Stopped all 4 raylet processes"), "{output}");
    assert_eq!(cluster.live_processes(), Vec::<u32>::new());
    assert!(!cluster.root().join("session_latest").exists());
    let error = stderr(&cluster.raylet(&["status"]));
    assert!(error.contains("raylet start --head"), "{error}");
    assert!(
        cluster
            .ok(&["stop"])
            .contains("Did not find any active raylet processes")
    );
}

#[test]
fn bad_resource_flags_are_clear_errors() {
    let cluster = TestCluster::new();
    let cases: [(&[&str], &str); 5] = [
        (&["--resources", r#"{"TPU": 4"#], "JSON object"),
        (&["--resources", r#"{"TPU": "four"}"#], "must be a number"),
        (&["--num-cpus", "-2"], "'CPU' must be a finite amount >= 0"),
        (&["--memory", "1e300"], "larger than the limit"),
        (&["--num-gpus", "NaN"], "'GPU' must be a finite amount"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["start", "--head", "--port", "0"];
        args.extend_from_slice(flags);
        let output = cluster.raylet(&args);
        assert!(!output.status.success(), "{flags:?} was accepted");
        assert!(stderr(&output).contains(expected), "{flags:?}: {}", text(&output));
        assert!(!stderr(&output).contains("panicked"), "{}", text(&output));
    }
    assert!(cluster.live_processes().is_empty());
}

#[test]
fn a_port_already_in_use_is_a_clear_error() {
    let cluster = TestCluster::new();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let output = cluster.raylet(&["start", "--head", "--port", &port]);
    assert!(!output.status.success());
    let error = stderr(&output);
    assert!(
        error.contains(&format!("port {port} on 127.0.0.1 is already in use")),
        "{error}"
    );
    assert!(cluster.live_processes().is_empty());
}

#[test]
fn a_second_head_on_a_taken_port_leaves_the_running_cluster_reachable() {
    let cluster = TestCluster::new();
    let address = cluster.start_head(&[]);
    let port = address.rsplit_once(':').unwrap().1;
    let output = cluster.raylet(&["start", "--head", "--port", port]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("already in use"), "{}", text(&output));
    assert_eq!(cluster.head_address(), address);
    assert_eq!(cluster.status()["alive_nodes"], 1);
}

#[test]
fn an_address_with_nothing_behind_it_fails_after_bounded_retries() {
    let cluster = TestCluster::new();
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = free.local_addr().unwrap().to_string();
    drop(free);
    let started = Instant::now();
    let output = cluster.raylet(&[
        "start",
        "--address",
        &address,
        "--token",
        "t0k3n",
        "--connect-timeout",
        "1s",
    ]);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!output.status.success());
    let error = stderr(&output);
    assert!(error.contains(&format!("could not reach {address}")), "{error}");
    assert!(error.contains("attempts"), "{error}");
    assert!(cluster.live_processes().is_empty());
}

#[test]
fn a_missing_or_corrupt_session_directory_is_a_clear_error() {
    let cluster = TestCluster::new();
    let error = stderr(&cluster.raylet(&["status"]));
    assert!(error.contains("no raylet cluster was started"), "{error}");

    cluster.start_head(&[]);
    let session: PathBuf = std::fs::canonicalize(cluster.root().join("session_latest")).unwrap();
    let address = cluster.head_address();
    std::fs::write(session.join("head_address"), "garbage").unwrap();
    let error = stderr(&cluster.raylet(&["status"]));
    assert!(error.contains("head_address is corrupt"), "{error}");

    std::fs::write(session.join("head_address"), &address).unwrap();
    std::fs::write(session.join("token"), "").unwrap();
    let error = stderr(&cluster.raylet(&["status"]));
    assert!(error.contains("token is corrupt"), "{error}");

    cluster.ok(&["stop"]);
    cluster.start_head(&[]);
    let session = std::fs::canonicalize(cluster.root().join("session_latest")).unwrap();
    std::fs::remove_dir_all(&session).unwrap();
    let error = stderr(&cluster.raylet(&["status"]));
    assert!(error.contains("missing"), "{error}");
    assert!(cluster.ok(&["stop"]).contains("Stopped all 2 raylet processes"));
    assert!(cluster.live_processes().is_empty());
}

#[test]
fn help_explains_every_command() {
    let output = Command::new(RAYLET).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for command in ["start", "status", "stop", "serve"] {
        assert!(help.contains(command), "{help}");
    }
    let commands: [(&[&str], &[&str]); 5] = [
        (
            &["start"],
            &["--head", "--address", "--num-gpus", "--resources", "--block", "--token"],
        ),
        (&["serve"], &["deploy", "status", "delete"]),
        (
            &["serve", "deploy"],
            &["FILE.yaml", "RAYLET_SERVE_DEPLOY", "--timeout", "--address"],
        ),
        (&["serve", "status"], &["--format", "--address"]),
        (&["serve", "delete"], &["<APP>", "--timeout", "--address"]),
    ];
    for (command, flags) in commands {
        let output = Command::new(RAYLET).args(command).arg("--help").output().unwrap();
        assert!(output.status.success(), "raylet {command:?} --help");
        let help = String::from_utf8_lossy(&output.stdout);
        for flag in flags {
            assert!(help.contains(flag), "raylet {command:?} --help lacks {flag}:\n{help}");
        }
    }
}

#[test]
fn an_embedded_cluster_with_actors_shuts_down_quietly() {
    let temp = tempfile::tempdir().unwrap();
    let output = Command::new(RAYLET)
        .args(["microbenchmark", "--quick", "--filter", "n:n actor calls async"])
        .env("RAYLET_TEMP_DIR", temp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("n:n actor calls async per second"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("WARN") && !stderr.contains("ERROR"),
        "the embedded head stops after the clients that follow it, so nobody reports it gone:\n{stderr}"
    );
}
