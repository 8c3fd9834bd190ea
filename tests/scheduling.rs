//! Scheduling: GPU ids and `CUDA_VISIBLE_DEVICES` on a node that declares
//! GPUs or detects fake ones (no real GPU needed), a daemon started with
//! `CUDA_VISIBLE_DEVICES` naming its workers' GPUs by it, GPU readings in
//! the status, fractional GPUs packed onto one id, infeasible
//! requests that fail at once naming what is missing, and, on a cluster of
//! three `raylet start` daemons, SPREAD for tasks and actors, node affinity
//! (hard to a dead node is a clear error, soft falls back), label selectors,
//! tasks sent to the node that holds their largest argument, and a memory
//! hog ended by the out-of-memory monitor and retried.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use raylet::Amount;
use raylet::Error;
use raylet::FakeGpus;
use raylet::prelude::*;
use raylet::resource_names::{CPU, GPU};
use raylet::status::{NodeStatus, ResourceDemand};

use crate::common;

use common::ZonedCluster;

/// The GPU ids leased to this task, and what CUDA programs would see.
#[raylet::remote]
fn gpus_seen(hold_ms: u64) -> (Vec<u32>, String) {
    std::thread::sleep(Duration::from_millis(hold_ms));
    (
        raylet::gpu_ids(),
        std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
    )
}

/// Fails as a CUDA program does when its GPU falls off the bus.
#[raylet::remote]
fn lose_the_gpu() {
    panic!("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered");
}

/// The pid of the node manager that runs this task, after `ms`.
#[raylet::remote]
fn node_manager_after(ms: u64) -> u32 {
    std::thread::sleep(Duration::from_millis(ms));
    std::os::unix::process::parent_id()
}

/// A 1 MiB block: large enough to live in the node's object store.
#[raylet::remote]
fn make_block(fill: u8) -> serde_bytes::ByteBuf {
    serde_bytes::ByteBuf::from(vec![fill; 1 << 20])
}

/// The pid of the node manager that runs this task, which reads `block`.
#[raylet::remote]
fn node_manager_reading(block: serde_bytes::ByteBuf) -> u32 {
    assert_eq!(block.len(), 1 << 20);
    std::os::unix::process::parent_id()
}

#[raylet::actor]
#[derive(Default)]
pub struct Placed;

#[raylet::actor]
impl Placed {
    pub fn new() -> Self {
        Placed
    }

    pub fn node_manager(&self) -> u32 {
        std::os::unix::process::parent_id()
    }
}

fn gpu_cluster() -> Cluster {
    raylet::init_with(Config::new().num_cpus(4.0).num_gpus(2.0)).unwrap()
}

fn task_error(error: Error) -> raylet::TaskError {
    match error {
        Error::Task(task) => task,
        other => panic!("expected a task error, got {other}"),
    }
}

#[test]
fn whole_gpu_tasks_get_distinct_ids_in_cuda_visible_devices_and_cpu_tasks_see_none() {
    let cluster = gpu_cluster();
    let refs: Vec<_> = (0..2)
        .map(|_| gpus_seen::options().num_gpus(1.0).remote(&cluster, 1000).unwrap())
        .collect();
    let mut seen = cluster.get_all(&refs).unwrap();
    seen.sort();
    assert_eq!(seen, [(vec![0], "0".to_string()), (vec![1], "1".to_string())]);
    let both = gpus_seen::options().num_gpus(2.0).remote(&cluster, 0).unwrap();
    assert_eq!(both.get().unwrap(), (vec![0, 1], "0,1".to_string()));
    let none = gpus_seen::remote(&cluster, 0).unwrap();
    assert_eq!(
        none.get().unwrap(),
        (vec![], String::new()),
        "no GPUs asked, none visible"
    );
    assert!(raylet::gpu_ids().is_empty(), "the driver holds no GPU lease");
    cluster.shutdown().unwrap();
}

#[test]
fn four_half_gpu_tasks_share_two_ids_two_per_id() {
    let cluster = gpu_cluster();
    let refs: Vec<_> = (0..4)
        .map(|_| gpus_seen::options().num_gpus(0.5).remote(&cluster, 1500).unwrap())
        .collect();
    let mut per_id = BTreeMap::new();
    for (ids, visible) in cluster.get_all(&refs).unwrap() {
        assert_eq!(ids.len(), 1, "a fraction of a GPU is on one id");
        assert_eq!(visible, ids[0].to_string());
        *per_id.entry(ids[0]).or_insert(0) += 1;
    }
    assert_eq!(per_id, BTreeMap::from([(0, 2), (1, 2)]));
    cluster.shutdown().unwrap();
}

/// A cluster whose one node finds GPUs through `gpus` (no device needed).
fn cluster_detecting(gpus: Arc<FakeGpus>, cpus: f64) -> Cluster {
    raylet::init_with(Config::new().num_cpus(cpus).gpu_detector(gpus)).unwrap()
}

#[test]
fn eight_detected_gpus_are_offered_reported_and_leased_one_to_each_task() {
    let gpus = Arc::new(FakeGpus::new(8));
    gpus.set_busy(6, 42.0, 3 << 30);
    let cluster = cluster_detecting(gpus.clone(), 8.0);
    let node = wait_for_node(&cluster, |node| node.stats.gpus.len() == 8);
    assert_eq!(node.total.get(GPU), Amount::whole(8), "every detected GPU is offered");
    let six = &node.stats.gpus[6];
    assert_eq!((six.name.as_str(), six.utilization_percent), ("Fake GPU", 42.0));
    assert_eq!(six.memory_used_bytes, 3 << 30);

    let refs: Vec<_> = (0..8)
        .map(|_| gpus_seen::options().num_gpus(1.0).remote(&cluster, 2000).unwrap())
        .collect();
    let mut seen = cluster.get_all(&refs).unwrap();
    seen.sort();
    let expected: Vec<_> = (0..8u32).map(|id| (vec![id], id.to_string())).collect();
    assert_eq!(seen, expected, "eight tasks at once, each sees only its own GPU");
    cluster.shutdown().unwrap();
}

#[test]
fn no_detected_gpu_makes_gpu_work_infeasible_and_one_is_shared_by_halves_and_names_itself_in_failures() {
    let none = cluster_detecting(Arc::new(FakeGpus::new(0)), 2.0);
    let error = gpus_seen::options()
        .num_gpus(1.0)
        .remote(&none, 0)
        .unwrap()
        .get_timeout(Duration::from_secs(10));
    let task = task_error(error.unwrap_err());
    assert_eq!(task.kind, TaskErrorKind::Infeasible, "{}", task.message);
    assert!(task.message.contains("GPU"), "{}", task.message);
    none.shutdown().unwrap();

    let one = cluster_detecting(Arc::new(FakeGpus::new(1)), 2.0);
    let refs: Vec<_> = (0..2)
        .map(|_| gpus_seen::options().num_gpus(0.5).remote(&one, 1500).unwrap())
        .collect();
    let seen = one.get_all(&refs).unwrap();
    assert_eq!(seen, vec![(vec![0], "0".to_string()); 2], "both halves on GPU 0");
    let failed = lose_the_gpu::options().num_gpus(0.5).remote(&one).unwrap().get();
    let task = task_error(failed.unwrap_err());
    assert!(
        task.message.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && task.message.contains("on its node's GPU 0"),
        "a GPU task's failure names its GPU: {}",
        task.message
    );
    one.shutdown().unwrap();
}

#[test]
fn a_node_started_with_cuda_visible_devices_gives_its_workers_those_gpus() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = common::Daemons(temp.path());
    let started = std::process::Command::new(common::RAYLET)
        .args([
            "start",
            "--head",
            "--port",
            "0",
            "--num-cpus",
            "2",
            "--num-gpus",
            "2",
            "--temp-dir",
        ])
        .arg(temp.path())
        .env("CUDA_VISIBLE_DEVICES", "4,6")
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let head = common::head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let refs: Vec<_> = (0..2)
        .map(|_| gpus_seen::options().num_gpus(1.0).remote(&cluster, 1500).unwrap())
        .collect();
    let mut seen = cluster.get_all(&refs).unwrap();
    seen.sort();
    assert_eq!(
        seen,
        [(vec![0], "4".to_string()), (vec![1], "6".to_string())],
        "the node's GPUs 0 and 1 are CUDA's 4 and 6"
    );
    cluster.shutdown().unwrap();
}

/// The cluster's one node once `ready` holds for it, as heartbeats update it.
fn wait_for_node(cluster: &Cluster, ready: impl Fn(&NodeStatus) -> bool) -> NodeStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status().unwrap();
        if let Some(node) = status.alive().find(|node| ready(node)) {
            return node.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node never showed: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn eight_gpus_on_a_cluster_of_two_fail_at_once_naming_gpu_and_the_largest_node() {
    let cluster = gpu_cluster();
    let error = gpus_seen::options()
        .num_gpus(8.0)
        .remote(&cluster, 0)
        .unwrap()
        .get_timeout(Duration::from_secs(10))
        .unwrap_err();
    let task = task_error(error);
    assert_eq!(task.kind, TaskErrorKind::Infeasible);
    assert!(
        task.message.contains("GPU: 8.0") && task.message.contains("the most GPU any node has is 2.0"),
        "{}",
        task.message
    );
    let bad = gpus_seen::options().num_gpus(1.5).remote(&cluster, 0).unwrap_err();
    assert!(bad.to_string().contains("whole number"), "{bad}");
    let listed = wait_for_demand(&cluster, |d| d.infeasible && d.shape.get(GPU) == Amount::whole(8));
    assert!(listed.reason.contains("the most GPU any node has is 2.0"), "{listed:?}");
    cluster.shutdown().unwrap();
}

#[test]
fn work_waiting_for_room_is_listed_as_pending_demand() {
    let cluster = gpu_cluster();
    let busy: Vec<_> = (0..6).map(|_| gpus_seen::remote(&cluster, 3000).unwrap()).collect();
    let pending = wait_for_demand(&cluster, |d| !d.infeasible && d.shape.get(CPU) == Amount::whole(1));
    assert!(pending.count >= 1, "{pending:?}");
    cluster.get_all(&busy).unwrap();
    cluster.shutdown().unwrap();
}

/// The first demand in the cluster's status that `wanted` accepts, once
/// heartbeats have carried it to the head.
fn wait_for_demand(cluster: &Cluster, wanted: impl Fn(&ResourceDemand) -> bool) -> ResourceDemand {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let demands = cluster.status().unwrap().demands();
        if let Some(found) = demands.into_iter().find(|d| wanted(d)) {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the demand never showed in the status"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn spread_puts_tasks_and_actors_on_three_different_nodes() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b", "c"]);
    let all: Vec<u32> = ["a", "b", "c"].iter().map(|zone| nodes.node(zone).1).collect();
    let cluster = nodes.driver();
    let refs: Vec<_> = (0..3)
        .map(|_| {
            node_manager_after::options()
                .scheduling_strategy(SchedulingStrategy::Spread)
                .remote(&cluster, 2000)
                .unwrap()
        })
        .collect();
    let mut used = cluster.get_all(&refs).unwrap();
    used.sort();
    let mut expected = all.clone();
    expected.sort();
    assert_eq!(used, expected, "one task per node");

    let actors: Vec<PlacedHandle> = (0..3)
        .map(|_| {
            Placed::remote(&cluster)
                .scheduling_strategy(SchedulingStrategy::Spread)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut hosts: Vec<u32> = actors.iter().map(|a| a.node_manager().get().unwrap()).collect();
    hosts.sort();
    assert_eq!(hosts, expected, "one actor per node");
    cluster.shutdown().unwrap();
}

#[test]
fn node_affinity_runs_on_its_node_and_a_hard_one_to_a_dead_node_is_a_clear_error() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b", "c"]);
    let (target, target_pid) = nodes.node("c");
    let cluster = nodes.driver();
    let on = |soft: bool| {
        node_manager_after::options()
            .scheduling_strategy(SchedulingStrategy::NodeAffinity { node_id: target, soft })
            .remote(&cluster, 0)
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(on(false).get().unwrap(), target_pid);
    }
    let actor = Placed::remote(&cluster)
        .scheduling_strategy(SchedulingStrategy::NodeAffinity {
            node_id: target,
            soft: false,
        })
        .spawn()
        .unwrap();
    assert_eq!(actor.node_manager().get().unwrap(), target_pid);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(target_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    nodes.wait_for_alive(2);
    std::thread::sleep(Duration::from_millis(300));
    let task = task_error(on(false).get_timeout(Duration::from_secs(10)).unwrap_err());
    assert_eq!(task.kind, TaskErrorKind::Unschedulable);
    assert!(
        task.message.contains(&target.to_string()) && task.message.contains("not alive"),
        "{}",
        task.message
    );
    let elsewhere = on(true).get_timeout(Duration::from_secs(10)).unwrap();
    assert_ne!(elsewhere, target_pid, "a soft affinity falls back to another node");
    cluster.shutdown().unwrap();
}

#[test]
fn label_selectors_choose_the_node_and_an_unmatched_one_fails_naming_the_labels() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b", "c"]);
    let (_, b) = nodes.node("b");
    let (_, c) = nodes.node("c");
    let cluster = nodes.driver();
    let select = |expression: &str| {
        node_manager_after::options()
            .label_selector("zone", expression)
            .remote(&cluster, 0)
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(select("b").get().unwrap(), b);
        assert!([b, c].contains(&select("in(b,c)").get().unwrap()));
    }
    let actor = Placed::remote(&cluster).label_selector("zone", "c").spawn().unwrap();
    assert_eq!(actor.node_manager().get().unwrap(), c);
    let task = task_error(select("z").get_timeout(Duration::from_secs(10)).unwrap_err());
    assert_eq!(task.kind, TaskErrorKind::Infeasible);
    assert!(task.message.contains("zone=z"), "{}", task.message);
    cluster.shutdown().unwrap();
}

#[test]
fn a_task_runs_on_the_node_that_holds_its_largest_argument() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start_with_cpus(temp.path(), &["a", "b"], 4);
    let (_, b) = nodes.node("b");
    let cluster = nodes.driver();
    let block = make_block::options()
        .label_selector("zone", "b")
        .remote(&cluster, 7)
        .unwrap();
    let (ready, _) = cluster.wait(std::slice::from_ref(&block), 1, Some(Duration::from_secs(10)));
    assert_eq!(ready.len(), 1);
    for _ in 0..3 {
        let reader = node_manager_reading::remote(&cluster, &block).unwrap();
        assert_eq!(
            reader.get().unwrap(),
            b,
            "the task goes to the node that stores its argument"
        );
    }
    cluster.shutdown().unwrap();
}

/// Allocates and writes memory 256 MiB at a time up to `limit_mib`, slowly
/// enough for the out-of-memory monitor to see it grow, and keeps it.
fn hog(limit_mib: u64) {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..limit_mib / 256 {
        held.push(vec![1u8; 256 << 20]);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::hint::black_box(&held);
}

/// Hogs memory on its first run only (counted in the file `marker`);
/// returns how many times it ran.
#[raylet::remote(max_retries = 2)]
fn hog_memory_once(marker: String, limit_mib: u64) -> u64 {
    let runs = std::fs::read_to_string(&marker).map_or(0, |t| t.len() as u64) + 1;
    std::fs::write(&marker, "x".repeat(runs as usize)).unwrap();
    if runs == 1 {
        hog(limit_mib);
    }
    runs
}

#[raylet::remote(max_retries = 1)]
fn hog_memory_always(limit_mib: u64) -> u64 {
    hog(limit_mib);
    0
}

/// The machine's memory: (used, total) bytes, from /proc/meminfo.
fn machine_memory() -> (u64, u64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        let line = info.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let total = field("MemTotal:");
    (total - field("MemAvailable:"), total)
}

#[test]
fn a_memory_hog_is_ended_by_the_oom_monitor_and_retried_and_the_node_survives() {
    let (used, total) = machine_memory();
    let headroom = (2u64 << 30).min(total / 10);
    let threshold = (used + headroom) as f64 / total as f64;
    let limit_mib = (headroom + (3 << 30)) >> 20;
    let cluster = raylet::init_with(Config::new().num_cpus(2.0).memory_usage_threshold(threshold)).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let marker = temp.path().join("runs").to_string_lossy().to_string();
    let runs = hog_memory_once::remote(&cluster, marker, limit_mib).unwrap();
    let runs = runs.get_timeout(Duration::from_secs(60)).unwrap();
    assert!(runs >= 2, "ended at least once, then retried: ran {runs} time(s)");

    let error = hog_memory_always::remote(&cluster, limit_mib)
        .unwrap()
        .get_timeout(Duration::from_secs(60))
        .unwrap_err();
    let task = task_error(error);
    assert_eq!(task.kind, TaskErrorKind::OutOfMemory);
    assert!(task.message.contains("out-of-memory monitor"), "{}", task.message);
    assert_eq!(task.attempt, 1, "retried once before failing");
    let after = gpus_seen::remote(&cluster, 0).unwrap();
    assert_eq!(
        after.get_timeout(Duration::from_secs(30)).unwrap().0,
        Vec::<u32>::new(),
        "the node still runs tasks"
    );
    cluster.shutdown().unwrap();
}
