//! The `local` node provider against a real `raylet start` head: a launched
//! node joins with its type's resources and labels and the instance label,
//! is listed running, and leaves the cluster when terminated; a node that
//! cannot join is listed failed with the reason from its log, and a binary
//! that does not exist fails the launch.

use std::path::Path;
use std::time::{Duration, Instant};

use raylet_autoscaler::{INSTANCE_LABEL, Instance, InstanceState, LaunchRequest, LocalProvider, NodeProvider};
use raylet_placement::autoscaler::NodeType;
use raylet_proto::{Amount, Labels, ResourceSet};
use serde_json::Value;

use crate::common::http::session_file;
use crate::common::{Daemons, RAYLET, head_address, raylet};

fn cpu2() -> NodeType {
    NodeType {
        name: "cpu2".into(),
        resources: ResourceSet::new()
            .with("CPU", Amount::whole(2))
            .with("disk_ssd", Amount::whole(1)),
        labels: Labels::from([("pool".to_string(), "cpu2".to_string())]),
        min_count: 0,
        max_count: 4,
        idle_timeout: Duration::from_secs(60),
    }
}

/// The alive nodes `raylet status` lists.
fn alive_nodes(temp: &Path) -> Vec<Value> {
    let status: Value = serde_json::from_str(&raylet(temp, &["status", "--format", "json"])).unwrap();
    let nodes = status["nodes"].as_array().unwrap().clone();
    nodes.into_iter().filter(|node| node["state"] == "ALIVE").collect()
}

/// Waits up to 20 s for `ready`; fails naming `what`.
fn wait_for<T>(what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_local_node_joins_with_its_types_resources_and_leaves_when_terminated() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "0"]);
    let head = head_address(temp.path());
    let token = session_file(temp.path(), "token");
    let provider = LocalProvider::new(RAYLET, temp.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let request = LaunchRequest {
        node_type: cpu2(),
        head_address: head.clone(),
        token: token.clone(),
    };

    let instance = runtime.block_on(provider.launch(&request)).unwrap();
    let node = wait_for("the launched node to join", || {
        alive_nodes(temp.path())
            .into_iter()
            .find(|node| node["labels"][INSTANCE_LABEL] == instance.0.as_str())
    });
    assert_eq!(node["labels"]["pool"], "cpu2", "{node:#}");
    let total = node["total"].to_string();
    assert!(
        total.contains("\"CPU\":2") && total.contains("\"disk_ssd\":1"),
        "{node:#}"
    );
    let running = Instance {
        id: instance.clone(),
        node_type: "cpu2".into(),
        state: InstanceState::Running,
    };
    assert_eq!(runtime.block_on(provider.instances()).unwrap(), vec![running]);

    runtime.block_on(provider.terminate(&instance)).unwrap();
    assert!(runtime.block_on(provider.instances()).unwrap().is_empty());
    wait_for("the terminated node to leave", || {
        let gone = alive_nodes(temp.path())
            .iter()
            .all(|node| node["labels"][INSTANCE_LABEL] != instance.0.as_str());
        gone.then_some(())
    });

    let refused = LaunchRequest {
        token: "not-the-token".into(),
        ..request.clone()
    };
    let stranger = runtime.block_on(provider.launch(&refused)).unwrap();
    let reason = wait_for("the node with a wrong token to fail", || {
        let instances = runtime.block_on(provider.instances()).unwrap();
        instances.into_iter().find_map(|instance| match instance.state {
            InstanceState::Failed(reason) if instance.id == stranger => Some(reason),
            _ => None,
        })
    });
    assert!(reason.contains("exit status"), "{reason}");
    assert!(
        reason.to_lowercase().contains("token"),
        "says why from its log: {reason}"
    );
    runtime.block_on(provider.terminate(&stranger)).unwrap();

    let missing = LocalProvider::new("/nonexistent/raylet", temp.path());
    let failed = runtime.block_on(missing.launch(&request)).unwrap_err().to_string();
    assert!(
        failed.contains("cpu2") && failed.contains("/nonexistent/raylet"),
        "{failed}"
    );
}
