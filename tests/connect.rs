//! A driver that joins a cluster started with the `raylet` CLI: a head and a
//! second node as daemons, tasks leased on the driver's own machine, a task
//! that only the second node can run, sent there by spillback, `raylet
//! memory`, objects lost with a node that is killed: rebuilt by running
//! their task again, or a clear `ObjectLost` for `put` objects, and actors
//! on a killed node: restarted on a node that joins, or dead naming it.

use std::path::Path;
use std::process::Command;

use raylet::prelude::*;
use serde_json::Value;

use crate::common;

use common::{Daemons, Tally, daemon_pids, raylet};

#[raylet::remote]
fn node_manager_pid() -> u32 {
    std::os::unix::process::parent_id()
}

#[raylet::remote]
fn sleep_ms(ms: u64) -> u64 {
    std::thread::sleep(std::time::Duration::from_millis(ms));
    ms
}

#[raylet::remote]
fn make_block(fill: u8) -> serde_bytes::ByteBuf {
    serde_bytes::ByteBuf::from(vec![fill; 1 << 20])
}

/// The pid of the node manager running this task and a hash of the block.
/// Yields `count` blocks of 1 MiB, block `i` filled with `i`.
#[raylet::remote(streaming)]
fn blocks(count: u8) -> impl Iterator<Item = serde_bytes::ByteBuf> {
    (0..count).map(|fill| serde_bytes::ByteBuf::from(vec![fill; 1 << 20]))
}

#[raylet::remote(resources(special = 1))]
fn hash_on_special_node(block: serde_bytes::ByteBuf) -> (u32, u64) {
    (std::os::unix::process::parent_id(), xxhash_rust::xxh3::xxh3_64(&block))
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
    let head = common::head_address(temp.path());
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
    let head_node_pid = daemon_pids(temp.path(), "head_node")[0];
    let node_pid = daemon_pids(temp.path(), "node")[0];
    // The head learns the second node's resources from its heartbeats.
    std::thread::sleep(std::time::Duration::from_millis(500));

    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let status = cluster.status().unwrap();
    assert_eq!(status.alive().count(), 2);

    let refs: Vec<ObjectRef<u32>> = (0..20).map(|_| node_manager_pid::remote(&cluster).unwrap()).collect();
    let parents = cluster.get_all(&refs).unwrap();
    assert!(
        parents.iter().all(|pid| [head_node_pid, node_pid].contains(pid)),
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
    // Without TLS, each worker takes task streams and gets from this machine
    // on Unix sockets beside its TCP ports, and the driver takes gets.
    for pid in [head_node_pid, node_pid].into_iter().flat_map(common::children_of) {
        assert_eq!(common::same_node_sockets(pid).len(), 2, "worker {pid}");
    }
    assert_eq!(common::same_node_sockets(std::process::id()).len(), 1);
    cluster.shutdown().unwrap();
}

#[test]
fn raylet_memory_and_list_show_each_object_with_its_owner_and_holders() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = common::head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
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

    let listed = |args: &[&str]| -> Value {
        let args = [&["list"][..], args, &["--format", "json"]].concat();
        serde_json::from_str(&raylet(temp.path(), &args)).unwrap()
    };
    let id = big.id().to_string();
    let rows = listed(&["objects", "--filter", &format!("id={id}"), "--filter", "spilled=false"]);
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["node"], nodes[0]["address"]);
    assert_eq!(listed(&["objects", "--filter", "spilled=true"]), serde_json::json!([]));
    assert_eq!(
        listed(&["nodes", "--filter", "state=alive"]).as_array().unwrap().len(),
        1
    );
    assert_eq!(
        listed(&["nodes", "--filter", "is_head_node!=true"]),
        serde_json::json!([])
    );
    let text = raylet(temp.path(), &["list", "objects"]);
    assert!(text.contains("1 objects") && text.contains(&id), "{text}");
    let refused = std::process::Command::new(common::RAYLET)
        .args(["list", "nodes", "--filter", "colour=red", "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && error.contains("nodes have no field \"colour\""),
        "{error}"
    );

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

/// A head and a second node of one CPU each; returns the node managers'
/// addresses (head first) and the second node's pid.
fn two_nodes(temp: &Path) -> (String, String, String, u32) {
    let fast = ["--num-cpus", "1", "--heartbeat-interval", "100ms"];
    raylet(temp, &[&["start", "--head", "--port", "0"][..], &fast].concat());
    let head = common::head_address(temp);
    let special = ["--resources", r#"{"special": 1}"#];
    raylet(temp, &[&["start", "--address", &head][..], &fast, &special].concat());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let status: Value = serde_json::from_str(&raylet(temp, &["status", "--format", "json"])).unwrap();
    let address_of = |head_node: bool| {
        let nodes = status["nodes"].as_array().unwrap();
        let node = nodes.iter().find(|n| n["is_head_node"] == head_node).unwrap();
        node["address"].as_str().unwrap().to_string()
    };
    let node_pid = daemon_pids(temp, "node")[0];
    (head, address_of(true), address_of(false), node_pid)
}

/// Kills a daemon with SIGKILL and waits until it is gone.
fn kill_and_wait(pid: u32) {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while nix::sys::signal::kill(target, None).is_ok() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A driver of the cluster at `head` attached to the node manager `node`.
fn driver_on(temp: &Path, head: &str, node: &str) -> Cluster {
    let config = Config::new().address(head).node_manager(node).temp_dir(temp);
    raylet::init_with(config).unwrap()
}

fn holds(cluster: &Cluster, node: &str, object: raylet::ObjectId) -> bool {
    let nodes = cluster.memory().unwrap();
    nodes
        .iter()
        .any(|n| n.address == node && n.objects.iter().any(|o| o.id == object))
}

#[test]
fn objects_lost_with_their_node_are_rebuilt_by_running_their_tasks_again() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, head_node, second_node, second_pid) = two_nodes(temp.path());
    let cluster = driver_on(temp.path(), &head, &head_node);

    let busy = sleep_ms::remote(&cluster, 1500).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let block = make_block::remote(&cluster, 5).unwrap();
    let (ready, _) = cluster.wait(
        std::slice::from_ref(&block),
        1,
        Some(std::time::Duration::from_secs(10)),
    );
    assert_eq!(ready.len(), 1, "the block was made");
    let items: Vec<_> = blocks::remote(&cluster, 3).unwrap().map(|item| item.unwrap()).collect();
    assert_eq!(items.len(), 3, "the generator finished");
    for made in items.iter().map(|item| item.as_untyped()).chain([block.as_untyped()]) {
        assert!(
            holds(&cluster, &second_node, made.id()),
            "the head was busy, so the second node made {made:?}"
        );
    }

    kill_and_wait(second_pid);
    let value = block.get().unwrap();
    assert!(
        value[..] == vec![5u8; 1 << 20][..],
        "the rebuilt block has the same bytes"
    );
    assert!(
        holds(&cluster, &head_node, block.id()),
        "it was made again on the head's node"
    );
    for (fill, item) in items.iter().enumerate() {
        let block = item.get().unwrap();
        assert!(
            block[..] == vec![fill as u8; 1 << 20][..],
            "item {fill} has its bytes again"
        );
        assert!(
            holds(&cluster, &head_node, item.id()),
            "item {fill} was made again on the head's node, in one run of the generator"
        );
    }
    assert_eq!(busy.get().unwrap(), 1500);
    cluster.shutdown().unwrap();
}

#[test]
fn a_put_object_lost_with_its_node_is_a_clear_object_lost() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, _, second_node, second_pid) = two_nodes(temp.path());
    let cluster = driver_on(temp.path(), &head, &second_node);
    let stored = cluster.put(&serde_bytes::ByteBuf::from(vec![1u8; 1 << 20])).unwrap();

    kill_and_wait(second_pid);
    let error = stored.get().unwrap_err();
    let raylet::Error::ObjectLost { object, reason } = &error else {
        panic!("expected ObjectLost, got {error}");
    };
    assert_eq!(*object, stored.id());
    assert!(reason.contains(&second_node), "{error}");
    assert!(reason.contains("put objects cannot be rebuilt"), "{error}");
}

#[test]
fn a_task_on_another_node_reads_a_256_mib_object_pulled_from_the_first() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, head_node, second_node, second_pid) = two_nodes(temp.path());
    let cluster = driver_on(temp.path(), &head, &head_node);
    let data: Vec<u8> = (0..256u32 << 20).map(|i| (i % 251) as u8).collect();
    let expected = xxhash_rust::xxh3::xxh3_64(&data);
    let block = cluster.put(&serde_bytes::ByteBuf::from(data)).unwrap();
    assert!(holds(&cluster, &head_node, block.id()));

    let first = hash_on_special_node::remote(&cluster, &block).unwrap().get().unwrap();
    assert_eq!(first, (second_pid, expected), "the second node read the same bytes");
    assert!(
        holds(&cluster, &second_node, block.id()),
        "the second node keeps its copy"
    );
    let again = hash_on_special_node::remote(&cluster, &block).unwrap().get().unwrap();
    assert_eq!(again, (second_pid, expected));
    let pulled: u64 = cluster.memory().unwrap().iter().map(|n| n.pulled_bytes).sum();
    assert_eq!(pulled, block_size(&cluster, &second_node, block.id()), "pulled once");

    drop(block);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cluster.memory().unwrap().iter().any(|n| !n.objects.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "both copies are deleted with the object"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cluster.shutdown().unwrap();
}

fn block_size(cluster: &Cluster, node: &str, object: raylet::ObjectId) -> u64 {
    let nodes = cluster.memory().unwrap();
    let node = nodes.iter().find(|n| n.address == node).unwrap();
    node.objects.iter().find(|o| o.id == object).unwrap().size
}

/// Not a test on its own: the second driver of
/// `a_detached_actor_outlives_its_creator_and_an_owned_one_dies_with_it`,
/// which runs it in a process of its own. It makes a detached actor and an
/// owned one, calls both, and exits.
#[test]
#[ignore = "run by a_detached_actor_outlives_its_creator_and_an_owned_one_dies_with_it"]
fn second_driver_makes_a_detached_and_an_owned_actor() {
    let cluster = raylet::init().unwrap();
    let kept = Tally::remote(&cluster, 40).name("kept").detached().spawn().unwrap();
    let owned = Tally::remote(&cluster, 0).name("owned").spawn().unwrap();
    assert_eq!(kept.add(2).get().unwrap(), 42);
    assert_eq!(owned.add(1).get().unwrap(), 1);
}

#[test]
fn a_detached_actor_outlives_its_creator_and_an_owned_one_dies_with_it() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, head_node, _, _) = two_nodes(temp.path());
    let second_driver = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "connect::second_driver_makes_a_detached_and_an_owned_actor",
            "--ignored",
        ])
        .env("RAYLET_ADDRESS", &head)
        .env("RAYLET_TEMP_DIR", temp.path())
        .output()
        .unwrap();
    assert!(
        second_driver.status.success(),
        "the second driver failed: {}",
        String::from_utf8_lossy(&second_driver.stdout)
    );

    let cluster = driver_on(temp.path(), &head, &head_node);
    let kept = cluster.get_actor::<Tally>("kept").unwrap();
    assert_eq!(kept.add(1).get().unwrap(), 43, "the detached actor kept its state");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cluster.get_actor::<Tally>("owned").is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the owned actor outlived its owner"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let listed: Value = serde_json::from_str(&raylet(temp.path(), &["list", "actors", "--format", "json"])).unwrap();
    let state_of = |name: &str| {
        let actors = listed.as_array().unwrap();
        let actor = actors.iter().find(|a| a["name"] == name).unwrap();
        (
            actor["state"].as_str().unwrap().to_string(),
            actor["death_cause"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(state_of("kept").0, "ALIVE");
    let (state, cause) = state_of("owned");
    assert_eq!(state, "DEAD");
    assert!(cause.contains("owner") && cause.contains("not detached"), "{cause}");
    let text = raylet(temp.path(), &["list", "actors"]);
    assert!(
        text.contains("Tally") && text.contains("kept") && text.contains("ALIVE"),
        "{text}"
    );
    let dead: Value = serde_json::from_str(&raylet(
        temp.path(),
        &["list", "actors", "--filter", "state=DEAD", "--format", "json"],
    ))
    .unwrap();
    let names: Vec<&str> = dead
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["owned"], "{dead}");
}

/// The listing of `actor` once `done` holds for it.
fn listed_when(cluster: &Cluster, actor: &ActorHandle, done: impl Fn(&raylet::ActorInfo) -> bool) -> raylet::ActorInfo {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let actors = cluster.list_actors().unwrap();
        let info = actors.into_iter().find(|a| a.id == actor.id()).unwrap();
        if done(&info) {
            return info;
        }
        assert!(std::time::Instant::now() < deadline, "the actor stays {info:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn actors_on_a_node_that_dies_restart_on_a_node_that_joins_or_die_naming_it() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (head, head_node, second_node, second_pid) = two_nodes(temp.path());
    let cluster = driver_on(temp.path(), &head, &head_node);
    let moving = Tally::remote(&cluster, 10)
        .resource("special", 0.5)
        .max_restarts(1)
        .spawn()
        .unwrap();
    let fragile = Tally::remote(&cluster, 20).resource("special", 0.5).spawn().unwrap();
    assert_eq!(moving.add(1).get().unwrap(), 11);
    assert_eq!(fragile.add(1).get().unwrap(), 21);
    let second_id = listed_when(&cluster, &moving, |_| true).node_id;

    kill_and_wait(second_pid);
    let fast = ["--num-cpus", "1", "--heartbeat-interval", "100ms"];
    let special = ["--resources", r#"{"special": 1}"#];
    raylet(
        temp.path(),
        &[&["start", "--address", &head][..], &fast, &special].concat(),
    );

    let Err(raylet::Error::Task(error)) = fragile.add(1).get() else {
        panic!("an actor that may not restart must not answer after its node died");
    };
    assert!(error.is_actor_death(), "{error}");
    assert!(error.message.contains(&second_node), "{error}");
    let moved = listed_when(&cluster, &moving, |a| {
        a.state == raylet::ActorState::Alive && a.restarts == 1
    });
    assert_ne!(moved.node_id, second_id, "it restarted on the node that joined");
    assert_eq!(moving.add(1).get().unwrap(), 11, "its constructor ran again");
    assert_eq!(
        listed_when(&cluster, &fragile, |_| true).state,
        raylet::ActorState::Dead
    );
    cluster.shutdown().unwrap();
}
