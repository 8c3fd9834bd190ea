//! A node killed mid-run on a real multi-process cluster: a head and a
//! second node started with the `raylet` CLI, the driver (this test)
//! joining them. The second node's manager and every worker it started are
//! SIGKILLed while blocks run there; their blocks are retried on the head's
//! node and every input still appears exactly once in the output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_data::{Dataset, FileBytes, FileSet, register_map};

use crate::common;

use common::{Parsed, assert_each_once, numbered_files, output_rows};

/// Parses one numbered file, slowly enough that blocks are in flight on
/// both nodes when one is killed.
fn parse_slowly(file: FileBytes) -> Result<Parsed, String> {
    std::thread::sleep(Duration::from_millis(15));
    Parsed::from_file(file)
}
register_map!(parse_slowly);

/// The `raylet` binary of this build: the workspace's tests build it beside
/// this test's directory.
fn raylet_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe.parent().unwrap().parent().unwrap().join("raylet");
    assert!(
        binary.exists(),
        "{} is missing: build it with `cargo build -p raylet-cli --bin raylet` (the workspace's test run does)",
        binary.display()
    );
    binary
}

/// Runs `raylet ARGS --temp-dir TEMP`, which must succeed.
fn raylet(temp: &Path, args: &[&str]) -> String {
    let output = Command::new(raylet_binary())
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "raylet {args:?}: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// Stops the test's daemons even when an assertion fails.
struct Daemons<'a>(&'a Path);

impl Drop for Daemons<'_> {
    fn drop(&mut self) {
        let _ = Command::new(raylet_binary())
            .args(["stop", "--force", "--temp-dir"])
            .arg(self.0)
            .output();
    }
}

/// A head and a second node of 2 CPUs each, with fast heartbeats; returns
/// the head's address and the second node manager's pid.
fn head_and_node(temp: &Path) -> (String, u32) {
    let fast = [
        "--num-cpus",
        "2",
        "--heartbeat-interval",
        "100ms",
        "--heartbeat-timeout",
        "1s",
    ];
    raylet(temp, &[&["start", "--head", "--port", "0"][..], &fast].concat());
    let head = std::fs::read_to_string(temp.join("session_latest/head_address")).unwrap();
    let head = head.trim().to_string();
    raylet(temp, &[&["start", "--address", &head][..], &fast].concat());
    let node_pid = std::fs::read_dir(temp.join("session_latest/processes"))
        .unwrap()
        .flatten()
        .map(|entry| serde_json::from_slice::<serde_json::Value>(&std::fs::read(entry.path()).unwrap()).unwrap())
        .find(|record| record["role"] == "node")
        .and_then(|record| record["pid"].as_u64())
        .expect("the second node's process record") as u32;
    (head, node_pid)
}

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

fn manifest_blocks(out: &Path) -> usize {
    common::manifest_blocks(out)
}

#[test]
fn a_node_killed_mid_run_loses_no_input_and_repeats_none() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, node_pid) = head_and_node(temp.path());
    raylet::init_with(raylet::Config::new().address(&head).temp_dir(temp.path())).unwrap();

    let inputs = numbered_files(temp.path(), 1_500);
    let out = temp.path().join("out");
    let run = {
        let out = out.clone();
        std::thread::spawn(move || {
            Dataset::read_binary(FileSet::dir(&inputs))
                .files_per_block(10)
                .max_blocks_in_flight(8)
                .show_progress(false)
                .map(parse_slowly)
                .write_jsonl(&out)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut node_workers = Vec::new();
    while manifest_blocks(&out) < 30 || node_workers.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no 30 blocks with work on the second node in 60 s"
        );
        assert!(!run.is_finished(), "the run ended before the node was killed");
        node_workers = children_of(node_pid);
        std::thread::sleep(Duration::from_millis(10));
    }
    let written_before = manifest_blocks(&out);
    let doomed: Vec<u32> = std::iter::once(node_pid).chain(children_of(node_pid)).collect();
    node_workers.extend(doomed.iter().copied());
    for pid in doomed {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    let summary = run.join().unwrap().expect("the run completes after the node's death");
    println!(
        "{written_before} of 150 blocks written when the node was killed; then {} written, {} rows",
        summary.blocks_written, summary.rows
    );
    assert!(written_before < 150, "the node was killed after the run");

    let rows: Vec<Parsed> = output_rows(&out);
    assert_each_once(&rows, 1_500);
    let on_killed_node = rows.iter().filter(|row| node_workers.contains(&row.worker)).count();
    println!("{on_killed_node} inputs were processed on the killed node before it died");
    assert!(on_killed_node > 0, "the second node ran blocks before it was killed");
    assert_eq!(summary.rows, 1_500);
}
