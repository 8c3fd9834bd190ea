//! The autoscaler end to end, on clusters started with `raylet up` and the
//! `local` provider: work no node fits launches a node of the type that
//! fits, a STRICT_SPREAD group launches exactly the nodes it lacks, queued
//! tasks grow the cluster to its cap while `raylet status` says the rest
//! waits on it, idle nodes are drained and removed with their objects
//! still readable while busy ones and min counts are kept, a node type
//! whose nodes cannot start backs off instead of storming, and `raylet
//! down` leaves nothing running.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::{Job, JobStatus};
use serde_json::Value;

use crate::common::http::{metrics_when, session_file, total};
use crate::common::{Daemons, daemon_records, head_address, raylet};

/// The pid of the node manager that runs this task.
#[raylet::remote]
pub fn node_manager_pid() -> u32 {
    std::os::unix::process::parent_id()
}

/// A task of one CPU that takes a moment.
#[raylet::remote]
fn brief(index: u32) -> u32 {
    std::thread::sleep(Duration::from_millis(200));
    index
}

/// A value of `bytes` bytes made where the task runs, so that the node's
/// store holds its only copy.
#[raylet::remote]
fn payload(bytes: usize) -> Vec<u8> {
    vec![7; bytes]
}

#[raylet::actor]
#[derive(Default)]
pub struct Placed;

#[raylet::actor]
impl Placed {
    pub fn new() -> Self {
        Placed
    }

    pub fn node_manager_pid(&self) -> u32 {
        std::os::unix::process::parent_id()
    }
}

/// A cluster started with `raylet up`.
pub struct UpCluster {
    temp: tempfile::TempDir,
    config: PathBuf,
}

impl UpCluster {
    /// Writes `autoscaler` (YAML, under `autoscaler:`) into a config for the
    /// local provider with rounds every half second, and runs `raylet up`.
    pub fn up(head_cpus: u32, autoscaler: &str, binary: Option<&str>) -> Self {
        let binary = binary.map_or(String::new(), |path| format!("\n  binary: {path}"));
        let head_cpus = head_cpus.to_string();
        UpCluster::up_with(
            "test",
            &format!("  type: local{binary}"),
            &["--num-cpus", &head_cpus],
            autoscaler,
        )
    }

    /// `raylet up` of the cluster `name` with `provider` (YAML, under
    /// `provider:`), the head started with `head_args` on free ports, and
    /// rounds every half second. `{temp}` in `provider` is the cluster's
    /// temp dir.
    pub fn up_with(name: &str, provider: &str, head_args: &[&str], autoscaler: &str) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let config = temp.path().join("cluster.yaml");
        let provider = provider.replace("{temp}", &temp.path().to_string_lossy());
        let args: Vec<String> = ["--port", "0", "--dashboard-port", "0"]
            .iter()
            .chain(head_args)
            .map(|arg| format!("{arg:?}"))
            .collect();
        let text = format!(
            "cluster_name: {name}\nprovider:\n{provider}\nhead:\n  args: [{}]\n  interval_s: 0.5\nautoscaler:\n{autoscaler}",
            args.join(", ")
        );
        std::fs::write(&config, text).unwrap();
        raylet(temp.path(), &["up", config.to_str().unwrap()]);
        UpCluster { temp, config }
    }

    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    pub fn driver(&self) -> Cluster {
        let head = head_address(self.path());
        raylet::init_with(Config::new().address(&head).temp_dir(self.path())).unwrap()
    }

    fn status(&self) -> Value {
        serde_json::from_str(&raylet(self.path(), &["status", "--format", "json"])).unwrap()
    }

    /// The autoscaler's report as `raylet status` gives it.
    pub fn report(&self) -> Value {
        self.status()["autoscaler"].clone()
    }

    /// The node types of the managed nodes, sorted.
    pub fn managed_types(&self) -> Vec<String> {
        let report = self.report();
        let mut types: Vec<String> = report["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| n["node_type"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        types.sort();
        types
    }

    /// The node type of the node whose daemon has pid `pid`: `None` for the head.
    pub fn node_type_of_pid(&self, pid: u32) -> Option<String> {
        let record = daemon_records(self.path())
            .into_iter()
            .find(|record| record["pid"] == pid)
            .expect("the pid is one of the cluster's daemons");
        let node_id = record["node_id"].as_str().unwrap().to_string();
        let report = self.report();
        let nodes = report["nodes"].as_array().cloned().unwrap_or_default();
        let managed = nodes.into_iter().find(|node| node["node_id"] == node_id.as_str())?;
        Some(managed["node_type"].as_str().unwrap().to_string())
    }

    /// Runs `count` one-CPU tasks on a head without CPUs and checks that
    /// each ran on a launched node of `node_type`.
    pub fn run_on_launched_nodes(&self, driver: &Cluster, count: usize, node_type: &str, patience: Duration) {
        let pids: Vec<_> = (0..count)
            .map(|_| node_manager_pid::options().num_cpus(1.0).remote(driver).unwrap())
            .collect();
        for pid in &pids {
            let pid = driver.get_timeout(pid, patience).unwrap();
            assert_eq!(self.node_type_of_pid(pid).as_deref(), Some(node_type));
        }
    }

    /// The `autoscaler:` section of one node type, `cpu2` (2 CPUs): at most
    /// `max` nodes, each removed after `idle_timeout_s` idle.
    pub fn cpu2_types(max: u32, idle_timeout_s: u32) -> String {
        format!(
            "  max_nodes: {max}\n  node_types:\n    - {{name: cpu2, resources: {{CPU: 2}}, max_count: {max}, idle_timeout_s: {idle_timeout_s}}}\n"
        )
    }

    pub fn down(&self) -> String {
        raylet(self.path(), &["down", self.config.to_str().unwrap()])
    }
}

/// Waits up to `timeout` for `ready`, polling; fails naming `what`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The objects the report says were copied off drained nodes, added up.
fn copied_objects(events: &str) -> usize {
    let counts = events.split("copied ").skip(1);
    counts
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum()
}

/// Whether no `raylet start` process of this cluster's temp dir runs.
pub fn nothing_runs(temp: &Path) -> bool {
    let temp = temp.to_string_lossy();
    let out = std::process::Command::new("pgrep")
        .args(["-af", "raylet start"])
        .output()
        .unwrap();
    !String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|line| line.contains(temp.as_ref()))
}

const TWO_TYPES: &str = "  max_nodes: 5
  node_types:
    - {name: cpu2, resources: {CPU: 2}, max_count: 3, idle_timeout_s: 600}
    - {name: cpu8, resources: {CPU: 8}, max_count: 1, idle_timeout_s: 600}
";

#[test]
fn an_actor_no_node_fits_launches_its_type_and_a_strict_spread_group_launches_only_the_nodes_it_lacks() {
    let cluster = UpCluster::up(2, TWO_TYPES, None);
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();

    let big = Placed::remote(&driver).num_cpus(8.0).spawn().unwrap();
    let pid = big.node_manager_pid();
    let pid = driver.get_timeout(&pid, Duration::from_secs(60)).unwrap();
    assert_eq!(cluster.node_type_of_pid(pid).as_deref(), Some("cpu8"));
    assert_eq!(cluster.managed_types(), ["cpu8"], "one node, of the type that fits");

    wait_for(Duration::from_secs(10), "the head to see the cpu8 node full", || {
        let status = cluster.status();
        let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
        let cpus = |node: &Value, of: &str| node[of]["CPU"].as_f64().unwrap_or(0.0);
        let full = |node: &Value| cpus(node, "total") == 8.0 && cpus(node, "available") == 0.0;
        nodes.iter().any(full).then_some(())
    });
    let bundles: Vec<Bundle> = (0..4).map(|_| Bundle::new().num_cpus(1.0)).collect();
    let group = driver
        .placement_group(bundles, PlacementStrategy::StrictSpread)
        .unwrap();
    group.ready_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(
        cluster.managed_types(),
        ["cpu2", "cpu2", "cpu2", "cpu8"],
        "the head holds one bundle, the full cpu8 node none: three cpu2 nodes hold the rest"
    );
    let events = cluster.report()["events"].to_string();
    assert!(events.contains("launching 3 node(s) of type 'cpu2'"), "{events}");
    let dashboard = session_file(cluster.path(), "dashboard_address");
    let token = session_file(cluster.path(), "token");
    let counted = metrics_when(&dashboard, &token, |samples| {
        total(samples, "raylet_autoscaler_launches_total") == 4.0
    });
    assert_eq!(
        total(&counted, "raylet_autoscaler_nodes"),
        4.0,
        "the head's /metrics counts the launches and the nodes: {counted:#?}"
    );

    drop(driver);
    let said = cluster.down();
    assert!(said.contains("is down"), "{said}");
    wait_for(Duration::from_secs(30), "every node to stop", || {
        nothing_runs(cluster.path()).then_some(())
    });
}

#[test]
fn queued_tasks_grow_the_cluster_to_its_cap_say_the_rest_waits_and_all_finish() {
    let cluster = UpCluster::up(
        1,
        "  max_nodes: 3
  node_types:
    - {name: cpu2, resources: {CPU: 2}, max_count: 3, idle_timeout_s: 600}
",
        None,
    );
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    let tasks: Vec<_> = (0..200).map(|i| brief::remote(&driver, i).unwrap()).collect();
    let waiting = wait_for(Duration::from_secs(60), "the cluster to reach its cap", || {
        let report = cluster.report();
        let capped = report["nodes"].as_array().is_some_and(|nodes| nodes.len() == 3);
        let waiting = report["waiting"].to_string();
        (capped && waiting.contains("the cluster is at max_nodes")).then_some(waiting)
    });
    assert!(waiting.contains("x {CPU: 1} wait"), "{waiting}");
    let results: Vec<u32> = tasks
        .iter()
        .map(|task| driver.get_timeout(task, Duration::from_secs(120)).unwrap())
        .collect();
    assert_eq!(results, (0..200).collect::<Vec<u32>>());
    assert_eq!(
        cluster.managed_types(),
        ["cpu2", "cpu2", "cpu2"],
        "never beyond the cap"
    );
    drop(driver);
    cluster.down();
}

#[test]
fn idle_nodes_are_drained_and_removed_with_their_objects_readable_while_busy_nodes_and_min_counts_stay() {
    let cluster = UpCluster::up(
        0,
        "  max_nodes: 4
  node_types:
    - {name: cpu1, resources: {CPU: 1}, min_count: 1, max_count: 4, idle_timeout_s: 3}
",
        None,
    );
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    let node_of = |actor: &PlacedHandle| {
        let pid = actor.node_manager_pid();
        driver.get_timeout(&pid, Duration::from_secs(60)).unwrap()
    };
    let (kept, released) = (
        Placed::remote(&driver).num_cpus(1.0).spawn().unwrap(),
        Placed::remote(&driver).num_cpus(1.0).spawn().unwrap(),
    );
    let (kept_pid, released_pid) = (node_of(&kept), node_of(&released));
    let objects: Vec<_> = (0..2)
        .map(|_| payload::options().num_cpus(1.0).remote(&driver, 1 << 20).unwrap())
        .collect();
    let (ready, _) = driver.wait(&objects, 2, Some(Duration::from_secs(60)));
    assert_eq!(ready.len(), 2, "the payloads are made");

    let events = wait_for(Duration::from_secs(60), "the idle nodes to be removed", || {
        let report = cluster.report();
        let nodes = report["nodes"].as_array().cloned().unwrap_or_default();
        (nodes.len() == 2).then(|| report["events"].to_string())
    });
    assert!(
        events.contains("draining node") && events.contains("removing node"),
        "drained, then removed: {events}"
    );
    let alive: Vec<Value> = daemon_records(cluster.path());
    for pid in [kept_pid, released_pid] {
        assert!(alive.iter().any(|r| r["pid"] == pid), "busy nodes stay: {alive:?}");
    }
    assert!(copied_objects(&events) >= 2, "the payloads were copied off: {events}");
    for object in &objects {
        let value = driver.get_timeout(object, Duration::from_secs(30)).unwrap();
        assert_eq!(value.len(), 1 << 20, "readable after its node is gone");
    }
    let after = cluster.report()["events"].to_string();
    assert_eq!(
        after.matches("launching").count(),
        events.matches("launching").count(),
        "read from their copies, not made again on a new node: {after}"
    );

    driver.kill(&released, true).unwrap();
    wait_for(Duration::from_secs(60), "the released node to be removed", || {
        (cluster.managed_types().len() == 1).then_some(())
    });
    driver.kill(&kept, true).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(cluster.managed_types(), ["cpu1"], "min_count keeps one idle node");
    drop(driver);
    cluster.down();
}

#[test]
fn a_node_type_whose_nodes_cannot_start_is_reported_and_backs_off_without_a_launch_storm() {
    let cluster = UpCluster::up(
        1,
        "  max_nodes: 4
  node_types:
    - {name: cpu4, resources: {CPU: 4}, max_count: 4, idle_timeout_s: 600}
",
        Some("/bin/false"),
    );
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    let _waiting = Placed::remote(&driver).num_cpus(4.0).spawn().unwrap();
    let backing_off = wait_for(Duration::from_secs(30), "the type to back off", || {
        let report = cluster.report();
        let backing_off = report["backing_off"].to_string();
        backing_off.contains("cpu4").then_some(backing_off)
    });
    assert!(backing_off.contains("failed launches"), "{backing_off}");
    std::thread::sleep(Duration::from_secs(12));
    let events = cluster.report()["events"].to_string();
    let launches = events.matches("launching 1 node(s) of type 'cpu4'").count();
    let failures = events.matches("failed: exit status: 1").count();
    assert!(failures >= 1, "each failure is reported with its reason: {events}");
    assert!(
        (1..=3).contains(&launches),
        "after 12 s of backoff (5 s, then 10 s), at most 3 launches: {launches} in {events}"
    );
    let text = raylet(cluster.path(), &["status"]);
    assert!(text.contains("Backing off:"), "{text}");
    drop(driver);
    cluster.down();
}

#[test]
fn a_job_whose_driver_only_a_node_type_fits_launches_that_node_and_runs_there() {
    let cluster = UpCluster::up(0, &UpCluster::cpu2_types(1, 600), None);
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    let job = Job::new("/bin/echo").args(["the driver ran"]).num_cpus(2.0);
    let handle = driver.submit(job).unwrap();
    let info = handle.wait().unwrap();
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");
    assert!(handle.logs().unwrap().contains("the driver ran"));
    assert_eq!(cluster.managed_types(), ["cpu2"]);
    let events = cluster.report()["events"].to_string();
    assert!(
        events.contains("launching 1 node(s) of type 'cpu2': 1 x {CPU: 2} wait"),
        "{events}"
    );
    drop(driver);
    cluster.down();
}
