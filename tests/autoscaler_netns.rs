//! The `netns` node provider against a real `raylet start` head that
//! listens on the provider's bridge: a launched node joins from its own
//! namespace's address with its type's resources and labels, a restarted
//! provider finds it and can terminate it, and terminating removes the node
//! from the cluster and its namespace and veth link from the machine; a
//! node that cannot join is listed failed with the reason from its log, and
//! a missing binary fails the launch. Through `raylet up`, waiting tasks
//! launch hosts that run them from their own addresses, and `raylet down`
//! removes the hosts and the bridge. Needs root; under CI it must run.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use raylet_autoscaler::{Instance, InstanceId, InstanceState, LaunchRequest, NetnsConfig, NetnsProvider, NodeProvider};
use tokio::runtime::Runtime;

use crate::autoscaler_cluster::UpCluster;
use crate::common::http::session_file;
use crate::common::netns::{can_make_namespaces, remove_namespaces_named, remove_stale_of_dead_tests};
use crate::common::providers::{assert_cpu2_node, cpu2_node_type, instance_node, wait_for};
use crate::common::{Daemons, RAYLET, head_address, raylet};

/// Bridges and cluster names of this test: the prefix and the test's pid.
const NAME_PREFIX: &str = "rlas";
const SUBNET: &str = "10.99.0.0/24";
/// How long a node may take to join or leave.
const PATIENCE: Duration = Duration::from_secs(30);

/// Removes the test's namespaces and bridge even when an assertion fails.
struct Cleanup {
    cluster: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_namespaces_named(&format!("raylet-{}-", self.cluster));
        let _ = Command::new("ip").args(["link", "del", &self.cluster]).output();
    }
}

fn namespace_exists(name: &str) -> bool {
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    listed.lines().any(|line| line.split_whitespace().next() == Some(name))
}

/// The links enslaved to `bridge`: the host ends of the nodes' veth pairs.
fn bridge_ports(bridge: &str) -> String {
    let output = Command::new("ip")
        .args(["-o", "link", "show", "master", bridge])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn wait_to_leave(temp: &Path, instance: &InstanceId) {
    wait_for("the terminated node to leave", PATIENCE, || {
        instance_node(temp, instance).is_none().then_some(())
    });
}

#[test]
fn a_netns_node_joins_from_its_own_address_and_terminating_removes_its_namespace() {
    if !can_make_namespaces() {
        return;
    }
    remove_stale_of_dead_tests(NAME_PREFIX, &format!("raylet-{NAME_PREFIX}"));
    let cluster = format!("{NAME_PREFIX}{}", std::process::id());
    let _cleanup = Cleanup {
        cluster: cluster.clone(),
    };
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let config = NetnsConfig {
        bridge: cluster.clone(),
        subnet: SUBNET.into(),
        binary: RAYLET.into(),
        temp_dir: temp.path().into(),
    };
    let provider = NetnsProvider::new(&cluster, config.clone()).unwrap();
    let gateway = provider.gateway().to_string();
    assert_eq!(gateway, "10.99.0.1");
    raylet(
        temp.path(),
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--num-cpus",
            "0",
            "--node-ip",
            &gateway,
        ],
    );
    let request = LaunchRequest {
        node_type: cpu2_node_type(),
        head_address: head_address(temp.path()),
        token: session_file(temp.path(), "token"),
    };
    let runtime = Runtime::new().unwrap();

    let instance = runtime.block_on(provider.launch(&request)).unwrap();
    assert_eq!(instance.0, format!("raylet-{cluster}-2"));
    let node = wait_for("the launched node to join", PATIENCE, || {
        instance_node(temp.path(), &instance)
    });
    assert_cpu2_node(&node);
    let address = node["address"].as_str().unwrap();
    assert!(
        address.starts_with("10.99.0.2:"),
        "joins from its namespace's address: {node:#}"
    );
    let running = vec![Instance {
        id: instance.clone(),
        node_type: "cpu2".into(),
        state: InstanceState::Running,
    }];
    assert_eq!(runtime.block_on(provider.instances()).unwrap(), running);
    let restarted = NetnsProvider::new(&cluster, config.clone()).unwrap();
    assert_eq!(
        runtime.block_on(restarted.instances()).unwrap(),
        running,
        "a restarted head's provider finds the node in its namespace"
    );

    runtime.block_on(provider.terminate(&instance)).unwrap();
    assert!(runtime.block_on(provider.instances()).unwrap().is_empty());
    assert!(!namespace_exists(&instance.0), "its namespace is deleted");
    assert_eq!(bridge_ports(&cluster), "", "its veth pair is gone");
    wait_to_leave(temp.path(), &instance);

    let second = runtime.block_on(provider.launch(&request)).unwrap();
    assert_eq!(second, instance, "the freed address is taken again");
    wait_for("the second node to join", PATIENCE, || {
        instance_node(temp.path(), &second)
    });
    runtime.block_on(restarted.terminate(&second)).unwrap();
    assert!(
        !namespace_exists(&second.0),
        "a restarted provider ends a node it did not start"
    );
    wait_to_leave(temp.path(), &second);
    runtime.block_on(provider.terminate(&second)).unwrap();
    assert!(runtime.block_on(provider.instances()).unwrap().is_empty());

    let refused = LaunchRequest {
        token: "not-the-token".into(),
        ..request.clone()
    };
    let stranger = runtime.block_on(provider.launch(&refused)).unwrap();
    let reason = wait_for("the node with a wrong token to fail", PATIENCE, || {
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
    assert!(!namespace_exists(&stranger.0));

    let missing = NetnsProvider::new(
        &cluster,
        NetnsConfig {
            binary: "/nonexistent/raylet".into(),
            ..config
        },
    )
    .unwrap();
    let failed = runtime.block_on(missing.launch(&request)).unwrap_err().to_string();
    assert!(
        failed.contains("cpu2") && failed.contains("/nonexistent/raylet"),
        "{failed}"
    );
    assert!(
        runtime.block_on(provider.instances()).unwrap().is_empty(),
        "nothing is left of it"
    );

    provider.remove_bridge().unwrap();
    let bridge = Command::new("ip")
        .args(["link", "show", "dev", &cluster])
        .output()
        .unwrap();
    assert!(!bridge.status.success(), "the bridge it made is deleted");
}

#[test]
fn waiting_tasks_launch_netns_hosts_that_run_them_from_their_own_addresses_and_down_removes_everything() {
    if !can_make_namespaces() {
        return;
    }
    let name = format!("{NAME_PREFIX}u{}", std::process::id());
    let _cleanup = Cleanup { cluster: name.clone() };
    let provider =
        format!("  type: netns\n  bridge: {name}\n  subnet: 10.98.0.0/24\n  binary: {RAYLET}\n  temp_dir: {{temp}}");
    let cluster = UpCluster::up_with(
        &name,
        &provider,
        &["--num-cpus", "0", "--node-ip", "10.98.0.1"],
        &UpCluster::cpu2_types(2, 600),
    );
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    cluster.run_on_launched_nodes(&driver, 4, "cpu2", PATIENCE);
    let status: serde_json::Value =
        serde_json::from_str(&raylet(cluster.path(), &["status", "--format", "json"])).unwrap();
    let hosts: Vec<String> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "ALIVE" && node["is_head_node"] == false)
        .map(|node| node["address"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !hosts.is_empty() && hosts.iter().all(|a| a.starts_with("10.98.0.")),
        "{hosts:?}"
    );
    assert!(
        hosts.iter().all(|a| !a.starts_with("10.98.0.1:")),
        "each from its own address: {hosts:?}"
    );

    drop(driver);
    cluster.down();
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        !listed.contains(&format!("raylet-{name}-")),
        "namespaces removed: {listed}"
    );
    let bridge = Command::new("ip").args(["link", "show", &name]).output().unwrap();
    assert!(!bridge.status.success(), "the bridge the head made is removed");
}
