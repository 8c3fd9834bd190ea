//! A head killed with SIGKILL and started again with `raylet start --head
//! --recover` on clusters of `raylet start` daemons: this test binary is
//! also the job, run on the cluster with the name of its ignored `driver_*`
//! test as the argument. The job's driver and tasks carry on while the head
//! is down, the restarted head knows the job and its nodes (same
//! incarnations), attaches to the driver again and records every line it
//! printed, and the job succeeds; `wait()`, `follow_logs()` and `raylet job
//! logs --follow` begun before the kill wait out the restart; the head's
//! own node, a daemon of its own, outlives the head. A head started with
//! default settings (with CPUs) runs the job's driver and the actors on its
//! own machine's node, and they carry on through its SIGKILL. Creating an actor, looking one up
//! by name and reading the key-value store while the head is down wait
//! for it to come back, and the store's entries survive the restart.
//! Actors and placement groups outlive the restart: an actor's worker keeps
//! running and answering calls while the head is down, the restarted head
//! adopts it (same process, same state) and still restarts it when it
//! dies, finds it by name, and places new actors in a group made before. A
//! worker no restarted head adopts in time is killed by its node, and the
//! actors of an owner that died while the head was down die too.
//! Every write the head acknowledges is on disk before the answer: under a
//! load of large key-value writes that keeps the head's state writer busy,
//! a head killed right after each kind of acknowledged write (a key-value
//! put and delete, a binary's upload, a job's submission, an actor's and a
//! placement group's creation) and started again has it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::{ActorState, Cluster, Job, JobStatus, PlacementGroupState};

use crate::common;

use common::{Daemons, daemon_pids, kill_head, raylet};

const PATIENCE: Duration = Duration::from_secs(60);
const TICKS: u32 = 40;
/// Heartbeats every 100 ms; a node silent for 3 s is dead.
const FAST: [&str; 4] = ["--heartbeat-interval", "100ms", "--heartbeat-timeout", "3s"];

#[raylet::remote]
fn square(x: u32) -> u32 {
    x * x
}

#[test]
#[ignore = "a job driver: `a_head_killed_mid_job...` runs it on the cluster"]
fn driver_ticks() {
    let cluster = raylet::init().unwrap();
    for tick in 0..TICKS {
        let squared = square::remote(&cluster, tick).unwrap().get().unwrap();
        println!("tick {tick} squared {squared}");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("all ticks done");
}

/// Starts a head without CPUs (drivers and tasks run on the nodes) and two
/// nodes of 2 CPUs; returns the head's address once both nodes are alive.
fn start_cluster(temp: &Path) -> String {
    start_cluster_with(temp, &[])
}

/// [`start_cluster`], with more flags for the two nodes.
fn start_cluster_with(temp: &Path, node_flags: &[&str]) -> String {
    raylet(
        temp,
        &[&["start", "--head", "--port", "0", "--num-cpus", "0"][..], &FAST].concat(),
    );
    let head = common::head_address(temp);
    for _ in 0..2 {
        raylet(
            temp,
            &[&["start", "--address", &head, "--num-cpus", "2"][..], &FAST, node_flags].concat(),
        );
    }
    let deadline = Instant::now() + PATIENCE;
    while alive_workers(temp).len() < 2 {
        assert!(Instant::now() < deadline, "the nodes join");
        std::thread::sleep(Duration::from_millis(50));
    }
    head
}

/// The alive worker nodes (those with CPUs) as `raylet status` lists them:
/// id and incarnation.
fn alive_workers(temp: &Path) -> Vec<(String, u64)> {
    let status: serde_json::Value = serde_json::from_str(&raylet(temp, &["status", "--format", "json"])).unwrap();
    let mut nodes: Vec<(String, u64)> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "ALIVE" && !node["is_head_node"].as_bool().unwrap())
        .map(|node| {
            let id = node["node_id"].as_str().unwrap().to_string();
            (id, node["incarnation"].as_u64().unwrap())
        })
        .collect();
    nodes.sort();
    nodes
}

#[test]
fn a_head_killed_mid_job_recovers_its_nodes_and_jobs_and_the_job_completes() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_cluster(temp.path());
    let deadline = Instant::now() + PATIENCE;
    let workers = alive_workers(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let job = Job::new(std::env::current_exe().unwrap())
        .args(["head_restart::driver_ticks", "--exact", "--ignored", "--nocapture"])
        .num_cpus(1.0);
    let handle = cluster.submit(job).unwrap();
    let id = handle.id();
    while !handle.logs().unwrap().contains("tick 5 ") {
        assert!(Instant::now() < deadline, "the job ticks: {:?}", handle.status());
        std::thread::sleep(Duration::from_millis(50));
    }

    let waiter = {
        let handle = handle.clone();
        std::thread::spawn(move || handle.wait())
    };
    let follower = {
        let handle = handle.clone();
        std::thread::spawn(move || handle.follow_logs().collect::<Result<Vec<Vec<u8>>, _>>())
    };
    let cli_follower = std::process::Command::new(common::RAYLET)
        .args(["job", "logs", "--follow", &id.to_string(), "--temp-dir"])
        .arg(temp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    kill_head(temp.path());
    std::thread::sleep(Duration::from_secs(1));
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );

    let printed = raylet(temp.path(), &["job", "status", &id.to_string()]);
    assert!(
        printed.contains(&id.to_string()),
        "the restarted head knows the job:\n{printed}"
    );
    let done = waiter.join().unwrap().expect("wait() waits out the restart");
    let logs = cluster.job(id).unwrap().logs().unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}\n{logs}");
    let followed = follower
        .join()
        .unwrap()
        .expect("follow_logs() waits out the restart")
        .concat();
    assert_eq!(
        String::from_utf8_lossy(&followed),
        logs,
        "the followed output goes on where it was"
    );
    let printed = cli_follower.wait_with_output().unwrap();
    assert!(printed.status.success(), "raylet job logs --follow: {printed:?}");
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        logs,
        "`raylet job logs --follow` goes on where it was"
    );
    let lines: Vec<&str> = logs.lines().filter(|line| line.starts_with("tick ")).collect();
    let expected: Vec<String> = (0..TICKS).map(|t| format!("tick {t} squared {}", t * t)).collect();
    assert_eq!(lines, expected, "every line, once and in order:\n{logs}");
    assert!(logs.contains("all ticks done"), "{logs}");
    assert_eq!(
        alive_workers(temp.path()),
        workers,
        "the nodes carried on as the same incarnations"
    );
    let (_, incarnation, state) = the_head_node(temp.path());
    assert_eq!(
        (incarnation, state.as_str()),
        (1, "ALIVE"),
        "the head's own node, a daemon of its own, outlived the head"
    );
    cluster.shutdown().unwrap();
}

#[raylet::actor]
#[derive(Default)]
pub struct Greeter;

#[raylet::actor]
impl Greeter {
    pub fn new() -> Self {
        Greeter
    }

    pub fn greet(&self, who: String) -> String {
        format!("hello {who}")
    }
}

#[test]
fn actor_and_kv_calls_wait_while_the_head_restarts_and_the_kv_store_survives_it() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_cluster(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let before = Greeter::remote(&cluster).name("before").spawn().unwrap();
    assert_eq!(before.greet("owner".to_string()).get().unwrap(), "hello owner");
    cluster.kv_put("rendezvous/leader", "10.0.0.7:29500").unwrap();
    assert!(cluster.kv_put_if_absent("rendezvous/epoch", "1").unwrap());
    assert!(
        !cluster.kv_put_if_absent("rendezvous/epoch", "2").unwrap(),
        "the first value stays"
    );
    cluster.kv_put("scratch", "x").unwrap();
    assert!(cluster.kv_delete("scratch").unwrap());
    let library = cluster.kv_namespace("_library");
    library.put("rendezvous/leader", "elsewhere").unwrap();
    assert_eq!(
        library.keys("").unwrap(),
        [&b"rendezvous/leader"[..]],
        "namespaces are apart"
    );

    kill_head(temp.path());
    let reading = {
        let cluster = cluster.clone();
        std::thread::spawn(move || cluster.kv_get("rendezvous/leader"))
    };
    let creating = {
        let cluster = cluster.clone();
        std::thread::spawn(move || {
            let greeter = Greeter::remote(&cluster).name("after").spawn()?;
            greeter.greet("again".to_string()).get()
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    assert!(!creating.is_finished(), "the creation waits for the head");
    assert!(!reading.is_finished(), "the read waits for the head");
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );

    let leader = reading.join().unwrap().expect("the read waits for the head");
    assert_eq!(
        leader.as_deref(),
        Some(&b"10.0.0.7:29500"[..]),
        "the value survived the restart"
    );
    let keys = cluster.kv_keys("rendezvous/").unwrap();
    assert_eq!(keys, [&b"rendezvous/epoch"[..], &b"rendezvous/leader"[..]]);
    assert_eq!(cluster.kv_get("rendezvous/epoch").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(cluster.kv_get("scratch").unwrap(), None, "a deleted key stays deleted");
    assert_eq!(
        library.get("rendezvous/leader").unwrap().as_deref(),
        Some(&b"elsewhere"[..])
    );
    let greeted = creating.join().unwrap();
    assert_eq!(
        greeted.expect("the actor is created once the head is back"),
        "hello again"
    );
    let found = cluster.get_actor::<Greeter>("after").unwrap();
    assert_eq!(found.greet("by name".to_string()).get().unwrap(), "hello by name");
    cluster.kill(&found, true).unwrap();
    cluster.shutdown().unwrap();
}

#[raylet::actor]
#[derive(Default)]
pub struct Tally {
    count: u64,
}

#[raylet::actor]
impl Tally {
    pub fn new() -> Self {
        Tally::default()
    }

    /// Adds `by`; returns the count and the process that hosts the tally.
    pub fn add(&mut self, by: u64) -> (u64, u32) {
        self.count += by;
        (self.count, std::process::id())
    }
}

#[test]
fn actors_and_placement_groups_outlive_a_head_restart() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_cluster(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let owned = Tally::remote(&cluster).max_restarts(1).spawn().unwrap();
    let named = Tally::remote(&cluster).name("kept").detached().spawn().unwrap();
    let group = cluster
        .placement_group(
            vec![Bundle::new().num_cpus(1.0), Bundle::new().num_cpus(1.0)],
            PlacementStrategy::Spread,
        )
        .unwrap();
    group.ready().unwrap();
    let (count, pid) = owned.add(1).get().unwrap();
    assert_eq!(count, 1);
    assert_eq!(named.add(10).get().unwrap().0, 10);

    kill_head(temp.path());
    assert_eq!(
        owned.add(1).get().unwrap(),
        (2, pid),
        "the actor answers while the head is down"
    );
    let creating_in_group = {
        let (cluster, group) = (cluster.clone(), group.clone());
        std::thread::spawn(move || {
            let placed = Tally::remote(&cluster).placement_group(&group, Some(1)).spawn()?;
            placed.add(5).get()
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );

    assert_eq!(
        owned.add(1).get().unwrap(),
        (3, pid),
        "the restarted head adopted the same worker, state and all"
    );
    let found = cluster.get_actor::<Tally>("kept").unwrap();
    assert_eq!(found.add(1).get().unwrap().0, 11, "found by name, state kept");
    let placed = creating_in_group.join().unwrap();
    assert_eq!(placed.expect("an actor is placed in a group made before").0, 5);
    let listed = cluster.list_actors().unwrap();
    let owned_info = listed.iter().find(|info| info.id == owned.id()).unwrap();
    assert_eq!(
        (owned_info.state, owned_info.pid, owned_info.restarts),
        (ActorState::Alive, pid, 0),
        "{owned_info:?}"
    );
    let groups = cluster.list_placement_groups().unwrap();
    let info = groups.iter().find(|info| info.id == group.id()).unwrap();
    assert_eq!(info.state, PlacementGroupState::Created, "{info:?}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let restarted = loop {
        if let Ok(answer) = owned.add(1).get() {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "the adopted actor restarts when its worker dies"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(restarted.0, 1, "a restarted actor starts afresh");
    assert_ne!(restarted.1, pid);
    group.remove().unwrap();
    cluster.kill(&found, true).unwrap();
    cluster.shutdown().unwrap();
}

/// Issue 47, item 7: a head started with default settings has CPUs, and its
/// machine's node manager runs the job's driver and the actors. That node is
/// a daemon of its own: the head's SIGKILL leaves the driver and the actors'
/// workers running, and the head started again (default settings too) goes
/// on with them as the same incarnation of the same node.
#[test]
fn a_head_with_cpus_killed_mid_job_leaves_the_job_and_actors_on_its_machine_running() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(
        temp.path(),
        &[&["start", "--head", "--port", "0", "--dashboard-port", "0"][..], &FAST].concat(),
    );
    let head = common::head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let head_node = the_head_node(temp.path());
    assert_eq!(head_node.2, "ALIVE");
    let job = Job::new(std::env::current_exe().unwrap())
        .args(["head_restart::driver_ticks", "--exact", "--ignored", "--nocapture"])
        .num_cpus(1.0);
    let handle = cluster.submit(job).unwrap();
    let owned = Tally::remote(&cluster).max_restarts(1).spawn().unwrap();
    let named = Tally::remote(&cluster).name("kept").detached().spawn().unwrap();
    let (_, owned_pid) = owned.add(1).get().unwrap();
    let (_, named_pid) = named.add(10).get().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !handle.logs().unwrap().contains("tick 5 ") {
        assert!(Instant::now() < deadline, "the job ticks: {:?}", handle.status());
        std::thread::sleep(Duration::from_millis(50));
    }

    kill_head(temp.path());
    assert_eq!(
        owned.add(1).get().unwrap(),
        (2, owned_pid),
        "the actor answers while the head is down"
    );
    std::thread::sleep(Duration::from_secs(1));
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--dashboard-port", "0"][..], &FAST].concat(),
    );

    let done = handle.wait().expect("wait() waits out the restart");
    let logs = handle.logs().unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}\n{logs}");
    let lines: Vec<&str> = logs.lines().filter(|line| line.starts_with("tick ")).collect();
    let expected: Vec<String> = (0..TICKS).map(|t| format!("tick {t} squared {}", t * t)).collect();
    assert_eq!(lines, expected, "every line, once and in order:\n{logs}");
    assert_eq!(owned.add(1).get().unwrap(), (3, owned_pid), "adopted, state and all");
    let found = cluster.get_actor::<Tally>("kept").unwrap();
    assert_eq!(
        found.add(1).get().unwrap(),
        (11, named_pid),
        "found by name, same worker"
    );
    assert_eq!(
        the_head_node(temp.path()),
        head_node,
        "the head's machine's node carried on as the same incarnation"
    );
    println!(
        "job {} SUCCEEDED on the head's node {head_node:?}; actors kept pids {owned_pid} and {named_pid}",
        handle.id()
    );
    cluster.kill(&found, true).unwrap();
    cluster.shutdown().unwrap();
}

/// The head's machine's node as `raylet status` lists it: id, incarnation
/// and state; there must be exactly one.
fn the_head_node(temp: &Path) -> (String, u64, String) {
    let status: serde_json::Value = serde_json::from_str(&raylet(temp, &["status", "--format", "json"])).unwrap();
    let nodes: Vec<(String, u64, String)> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["is_head_node"].as_bool().unwrap())
        .map(|node| {
            (
                node["node_id"].as_str().unwrap().to_string(),
                node["incarnation"].as_u64().unwrap(),
                node["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let [node] = &nodes[..] else {
        panic!("one head node: {nodes:?}");
    };
    node.clone()
}

#[test]
fn an_actor_whose_worker_was_not_adopted_in_time_restarts_once_the_head_is_back() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_cluster_with(temp.path(), &["--actor-adoption-grace", "1s"]);
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let tally = Tally::remote(&cluster).max_restarts(1).spawn().unwrap();
    let (_, pid) = tally.add(1).get().unwrap();

    kill_head(temp.path());
    let worker = nix::unistd::Pid::from_raw(pid as i32);
    let deadline = Instant::now() + PATIENCE;
    while nix::sys::signal::kill(worker, None).is_ok() {
        assert!(Instant::now() < deadline, "the node kills the worker nobody adopted");
        std::thread::sleep(Duration::from_millis(50));
    }
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );

    let restarted = loop {
        if let Ok(answer) = tally.add(1).get() {
            break answer;
        }
        assert!(Instant::now() < deadline, "the actor restarts once the head is back");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(restarted.0, 1, "a restarted actor starts afresh");
    let listed = cluster.list_actors().unwrap();
    let info = listed.iter().find(|info| info.id == tally.id()).unwrap();
    assert_eq!((info.state, info.restarts), (ActorState::Alive, 1), "{info:?}");
    assert!(
        info.death_cause.contains("was not adopted within 1s"),
        "the restart says why: {}",
        info.death_cause
    );
    cluster.shutdown().unwrap();
}

#[test]
#[ignore = "an owner: `the_actors_of_an_owner_that_died...` runs it"]
fn owner_of_a_tally() {
    let cluster = raylet::init().unwrap();
    let tally = Tally::remote(&cluster).name("orphan").spawn().unwrap();
    tally.add(1).get().unwrap();
    println!("owner ready");
    std::thread::sleep(PATIENCE);
}

#[test]
fn the_actors_of_an_owner_that_died_while_the_head_was_down_die_once_it_is_back() {
    use std::io::BufRead;
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let head = start_cluster(temp.path());
    let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["head_restart::owner_of_a_tally", "--exact", "--ignored", "--nocapture"])
        .env("RAYLET_ADDRESS", &head)
        .env("RAYLET_TEMP_DIR", temp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|line| line.unwrap().contains("owner ready")),
        "the owner made its actor"
    );
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let orphan = cluster.get_actor::<Tally>("orphan").unwrap();

    kill_head(temp.path());
    owner.kill().unwrap();
    owner.wait().unwrap();
    raylet(
        temp.path(),
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );

    let deadline = Instant::now() + PATIENCE;
    let info = loop {
        let listed = cluster.list_actors().unwrap();
        let info = listed.into_iter().find(|info| info.id == orphan.id()).unwrap();
        if info.state == ActorState::Dead {
            break info;
        }
        assert!(Instant::now() < deadline, "the orphan dies: {info:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        info.death_cause.contains("did not come back after the head restarted"),
        "{}",
        info.death_cause
    );
    assert!(cluster.get_actor::<Tally>("orphan").is_err(), "its name is free again");
    cluster.shutdown().unwrap();
}

/// The size of each value [`WriteLoad`] writes: large enough that the
/// head's state writer spends a while on every commit.
const LOAD_VALUE_BYTES: usize = 12 << 20;

/// Threads that write large key-value entries over and over, each waiting
/// for its answer, so that the head's state writer is busy whenever another
/// write comes; they stop when dropped.
struct WriteLoad {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl WriteLoad {
    fn start(cluster: &Cluster, threads: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let threads = (0..threads)
            .map(|thread| {
                let (cluster, stop, written) = (cluster.clone(), stop.clone(), written.clone());
                std::thread::spawn(move || {
                    let value = vec![thread as u8; LOAD_VALUE_BYTES];
                    let key = format!("load/{thread}");
                    while !stop.load(Ordering::Relaxed) {
                        match cluster.kv_put(&key, &value) {
                            Ok(()) => {
                                written.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(50)),
                        }
                    }
                })
            })
            .collect();
        WriteLoad { stop, written, threads }
    }

    /// Waits until the head acknowledged a few more large writes: the load
    /// runs against the head as it is now.
    fn wait_running(&self) {
        let deadline = Instant::now() + PATIENCE;
        let from = self.written.load(Ordering::Relaxed);
        while self.written.load(Ordering::Relaxed) < from + 3 {
            assert!(Instant::now() < deadline, "the write load runs");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for WriteLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Does `write`, kills the head with SIGKILL as soon as it returns (its
/// pid is read before), waits until the head is gone and starts it again
/// with `--recover`; returns what `write` returned.
fn kill_head_right_after<T>(temp: &Path, write: impl FnOnce() -> T) -> T {
    let [head_pid] = daemon_pids(temp, "head")[..] else {
        panic!("one head runs");
    };
    let head = nix::unistd::Pid::from_raw(head_pid as i32);
    let written = write();
    nix::sys::signal::kill(head, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while nix::sys::signal::kill(head, None).is_ok() {
        assert!(Instant::now() < deadline, "the killed head goes");
        std::thread::sleep(Duration::from_millis(10));
    }
    raylet(
        temp,
        &[&["start", "--head", "--recover", "--num-cpus", "0"][..], &FAST].concat(),
    );
    written
}

/// A gRPC channel to the head, with the session's token.
async fn head_channel(temp: &Path) -> raylet_proto::channel::AuthedChannel {
    let text = std::fs::read_to_string(temp.join("session_latest/token")).unwrap();
    let token = raylet_common::auth::AuthToken::parse(text.trim()).unwrap();
    raylet_proto::channel::connect(&common::head_address(temp), &token, PATIENCE)
        .await
        .unwrap()
}

/// Uploads `data` as a blob; returns its build hash once the head answered.
async fn upload_blob(temp: &Path, data: &[u8]) -> String {
    use raylet_proto::v1::BlobChunk;
    use raylet_proto::v1::job_service_client::JobServiceClient;
    let file = temp.join("uploaded.bin");
    std::fs::write(&file, data).unwrap();
    let chunk = BlobChunk {
        blob: Some(raylet_proto::blob::blob_of_file(&file).unwrap()),
        data: data.to_vec().into(),
    };
    let mut jobs = JobServiceClient::new(head_channel(temp).await);
    let reply = jobs.upload_blob(tokio_stream::iter([chunk])).await.unwrap();
    assert_eq!(reply.into_inner().bytes_stored, data.len() as u64, "a new blob");
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data))
}

/// The binary whose build hash is `build_hash`, as the head serves it to
/// the nodes that start workers from it.
async fn fetch_by_build_hash(temp: &Path, build_hash: &str) -> Result<Vec<u8>, tonic::Status> {
    use raylet_proto::v1::fetch_blob_request::By;
    use raylet_proto::v1::job_service_client::JobServiceClient;
    let mut jobs = JobServiceClient::new(head_channel(temp).await);
    let request = raylet_proto::v1::FetchBlobRequest {
        by: Some(By::BuildHash(build_hash.to_string())),
    };
    let mut chunks = jobs.fetch_blob(request).await?.into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.message().await? {
        data.extend_from_slice(&chunk.data);
    }
    Ok(data)
}

/// Creates a placement group of one bundle; returns its id once the head
/// answered the creation.
async fn create_group(temp: &Path) -> raylet_proto::PlacementGroupId {
    use raylet_proto::v1::placement_group_answer::Kind as AnswerKind;
    use raylet_proto::v1::placement_group_call::Kind as CallKind;
    use raylet_proto::v1::placement_group_service_client::PlacementGroupServiceClient;
    use raylet_proto::v1::{CreatePlacementGroupRequest, PlacementGroupCall, PlacementStrategy};
    let id = raylet_proto::PlacementGroupId::random();
    let bundle = raylet_proto::ResourceSet::new().with("acked", raylet_proto::Amount::whole(1));
    let call = PlacementGroupCall {
        call_id: 1,
        kind: Some(CallKind::Create(CreatePlacementGroupRequest {
            placement_group_id: id.as_bytes().to_vec(),
            name: String::new(),
            bundles: vec![bundle.to_proto()],
            strategy: PlacementStrategy::Pack as i32,
        })),
    };
    let (calls, queued) = tokio::sync::mpsc::channel(1);
    calls.send(call).await.unwrap();
    let mut groups = PlacementGroupServiceClient::new(head_channel(temp).await);
    let mut answers = groups
        .placement_group_session(tokio_stream::wrappers::ReceiverStream::new(queued))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().expect("an answer");
    assert!(matches!(answer.kind, Some(AnswerKind::Record(_))), "{answer:?}");
    drop(calls);
    id
}

#[test]
fn every_acknowledged_write_survives_a_head_killed_right_after_it_under_write_load() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(
        temp.path(),
        &[&["start", "--head", "--port", "0", "--num-cpus", "0"][..], &FAST].concat(),
    );
    let head = common::head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    cluster.kv_put("acked/deleted", "soon gone").unwrap();
    let load = WriteLoad::start(&cluster, 6);
    let mut lost = Vec::new();

    load.wait_running();
    kill_head_right_after(temp.path(), || cluster.kv_put("acked/put", "kept").unwrap());
    if cluster.kv_get("acked/put").unwrap().as_deref() != Some(&b"kept"[..]) {
        lost.push("a key-value put");
    }

    load.wait_running();
    let deleted = kill_head_right_after(temp.path(), || cluster.kv_delete("acked/deleted").unwrap());
    assert!(deleted);
    if cluster.kv_get("acked/deleted").unwrap().is_some() {
        lost.push("a key-value delete");
    }

    load.wait_running();
    let binary: Vec<u8> = (0..64 << 10).map(|_| rand::random::<u8>()).collect();
    let build_hash = kill_head_right_after(temp.path(), || runtime.block_on(upload_blob(temp.path(), &binary)));
    match runtime.block_on(fetch_by_build_hash(temp.path(), &build_hash)) {
        Ok(fetched) => assert!(fetched == binary, "the binary comes back whole"),
        Err(status) => {
            eprintln!("the uploaded binary after the restart: {status}");
            lost.push("a binary's upload (its build hash index)");
        }
    }

    load.wait_running();
    let job = kill_head_right_after(temp.path(), || cluster.submit(Job::new("/bin/true")).unwrap().id());
    if !cluster.jobs().unwrap().iter().any(|info| info.id == job) {
        lost.push("a job's submission");
    }

    load.wait_running();
    let actor = kill_head_right_after(temp.path(), || {
        Greeter::remote(&cluster).name("acked").detached().spawn().unwrap()
    });
    if !cluster.list_actors().unwrap().iter().any(|info| info.id == actor.id()) {
        lost.push("an actor's creation");
    }

    load.wait_running();
    let group = kill_head_right_after(temp.path(), || runtime.block_on(create_group(temp.path())));
    if !cluster
        .list_placement_groups()
        .unwrap()
        .iter()
        .any(|info| info.id == group)
    {
        lost.push("a placement group's creation");
    }

    drop(load);
    assert!(
        lost.is_empty(),
        "acknowledged, then lost when the head was killed right after: {lost:?}"
    );
    cluster.shutdown().unwrap();
}
