//! Unit tests of the actor client on a virtual cluster: the calls in
//! flight when an actor's process dies go to its next incarnation while
//! their retries allow, in the order they were made, and fail with
//! `ActorDied` after.

use raylet_proto::v1::{ActorRecord, ActorState, TaskSpec};
use raylet_proto::{ActorId, NodeId, TaskId};

use super::client::ActorCall;
use crate::links::virtual_cluster::{VirtualCluster, number, value};
use crate::submitter::pending_gate::PendingGate;
use crate::task_error::TaskErrorKind;
use crate::value::Outcome;

/// A virtual cluster and one actor that the process calls.
struct ActorTest {
    cluster: VirtualCluster,
    gate: std::sync::Arc<PendingGate>,
    actor: ActorId,
    version: u64,
}

impl ActorTest {
    fn start() -> Self {
        ActorTest {
            cluster: VirtualCluster::start(),
            gate: PendingGate::new(100),
            actor: ActorId::random(),
            version: 0,
        }
    }

    /// Calls method `bump` with retries after the actor's process dies.
    fn call(&self, max_task_retries: u32) -> TaskId {
        let core = &self.cluster.core;
        let task_id = TaskId::random();
        core.owner.store.add_pending(task_id.return_object());
        let call = ActorCall {
            task_id,
            method: "bump",
            function: "Counter::bump".into(),
            args: Vec::new(),
            permit: self.gate.admit(),
            num_returns: 1,
            generator: false,
        };
        core.actors.call(self.actor, max_task_retries, call);
        task_id
    }

    fn outcome(&self, call: TaskId) -> Option<Outcome> {
        self.cluster.outcome(call.return_object())
    }

    /// The head reports the actor in `state`, hosted at `address`.
    async fn report(&mut self, state: ActorState, address: &str, cause: &str) {
        self.version += 1;
        let record = ActorRecord {
            actor_id: self.actor.as_bytes().to_vec(),
            state: state.into(),
            address: address.into(),
            node_id: NodeId::random().as_bytes().to_vec(),
            pid: 4242,
            version: self.version,
            death_cause: cause.into(),
            ..ActorRecord::default()
        };
        self.cluster.actor_record(self.actor, record);
        self.cluster.settle().await;
    }

    fn attempts(tasks: &[TaskSpec]) -> Vec<(TaskId, u32)> {
        tasks
            .iter()
            .map(|task| (TaskId::from_wire(&task.task_id).unwrap(), task.attempt))
            .collect()
    }
}

const FIRST: &str = "actor-first:9000";
const SECOND: &str = "actor-second:9000";

#[tokio::test(start_paused = true)]
async fn calls_in_flight_when_the_actor_restarts_go_to_its_next_incarnation_in_order() {
    let mut test = ActorTest::start();
    let done = test.call(1);
    let retried = test.call(1);
    test.cluster.settle().await;
    assert_eq!(test.cluster.followed_actors(), [test.actor]);
    test.report(ActorState::Alive, FIRST, "").await;
    let sent = test.cluster.tasks(FIRST);
    assert_eq!(sent.len(), 2, "both calls go out once the actor is alive");
    test.cluster.answer(FIRST, &sent[0], value(1));
    test.cluster.settle().await;
    assert_eq!(number(test.outcome(done)), 1);

    test.report(ActorState::Restarting, "", "its worker was killed").await;
    let made_while_restarting = test.call(1);
    test.cluster.settle().await;
    assert!(
        test.outcome(retried).is_none(),
        "the call in flight waits for the restart"
    );
    test.report(ActorState::Alive, SECOND, "").await;
    let resent = test.cluster.tasks(SECOND);
    let expected = [(retried, 1), (made_while_restarting, 0)];
    assert_eq!(ActorTest::attempts(&resent), expected);
    test.cluster.answer(SECOND, &resent[0], value(2));
    test.cluster.answer(SECOND, &resent[1], value(3));
    test.cluster.settle().await;
    assert_eq!(number(test.outcome(retried)), 2);
    assert_eq!(number(test.outcome(made_while_restarting)), 3);
    assert!(
        test.cluster.tasks(FIRST).is_empty(),
        "nothing goes to the old incarnation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_in_flight_past_its_retries_fails_with_the_cause_of_death() {
    let mut test = ActorTest::start();
    let unretried = test.call(0);
    test.cluster.settle().await;
    test.report(ActorState::Alive, FIRST, "").await;
    assert_eq!(test.cluster.tasks(FIRST).len(), 1);
    test.report(ActorState::Restarting, "", "its node ran out of memory")
        .await;
    let Some(Err(error)) = test.outcome(unretried) else {
        panic!("the call fails at once");
    };
    assert_eq!(error.kind, TaskErrorKind::ActorDied);
    assert!(
        error.message.contains("its node ran out of memory"),
        "{}",
        error.message
    );
    assert_eq!(error.function, "Counter::bump");
}

#[tokio::test(start_paused = true)]
async fn once_the_actor_is_dead_every_call_fails_saying_why_and_whether_it_was_sent() {
    let mut test = ActorTest::start();
    let queued = test.call(3);
    test.cluster.settle().await;
    test.report(ActorState::Dead, "", "its restarts ran out").await;
    let later = test.call(3);
    test.cluster.settle().await;
    for call in [queued, later] {
        let Some(Err(error)) = test.outcome(call) else {
            panic!("the call fails");
        };
        assert_eq!(error.kind, TaskErrorKind::ActorDiedBeforeSend, "never sent");
        assert!(error.is_actor_death());
        assert!(error.message.contains("its restarts ran out"), "{}", error.message);
    }
}

#[tokio::test(start_paused = true)]
async fn a_death_fails_calls_in_flight_as_actor_died_and_calls_never_sent_as_died_before_send() {
    let mut test = ActorTest::start();
    let in_flight = test.call(0);
    test.cluster.settle().await;
    test.report(ActorState::Alive, FIRST, "").await;
    assert_eq!(
        test.cluster.tasks(FIRST).len(),
        1,
        "the first call is sent once the actor is alive"
    );
    let behind = test.call(0);
    test.report(ActorState::Dead, "", "killed by signal 9").await;
    let kinds: Vec<TaskErrorKind> = [in_flight, behind]
        .into_iter()
        .map(|call| match test.outcome(call) {
            Some(Err(error)) => error.kind,
            other => panic!("the call fails: {other:?}"),
        })
        .collect();
    let behind_was_sent = !test.cluster.tasks(FIRST).is_empty();
    let expected_behind = match behind_was_sent {
        true => TaskErrorKind::ActorDied,
        false => TaskErrorKind::ActorDiedBeforeSend,
    };
    assert_eq!(
        kinds,
        [TaskErrorKind::ActorDied, expected_behind],
        "second call sent: {behind_was_sent}"
    );
}
