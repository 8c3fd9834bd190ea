//! Helpers for the node provider tests: a node type to launch, the nodes
//! `raylet status` lists alive, and waiting for what a provider does.

use std::path::Path;
use std::time::{Duration, Instant};

use raylet_autoscaler::{INSTANCE_LABEL, InstanceId};
use raylet_placement::autoscaler::NodeType;
use raylet_proto::{Amount, Labels, ResourceSet};
use serde_json::Value;

use super::raylet;

/// A node type of 2 CPUs, 1 GiB of memory, 256 MiB of object store and one
/// `disk_ssd`, labelled `pool=cpu2`.
pub fn cpu2_node_type() -> NodeType {
    NodeType {
        name: "cpu2".into(),
        resources: ResourceSet::new()
            .with("CPU", Amount::whole(2))
            .with("memory", Amount::whole(1 << 30))
            .with("object_store_memory", Amount::whole(256 << 20))
            .with("disk_ssd", Amount::whole(1)),
        labels: Labels::from([("pool".to_string(), "cpu2".to_string())]),
        min_count: 0,
        max_count: 4,
        idle_timeout: Duration::from_secs(60),
    }
}

/// Asserts that `node` offers what [`cpu2_node_type`] says and carries its label.
pub fn assert_cpu2_node(node: &Value) {
    assert_eq!(node["labels"]["pool"], "cpu2", "{node:#}");
    let total = &node["total"];
    assert_eq!(total["CPU"].as_f64(), Some(2.0), "{node:#}");
    assert_eq!(total["memory"].as_f64(), Some((1u64 << 30) as f64), "{node:#}");
    assert_eq!(total["disk_ssd"].as_f64(), Some(1.0), "{node:#}");
}

/// The alive nodes `raylet status` lists.
pub fn alive_nodes(temp: &Path) -> Vec<Value> {
    let status: Value = serde_json::from_str(&raylet(temp, &["status", "--format", "json"])).unwrap();
    let nodes = status["nodes"].as_array().unwrap().clone();
    nodes.into_iter().filter(|node| node["state"] == "ALIVE").collect()
}

/// The alive node labelled with `instance`, if one is.
pub fn instance_node(temp: &Path, instance: &InstanceId) -> Option<Value> {
    alive_nodes(temp)
        .into_iter()
        .find(|node| node["labels"][INSTANCE_LABEL] == instance.0.as_str())
}

/// Waits up to `patience` for `ready`; fails naming `what`.
pub fn wait_for<T>(what: &str, patience: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {patience:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
