//! A driver that joins a cluster started with the `raylet` CLI: a head and a
//! second node as daemons, tasks leased on the driver's own machine, and a
//! task that only the second node can run, sent there by spillback.

use std::path::Path;
use std::process::Command;

use raylet::prelude::*;
use serde_json::Value;

const RAYLET: &str = env!("CARGO_BIN_EXE_raylet");

#[raylet::remote]
fn node_manager_pid() -> u32 {
    std::os::unix::process::parent_id()
}

fn raylet(temp: &Path, args: &[&str]) -> String {
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

/// Stops the test's daemons even when an assertion fails.
struct Daemons<'a>(&'a Path);

impl Drop for Daemons<'_> {
    fn drop(&mut self) {
        let _ = Command::new(RAYLET)
            .args(["stop", "--force", "--temp-dir"])
            .arg(self.0)
            .output();
    }
}

fn daemon_pids(temp: &Path, role: &str) -> Vec<u32> {
    std::fs::read_dir(temp.join("session_latest/processes"))
        .unwrap()
        .flatten()
        .map(|e| serde_json::from_str::<Value>(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .filter(|record| record["role"] == role)
        .map(|record| record["pid"].as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn a_driver_joins_a_cli_cluster_and_spills_tasks_to_the_node_that_fits() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(
        temp.path(),
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--num-cpus",
            "1",
            "--heartbeat-interval",
            "100ms",
        ],
    );
    let head = std::fs::read_to_string(temp.path().join("session_latest/head_address")).unwrap();
    raylet(
        temp.path(),
        &[
            "start",
            "--address",
            head.trim(),
            "--num-cpus",
            "1",
            "--resources",
            r#"{"special": 1}"#,
            "--heartbeat-interval",
            "100ms",
        ],
    );
    let head_pid = daemon_pids(temp.path(), "head")[0];
    let node_pid = daemon_pids(temp.path(), "node")[0];
    // The head learns the second node's resources from its heartbeats.
    std::thread::sleep(std::time::Duration::from_millis(500));

    let cluster = raylet::init_with(Config::new().address(head.trim()).temp_dir(temp.path())).unwrap();
    let status = cluster.status().unwrap();
    assert_eq!(status.alive().count(), 2);

    let refs: Vec<ObjectRef<u32>> = (0..20).map(|_| node_manager_pid::remote(&cluster).unwrap()).collect();
    let parents = cluster.get_all(&refs).unwrap();
    assert!(
        parents.iter().all(|pid| [head_pid, node_pid].contains(pid)),
        "{parents:?}"
    );

    let special = node_manager_pid::options()
        .resource("special", 1.0)
        .remote(&cluster)
        .unwrap();
    assert_eq!(
        special.get().unwrap(),
        node_pid,
        "only the second node has the resource"
    );
    cluster.shutdown().unwrap();
}

#[test]
fn raylet_memory_lists_each_object_with_its_owner_and_holders() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = std::fs::read_to_string(temp.path().join("session_latest/head_address")).unwrap();
    let cluster = raylet::init_with(Config::new().address(head.trim()).temp_dir(temp.path())).unwrap();
    let big = cluster.put(&serde_bytes::ByteBuf::from(vec![3u8; 2 << 20])).unwrap();
    let outer = cluster.put(&vec![big.clone()]).unwrap();

    let nodes: Value = serde_json::from_str(&raylet(temp.path(), &["memory", "--format", "json"])).unwrap();
    let objects = nodes[0]["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 1, "only the large object is in the store: {nodes}");
    let object = &objects[0];
    assert_eq!(object["id"], big.id().to_string());
    assert!(object["size"].as_u64().unwrap() >= 2 << 20);
    assert_eq!(object["owner"], big.owner_address());
    assert_eq!(object["holders"]["owner_handles"], 1, "{object}");
    assert!(nodes[0]["used_bytes"].as_u64().unwrap() >= 2 << 20);

    let text = raylet(temp.path(), &["memory"]);
    assert!(text.contains(&big.id().to_string()), "{text}");
    assert!(text.contains("in memory") && text.contains("owner ("), "{text}");

    drop((big, outer));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cluster.memory().unwrap()[0].used_bytes > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the freed object stays in the store"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cluster.shutdown().unwrap();
}
