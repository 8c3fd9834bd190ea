//! Actors on real worker processes of the embedded cluster: order of calls,
//! state, handles passed to tasks, named lookup, restarts after `kill -9`,
//! `ActorDied`, failing constructors, concurrency of async actors, an async
//! actor awaiting another, and `cluster.kill` (also of an actor that still
//! waits for room).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use raylet::prelude::*;
use raylet::{ActorInfo, ActorState, Error};

#[raylet::actor]
pub struct Counter {
    count: u64,
}

#[raylet::actor]
impl Counter {
    pub fn new(start: u64) -> Self {
        Counter { count: start }
    }

    pub fn incr(&mut self, by: u64) -> u64 {
        self.count += by;
        self.count
    }

    pub fn get(&self) -> u64 {
        self.count
    }

    pub fn pid(&self) -> u32 {
        std::process::id()
    }

    /// As `incr`, with bytes that only make the call large.
    pub fn incr_carrying(&mut self, by: u64, _bytes: Vec<u8>) -> u64 {
        self.incr(by)
    }
}

#[raylet::actor]
#[derive(Default)]
pub struct Recorder {
    seen: Vec<u64>,
}

#[raylet::actor]
impl Recorder {
    pub fn new() -> Self {
        Recorder::default()
    }

    /// Records `value`; returns how many values came before it.
    pub fn push(&mut self, value: u64) -> usize {
        self.seen.push(value);
        self.seen.len() - 1
    }

    pub fn seen(&self) -> Vec<u64> {
        self.seen.clone()
    }
}

#[raylet::actor]
pub struct Faulty;

#[raylet::actor]
impl Faulty {
    pub fn new(config: String) -> Result<Self, String> {
        Err(format!("cannot read config {config}"))
    }

    pub fn ping(&self) -> u8 {
        1
    }
}

#[raylet::actor]
#[derive(Default)]
pub struct Sleeper {
    running: AtomicUsize,
    peak: AtomicUsize,
}

#[raylet::actor]
impl Sleeper {
    pub fn new() -> Self {
        Sleeper::default()
    }

    /// Sleeps while counting how many naps run at once.
    pub async fn nap(&self, ms: u64) -> u64 {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        ms
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Calls another actor and awaits its answer.
    pub async fn incr_elsewhere(&self, counter: CounterHandle, by: u64) -> u64 {
        counter.incr(by).get_async().await.expect("the other actor answers")
    }
}

#[raylet::actor]
#[derive(Default)]
pub struct BlockingSleeper {
    running: AtomicUsize,
    peak: AtomicUsize,
}

#[raylet::actor]
impl BlockingSleeper {
    pub fn new() -> Self {
        BlockingSleeper::default()
    }

    /// Blocks its thread while counting how many naps run at once.
    pub fn nap(&self, ms: u64) -> u64 {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(ms));
        self.running.fetch_sub(1, Ordering::SeqCst);
        ms
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// Calls the actor through a handle that came in as an argument.
#[raylet::remote]
fn incr_through(counter: CounterHandle, by: u64) -> u64 {
    counter.incr(by).get().expect("the actor answers the task")
}

fn cluster() -> Cluster {
    raylet::init_with(Config::new().num_cpus(4.0)).unwrap()
}

/// Waits until the actor's listing satisfies `done`, and returns it.
fn wait_for(cluster: &Cluster, actor: &ActorHandle, done: impl Fn(&ActorInfo) -> bool) -> ActorInfo {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let actors = cluster.list_actors().unwrap();
        let info = actors
            .into_iter()
            .find(|a| a.id == actor.id())
            .expect("the actor is listed");
        if done(&info) {
            return info;
        }
        assert!(std::time::Instant::now() < deadline, "the actor stays {info:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_process(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
}

#[test]
fn calls_from_one_handle_run_in_submission_order() {
    let cluster = cluster();
    let recorder = Recorder::remote(&cluster).spawn().unwrap();
    let positions: Vec<ObjectRef<usize>> = (0..10_000).map(|i| recorder.push(i)).collect();
    let positions = cluster.get_all(&positions).unwrap();
    assert_eq!(positions, (0..10_000).collect::<Vec<usize>>());
    assert_eq!(recorder.seen().get().unwrap(), (0..10_000).collect::<Vec<u64>>());
}

#[test]
fn an_actor_keeps_its_state_across_calls_and_handles() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 5).spawn().unwrap();
    assert_eq!(counter.incr(2).get().unwrap(), 7);
    let copy = counter.clone();
    assert_eq!(copy.incr(3).get().unwrap(), 10);
    assert_eq!(counter.get().get().unwrap(), 10);
}

#[test]
fn a_handle_passed_to_a_task_calls_the_same_actor() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 0).spawn().unwrap();
    let through_task = incr_through::remote(&cluster, counter.clone(), 40).unwrap();
    assert_eq!(through_task.get().unwrap(), 40);
    assert_eq!(counter.incr(2).get().unwrap(), 42);
}

#[test]
fn a_named_actor_is_found_by_its_type_and_wrong_types_or_names_are_clear_errors() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 1).name("shared-counter").spawn().unwrap();
    counter.incr(1).get().unwrap();
    let found = cluster.get_actor::<Counter>("shared-counter").unwrap();
    assert_eq!(found.get().get().unwrap(), 2);

    let wrong = cluster.get_actor::<Recorder>("shared-counter").unwrap_err();
    assert!(matches!(wrong, Error::WrongActorType { .. }), "{wrong}");
    assert!(wrong.to_string().contains("Counter"), "{wrong}");
    let missing = cluster.get_actor::<Counter>("no-such-actor").unwrap_err();
    assert!(
        missing.to_string().contains("no live actor named 'no-such-actor'"),
        "{missing}"
    );
    let taken = Counter::remote(&cluster, 0).name("shared-counter").spawn().unwrap_err();
    assert!(taken.to_string().contains("already"), "{taken}");
}

#[test]
fn a_killed_actor_process_restarts_with_fresh_state_until_its_restarts_are_used_up() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 100).max_restarts(1).spawn().unwrap();
    assert_eq!(counter.incr(1).get().unwrap(), 101);
    let first_pid = counter.pid().get().unwrap();
    kill_process(first_pid);
    let info = wait_for(&cluster, &counter, |a| a.state == ActorState::Alive && a.restarts == 1);
    assert_eq!(counter.incr(1).get().unwrap(), 101, "the constructor ran again");
    let second_pid = counter.pid().get().unwrap();
    assert_eq!(info.pid, second_pid);
    assert_ne!(second_pid, first_pid);

    kill_process(second_pid);
    let info = wait_for(&cluster, &counter, |a| a.state == ActorState::Dead);
    assert!(
        info.death_cause.contains("1 restarts are used up"),
        "{}",
        info.death_cause
    );
    let Err(Error::Task(error)) = counter.incr(1).get() else {
        panic!("a dead actor must not answer")
    };
    assert!(error.is_actor_death(), "{error}");
    assert!(error.message.contains("1 restarts are used up"), "{error}");
}

#[test]
fn calls_in_flight_when_the_process_dies_run_again_with_max_task_retries() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 100)
        .max_restarts(1)
        .max_task_retries(1)
        .spawn()
        .unwrap();
    kill_process(counter.pid().get().unwrap());
    let calls: Vec<ObjectRef<u64>> = (1..=3).map(|_| counter.incr(1)).collect();
    assert_eq!(cluster.get_all(&calls).unwrap(), vec![101, 102, 103]);
}

#[test]
fn a_handle_found_by_name_carries_the_actors_retry_policy() {
    let cluster = cluster();
    Counter::remote(&cluster, 100)
        .name("retried")
        .max_restarts(1)
        .max_task_retries(1)
        .spawn()
        .unwrap();
    let found = cluster.get_actor::<Counter>("retried").unwrap();
    kill_process(found.pid().get().unwrap());
    assert_eq!(
        found.incr(1).get().unwrap(),
        101,
        "the call was sent again to the restarted actor"
    );
}

#[test]
fn without_restarts_a_killed_actor_fails_calls_with_actor_died_saying_how() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 0).spawn().unwrap();
    kill_process(counter.pid().get().unwrap());
    let Err(Error::Task(error)) = counter.incr(1).get() else {
        panic!("a call of a dead actor must fail")
    };
    assert!(error.is_actor_death(), "{error}");
    assert!(
        error.message.contains("signal 9") || error.message.contains("SIGKILL"),
        "{error}"
    );
}

#[test]
fn a_failing_constructor_fails_every_call_with_its_error() {
    let cluster = cluster();
    let faulty = Faulty::remote(&cluster, "/etc/app.toml".to_string()).spawn().unwrap();
    for _ in 0..2 {
        let Err(Error::Task(error)) = faulty.ping().get() else {
            panic!("a call of an actor whose constructor failed must fail")
        };
        assert_eq!(error.kind, TaskErrorKind::ActorCreationFailed);
        assert!(error.message.contains("cannot read config /etc/app.toml"), "{error}");
    }
}

#[test]
fn an_async_actor_runs_up_to_max_concurrency_calls_at_once() {
    let cluster = cluster();
    let sleeper = Sleeper::remote(&cluster).max_concurrency(8).spawn().unwrap();
    let naps: Vec<ObjectRef<u64>> = (0..16).map(|_| sleeper.nap(300)).collect();
    assert_eq!(cluster.get_all(&naps).unwrap(), vec![300; 16]);
    assert_eq!(sleeper.peak().get().unwrap(), 8);
}

#[test]
fn an_async_actor_awaits_calls_of_another_actor() {
    let cluster = cluster();
    let sleeper = Sleeper::remote(&cluster).max_concurrency(8).spawn().unwrap();
    let counter = Counter::remote(&cluster, 0).spawn().unwrap();
    let answers: Vec<ObjectRef<u64>> = (0..20).map(|_| sleeper.incr_elsewhere(counter.clone(), 1)).collect();
    let mut answers = cluster.get_all(&answers).unwrap();
    answers.sort_unstable();
    assert_eq!(answers, (1..=20).collect::<Vec<u64>>());
    assert_eq!(counter.get().get().unwrap(), 20);
}

#[test]
fn a_sync_actor_runs_up_to_max_concurrency_calls_on_threads_and_one_at_a_time_by_default() {
    let cluster = cluster();
    let threaded = BlockingSleeper::remote(&cluster).max_concurrency(4).spawn().unwrap();
    let naps: Vec<ObjectRef<u64>> = (0..8).map(|_| threaded.nap(300)).collect();
    assert_eq!(cluster.get_all(&naps).unwrap(), vec![300; 8]);
    assert_eq!(threaded.peak().get().unwrap(), 4);

    let serial = BlockingSleeper::remote(&cluster).spawn().unwrap();
    let naps: Vec<ObjectRef<u64>> = (0..3).map(|_| serial.nap(50)).collect();
    assert_eq!(cluster.get_all(&naps).unwrap(), vec![50; 3]);
    assert_eq!(serial.peak().get().unwrap(), 1);
}

#[test]
fn cluster_kill_ends_an_actor_for_good_or_restarts_it() {
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 7).max_restarts(-1).spawn().unwrap();
    let first_pid = counter.pid().get().unwrap();
    cluster.kill(&counter, false).unwrap();
    wait_for(&cluster, &counter, |a| a.state == ActorState::Alive && a.restarts == 1);
    let restarted_pid = counter.pid().get().unwrap();
    assert_ne!(restarted_pid, first_pid, "killed without no_restart, it came back");

    cluster.kill(&counter, true).unwrap();
    let Err(Error::Task(error)) = counter.get().get() else {
        panic!("a killed actor must not answer")
    };
    assert!(error.is_actor_death(), "{error}");
    assert!(error.message.contains("killed"), "{error}");
    let info = cluster
        .list_actors()
        .unwrap()
        .into_iter()
        .find(|a| a.id == counter.id())
        .unwrap();
    assert_eq!(info.state, ActorState::Dead);
}

#[test]
fn an_actor_killed_while_it_waits_for_room_takes_none_of_the_room_once_it_frees() {
    let cluster = cluster();
    let holder = Counter::remote(&cluster, 0).num_cpus(4.0).spawn().unwrap();
    holder.get().get().unwrap();
    let waiting = Counter::remote(&cluster, 0).num_cpus(4.0).spawn().unwrap();
    wait_for_a_demand(&cluster);
    cluster.kill(&waiting, true).unwrap();
    cluster.kill(&holder, true).unwrap();

    let next = Counter::remote(&cluster, 5).num_cpus(4.0).spawn().unwrap();
    let answer = cluster.get_timeout(&next.get(), Duration::from_secs(30));
    assert_eq!(
        answer.ok(),
        Some(5),
        "the killed actor's lease kept the CPUs: {:?}",
        cluster
            .status()
            .unwrap()
            .alive()
            .map(|node| node.available.clone())
            .collect::<Vec<_>>()
    );
}

/// Waits until a node reports a lease request waiting for room.
fn wait_for_a_demand(cluster: &Cluster) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cluster.status().unwrap().alive().all(|node| node.demands.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no node reports the waiting actor"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The anonymous memory this process holds, in bytes.
fn anonymous_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

/// A same-node actor whose process stops reading (SIGSTOP) fills its
/// socket; the caller's further calls wait in its stream's backlog, each
/// held about once, without holding up the caller's thread, and all are
/// answered in order once the actor reads again.
#[test]
fn calls_to_an_actor_that_stopped_reading_wait_without_blocking_and_all_arrive_in_order() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    const CALLS: u64 = 1_000;
    const CALL_BYTES: usize = 64 << 10;
    let cluster = cluster();
    let counter = Counter::remote(&cluster, 0).spawn().unwrap();
    let pid = Pid::from_raw(counter.pid().get().unwrap() as i32);
    let bytes = vec![7u8; CALL_BYTES];
    kill(pid, Signal::SIGSTOP).unwrap();
    let before = anonymous_rss();
    let started = std::time::Instant::now();
    let calls: Vec<ObjectRef<u64>> = (0..CALLS).map(|_| counter.incr_carrying(1, bytes.clone())).collect();
    let submitting = started.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let answered = cluster.wait(&calls, 1, Some(Duration::ZERO)).0.len();
    let grown = anonymous_rss().saturating_sub(before);
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(
        submitting < Duration::from_secs(20),
        "the calls were made in {submitting:?}: the caller waited for the stopped reader"
    );
    assert_eq!(answered, 0, "a stopped actor answered");
    let held = CALLS * CALL_BYTES as u64;
    assert!(
        grown < 3 * held,
        "the caller grew by {} MiB for {} MiB of calls",
        grown >> 20,
        held >> 20
    );
    let counts = cluster.get_all(&calls).unwrap();
    assert_eq!(counts, (1..=CALLS).collect::<Vec<_>>(), "every call once, in order");
}
