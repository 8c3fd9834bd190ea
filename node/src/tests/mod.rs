//! Unit tests of the node manager's worker pool on a virtual launcher: no
//! processes, no sockets, a paused clock.

mod harness;

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use raylet_proto::WorkerId;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::{LeaseRefusalKind, WorkerExitKind};

use self::harness::{ADOPTION_GRACE, Launched, OwnerSession, WorkerPoolTest, cpus, worker_address};
use super::leasing::{MAX_STARTUP_FAILURES, PendingLease, REGISTRATION_TIMEOUT};
use super::worker_process::{WorkerEnd, describe_exit};

/// The one event the owner got: a grant of `request_id`; the worker granted.
fn only_grant(owner: &mut OwnerSession, request_id: u64) -> Launched {
    let events = owner.events();
    let [LeaseEvent::Granted(grant)] = &events[..] else {
        panic!("expected a grant of request {request_id}, got {events:?}");
    };
    assert_eq!(grant.request_id, request_id);
    let worker = WorkerId::from_wire(&grant.worker_id).expect("a worker id");
    assert_eq!(grant.worker_address, worker_address(worker));
    Launched { worker, pid: grant.pid }
}

/// The one event the owner got: a refusal of `request_id`; its kind and reason.
fn only_refusal(owner: &mut OwnerSession, request_id: u64) -> (LeaseRefusalKind, String) {
    let events = owner.events();
    let [LeaseEvent::Refused(refused)] = &events[..] else {
        panic!("expected a refusal of request {request_id}, got {events:?}");
    };
    assert_eq!(refused.request_id, request_id);
    (refused.kind(), refused.reason.clone())
}

/// The one worker started since last asked.
fn only_launched(test: &WorkerPoolTest) -> Launched {
    let launched = test.launched();
    let [worker] = launched[..] else {
        panic!("expected one worker started, got {launched:?}");
    };
    worker
}

/// A late registration of `worker`, which the pool gave up, is refused.
fn assert_unknown(test: &WorkerPoolTest, worker: Launched) {
    let late = test.register(worker).expect_err("the pool gave the worker up");
    assert!(matches!(late, raylet_proto::Error::NotFound(_)), "{late}");
}

/// The text of a launch that failed with "permission denied".
fn permission_denied(test: &WorkerPoolTest) -> String {
    format!(
        "internal error: starting a worker from {}: permission denied",
        test.binary().display()
    )
}

/// Leases a worker that outlives `owner`'s session, then closes the session.
async fn orphaned_actor_host(test: &WorkerPoolTest, mut owner: OwnerSession) -> Launched {
    test.leases.request(PendingLease {
        outlives_session: true,
        ..owner.lease_request(1)
    });
    test.settle().await;
    let host = only_grant(&mut owner, 1);
    test.leases.close_session(owner.id);
    test.settle().await;
    let killed = test.killed();
    assert_eq!(killed.len(), 1, "the session's idle worker is killed with it");
    assert!(!killed.contains(&host.pid), "the actor's host is held for adoption");
    host
}

#[tokio::test(start_paused = true)]
async fn a_registering_worker_takes_the_lease_it_was_started_for() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_unregistered_workers();
    test.leases.request(owner.lease_request(1));
    test.settle().await;
    let worker = only_launched(&test);
    assert!(
        owner.events().is_empty(),
        "nothing is granted before the worker registers"
    );
    test.register(worker).expect("a started worker registers");
    test.settle().await;
    assert_eq!(only_grant(&mut owner, 1), worker);
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_worker_cannot_be_started_is_refused_saying_why() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_unregistered_workers();
    test.refuse_launches_after(0, io::ErrorKind::PermissionDenied);
    test.leases.request(owner.lease_request(1));
    test.settle().await;
    let refusal = (LeaseRefusalKind::WorkerStartFailed, permission_denied(&test));
    assert_eq!(only_refusal(&mut owner, 1), refusal);
    assert_eq!(test.leases.reported().1, cpus(4), "the refused lease holds nothing");
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_workers_cannot_be_started_is_not_opened_and_keeps_no_worker() {
    let test = WorkerPoolTest::start(4);
    test.refuse_launches_after(1, io::ErrorKind::PermissionDenied);
    let error = test.open_session().err().expect("the session is refused");
    assert_eq!(error.to_string(), permission_denied(&test));
    let started = only_launched(&test);
    test.settle().await;
    assert_eq!(test.killed(), [started.pid]);
    assert_unknown(&test, started);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_never_registers_is_killed_at_the_timeout_and_its_lease_goes_to_a_new_one() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_idle_workers().await;
    for request_id in 1..=3 {
        test.leases.request(owner.lease_request(request_id));
    }
    test.settle().await;
    let granted: Vec<u64> = owner
        .events()
        .iter()
        .map(|event| match event {
            LeaseEvent::Granted(grant) => grant.request_id,
            other => panic!("expected grants to the idle workers, got {other:?}"),
        })
        .collect();
    assert_eq!(granted, [1, 2]);
    let hung = only_launched(&test);
    test.advance(REGISTRATION_TIMEOUT - Duration::from_millis(2)).await;
    assert!(test.killed().is_empty(), "killed before its registration timeout");
    test.advance(Duration::from_millis(2)).await;
    assert_eq!(test.killed(), [hung.pid]);
    let timed_out = WorkerEnd::new(
        WorkerExitKind::StartTimedOut,
        "did not register within 30s of its start",
    );
    assert_eq!(test.exit_of(hung).await, Some(timed_out));
    assert!(owner.events().is_empty(), "one failed start does not refuse the lease");
    assert_unknown(&test, hung);
    let replacement = only_launched(&test);
    test.register(replacement).expect("the new worker registers");
    test.settle().await;
    assert_eq!(only_grant(&mut owner, 3), replacement);
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_workers_keep_dying_before_they_register_is_refused_saying_why() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_unregistered_workers();
    test.leases.request(owner.lease_request(1));
    test.settle().await;
    for _ in 0..MAX_STARTUP_FAILURES {
        assert!(
            owner.events().is_empty(),
            "refused before {MAX_STARTUP_FAILURES} failures"
        );
        let worker = only_launched(&test);
        test.exit(worker, describe_exit(ExitStatus::from_raw(1 << 8)));
        test.settle().await;
    }
    assert!(
        test.launched().is_empty(),
        "no worker is started after the last failure"
    );
    let reason = format!(
        "3 workers in a row started from {} ended before they registered; the last exited with code 1",
        test.binary().display()
    );
    assert_eq!(
        only_refusal(&mut owner, 1),
        (LeaseRefusalKind::WorkerStartFailed, reason)
    );
    assert_eq!(test.leases.reported().1, cpus(4), "the refused lease holds nothing");
}

#[tokio::test(start_paused = true)]
async fn a_leased_worker_that_dies_frees_its_resources_and_its_end_is_told() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_idle_workers().await;
    test.leases.request(owner.lease_request(1));
    test.settle().await;
    let worker = only_grant(&mut owner, 1);
    assert_eq!(test.leases.reported().1, cpus(3));
    test.exit(worker, describe_exit(ExitStatus::from_raw(11)));
    test.settle().await;
    let crashed = WorkerEnd::new(WorkerExitKind::Signaled, "was killed by signal 11 (SIGSEGV)");
    assert_eq!(test.exit_of(worker).await, Some(crashed));
    assert_eq!(test.leases.reported().1, cpus(4));
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_outlives_its_session_is_handed_to_the_session_that_adopts_it() {
    let test = WorkerPoolTest::start(4);
    let owner = test.open_session_with_idle_workers().await;
    let host = orphaned_actor_host(&test, owner).await;
    let mut adopter = test.open_session().expect("the session opens");
    test.leases.adopt_lease(adopter.id, 9, host.worker);
    assert_eq!(only_grant(&mut adopter, 9), host);
    test.advance(ADOPTION_GRACE).await;
    assert!(
        !test.killed().contains(&host.pid),
        "an adopted worker outlives the adoption grace"
    );
    assert_eq!(test.exit_of(host).await, None);
}

#[tokio::test(start_paused = true)]
async fn adopting_a_worker_nobody_adopted_within_the_grace_is_refused_as_gone() {
    let test = WorkerPoolTest::start(4);
    let owner = test.open_session_with_idle_workers().await;
    let host = orphaned_actor_host(&test, owner).await;
    test.advance(ADOPTION_GRACE).await;
    assert_eq!(test.killed(), [host.pid]);
    let revoked = "was not adopted within 60s after its lease session ended";
    let end = WorkerEnd::new(WorkerExitKind::LeaseRevoked, revoked);
    assert_eq!(test.exit_of(host).await, Some(end));
    let mut adopter = test.open_session().expect("the session opens");
    test.leases.adopt_lease(adopter.id, 9, host.worker);
    let gone = (
        LeaseRefusalKind::WorkerGone,
        format!("worker {} {revoked}", host.worker),
    );
    assert_eq!(only_refusal(&mut adopter, 9), gone);
    let stranger = WorkerId::random();
    test.leases.adopt_lease(adopter.id, 10, stranger);
    let unknown = (
        LeaseRefusalKind::WorkerGone,
        format!("worker {stranger} is not held here"),
    );
    assert_eq!(only_refusal(&mut adopter, 10), unknown);
}

#[tokio::test(start_paused = true)]
async fn the_memory_monitor_ends_the_newest_retriable_lease_first_then_the_newest_other() {
    let test = WorkerPoolTest::start(4);
    let mut owner = test.open_session_with_idle_workers().await;
    let retriable = |request_id| PendingLease {
        retriable: true,
        ..owner.lease_request(request_id)
    };
    let (older_retriable, newer_retriable) = (retriable(1), retriable(2));
    test.leases.request(older_retriable);
    test.settle().await;
    let older_retriable = only_grant(&mut owner, 1);
    test.advance(Duration::from_secs(1)).await;
    test.leases.request(newer_retriable);
    test.settle().await;
    let newer_retriable = only_grant(&mut owner, 2);
    test.advance(Duration::from_secs(1)).await;
    test.leases.request(owner.lease_request(3));
    test.settle().await;
    test.register(only_launched(&test)).expect("the new worker registers");
    let newest_other = only_grant(&mut owner, 3);
    let usage = "the node's memory was 97.0% used";
    for victim in [newer_retriable, older_retriable, newest_other] {
        assert_eq!(test.leases.end_newest_for_memory(usage), Some(victim.worker));
        assert_eq!(test.killed(), [victim.pid]);
        test.settle().await;
        let reason = format!("was killed by the out-of-memory monitor: {usage}");
        let oom = WorkerEnd::new(WorkerExitKind::OomKilled, reason);
        assert_eq!(test.exit_of(victim).await, Some(oom), "told as OOM, not as its SIGKILL");
    }
    assert_eq!(test.leases.end_newest_for_memory(usage), None, "no lease is left");
}
