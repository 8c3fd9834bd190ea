//! Helpers for tests that drive clusters of `raylet start` daemons: running
//! the CLI, stopping every daemon when a test ends, finding their pids.
//! Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

pub mod http;
pub mod netns;
pub mod providers;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use raylet::{Cluster, Config, NodeId};
use serde_json::Value;

pub const RAYLET: &str = env!("CARGO_BIN_EXE_raylet");

/// An actor that adds to a count: the tests' smallest stateful actor.
#[raylet::actor]
pub struct Tally {
    count: u64,
}

#[raylet::actor]
impl Tally {
    pub fn new(start: u64) -> Self {
        Tally { count: start }
    }

    pub fn add(&mut self, by: u64) -> u64 {
        self.count += by;
        self.count
    }
}

/// Runs `raylet ARGS --temp-dir TEMP`, asserts that it succeeded, and
/// returns what it printed.
pub fn raylet(temp: &Path, args: &[&str]) -> String {
    let output = Command::new(RAYLET)
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "raylet {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The head address of the latest session under `temp`.
pub fn head_address(temp: &Path) -> String {
    let text = std::fs::read_to_string(temp.join("session_latest/head_address")).unwrap();
    text.trim().to_string()
}

/// The processes that any thread of process `pid` started.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|thread| std::fs::read_to_string(thread.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .map(|child| child.parse().unwrap())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The same-node sockets (see `raylet_proto::local_socket`) that process
/// `pid` listens on: every listening Unix socket of its descriptors bound
/// in a `raylet-<uid>-net<namespace>` folder.
pub fn same_node_sockets(pid: u32) -> Vec<std::path::PathBuf> {
    raylet_proto::local_socket::listening_sockets_of(pid)
}

/// Stops the test's daemons even when an assertion fails.
pub struct Daemons<'a>(pub &'a Path);

impl Drop for Daemons<'_> {
    fn drop(&mut self) {
        let _ = Command::new(RAYLET)
            .args(["stop", "--force", "--temp-dir"])
            .arg(self.0)
            .output();
    }
}

/// The process records of the latest session's daemons.
pub fn daemon_records(temp: &Path) -> Vec<Value> {
    std::fs::read_dir(temp.join("session_latest/processes"))
        .unwrap()
        .flatten()
        .map(|e| serde_json::from_str::<Value>(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .collect()
}

/// The pids of the latest session's daemons in `role` ("head", "head_node" or "node").
pub fn daemon_pids(temp: &Path, role: &str) -> Vec<u32> {
    daemon_records(temp)
        .into_iter()
        .filter(|record| record["role"] == role)
        .map(|record| record["pid"].as_u64().unwrap() as u32)
        .collect()
}

/// Kills the latest session's head with SIGKILL; it must be the only one.
pub fn kill_head(temp: &Path) {
    let [head_pid] = daemon_pids(temp, "head")[..] else {
        panic!("one head runs");
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(head_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// A head and nodes of 2 CPUs each (or as given), one per zone (the head in the first),
/// labelled `zone=<zone>`, with fast heartbeats (100 ms, dead after 1 s),
/// stopped when dropped even if an assertion fails.
pub struct ZonedCluster<'a> {
    pub temp: &'a Path,
    pub head: String,
    _daemons: Daemons<'a>,
}

impl<'a> ZonedCluster<'a> {
    pub fn start(temp: &'a Path, zones: &[&str]) -> Self {
        Self::start_with_cpus(temp, zones, 2)
    }

    /// [`ZonedCluster::start`] with `cpus` CPUs per node.
    pub fn start_with_cpus(temp: &'a Path, zones: &[&str], cpus: u32) -> Self {
        let daemons = Daemons(temp);
        let cpus = cpus.to_string();
        let fast = [
            "--num-cpus",
            &cpus,
            "--heartbeat-interval",
            "100ms",
            "--heartbeat-timeout",
            "1s",
        ];
        let label = |zone: &str| format!("zone={zone}");
        let head_label = label(zones[0]);
        raylet(
            temp,
            &[&["start", "--head", "--port", "0", "--labels", &head_label][..], &fast].concat(),
        );
        let head = head_address(temp);
        for zone in &zones[1..] {
            let zone = label(zone);
            raylet(
                temp,
                &[&["start", "--address", &head, "--labels", &zone][..], &fast].concat(),
            );
        }
        let cluster = ZonedCluster {
            temp,
            head,
            _daemons: daemons,
        };
        cluster.wait_for_alive(zones.len());
        std::thread::sleep(Duration::from_millis(300));
        cluster
    }

    pub fn status(&self) -> Value {
        serde_json::from_str(&raylet(self.temp, &["status", "--format", "json"])).unwrap()
    }

    pub fn wait_for_alive(&self, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.alive_nodes().len() != count {
            assert!(
                std::time::Instant::now() < deadline,
                "{} alive nodes",
                self.alive_nodes().len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn alive_nodes(&self) -> Vec<Value> {
        let status = self.status();
        let nodes = status["nodes"].as_array().unwrap().clone();
        nodes.into_iter().filter(|n| n["state"] == "ALIVE").collect()
    }

    /// The id and node manager pid of the node labelled `zone`.
    pub fn node(&self, zone: &str) -> (NodeId, u32) {
        let node = self
            .alive_nodes()
            .into_iter()
            .find(|n| n["labels"]["zone"] == zone)
            .unwrap_or_else(|| panic!("no alive node in zone {zone}"));
        let id_text = node["node_id"].as_str().unwrap().to_string();
        let id: NodeId = id_text.parse().unwrap();
        let pid = daemon_records(self.temp)
            .into_iter()
            .find(|record| record["node_id"] == id_text.as_str())
            .map(|record| record["pid"].as_u64().unwrap() as u32)
            .unwrap_or_else(|| panic!("no process record of node {id_text}"));
        (id, pid)
    }

    pub fn driver(&self) -> Cluster {
        raylet::init_with(Config::new().address(&self.head).temp_dir(self.temp)).unwrap()
    }
}
