//! Placement group calls over real gRPC in an in-process cluster: a burst
//! of creates and removes on one session stream (whose bundle operations
//! the head sends to the node in batches), malformed calls answered with
//! reasons while the session goes on, and bundle operations that a node
//! applies one by one, refusing malformed or impossible ones alone.

use std::collections::HashMap;
use std::time::Duration;

use raylet_proto::channel::AuthedChannel;
use raylet_proto::resources::CPU;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::placement_group_answer::Kind as AnswerKind;
use raylet_proto::v1::placement_group_call::Kind as CallKind;
use raylet_proto::v1::placement_group_service_client::PlacementGroupServiceClient;
use raylet_proto::v1::{
    Bundle, BundleOp, BundleOpKind, BundleOpsRequest, CreatePlacementGroupRequest, PlacementGroupCall,
    PlacementGroupState, RemovePlacementGroupRequest,
};
use raylet_proto::{Amount, Error, PlacementGroupId, ResourceSet};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::sandbox::ClusterSandbox;

const PATIENCE: Duration = Duration::from_secs(5);

async fn sandbox() -> ClusterSandbox {
    ClusterSandbox::builder()
        .nodes(1)
        .node_resources(cpus(1.5))
        .heartbeat_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap()
}

fn cpus(amount: f64) -> ResourceSet {
    ResourceSet::new().with(CPU, Amount::parse(CPU, amount).unwrap())
}

async fn channel(sandbox: &ClusterSandbox, address: &str) -> AuthedChannel {
    raylet_proto::channel::connect(address, sandbox.token(), PATIENCE)
        .await
        .unwrap()
}

/// An open session: calls go in, answers come out by call id.
struct Session {
    calls: mpsc::UnboundedSender<PlacementGroupCall>,
    answers: tonic::Streaming<raylet_proto::v1::PlacementGroupAnswer>,
}

impl Session {
    async fn open(sandbox: &ClusterSandbox) -> Self {
        let (calls, outbound) = mpsc::unbounded_channel();
        let answers = PlacementGroupServiceClient::new(channel(sandbox, sandbox.head_address()).await)
            .placement_group_session(UnboundedReceiverStream::new(outbound))
            .await
            .unwrap()
            .into_inner();
        Session { calls, answers }
    }

    fn send(&self, call_id: u64, kind: Option<CallKind>) {
        self.calls.send(PlacementGroupCall { call_id, kind }).unwrap();
    }

    /// The next `count` answers, by call id.
    async fn answers(&mut self, count: usize) -> HashMap<u64, AnswerKind> {
        let mut answers = HashMap::new();
        while answers.len() < count {
            let answer = tokio::time::timeout(PATIENCE, self.answers.message())
                .await
                .expect("answers come in time")
                .unwrap()
                .expect("the session stays open");
            answers.insert(answer.call_id, answer.kind.expect("every answer says something"));
        }
        answers
    }
}

fn create(id: &[u8], bundle: &ResourceSet) -> Option<CallKind> {
    Some(CallKind::Create(CreatePlacementGroupRequest {
        placement_group_id: id.to_vec(),
        name: String::new(),
        bundles: vec![bundle.to_proto()],
        strategy: 0,
    }))
}

fn remove(id: &[u8]) -> Option<CallKind> {
    Some(CallKind::Remove(RemovePlacementGroupRequest {
        placement_group_id: id.to_vec(),
    }))
}

fn state_of(answer: &AnswerKind) -> PlacementGroupState {
    match answer {
        AnswerKind::Record(record) => record.state(),
        AnswerKind::Failure(failure) => panic!("the call failed: {}", Error::from(failure.clone())),
    }
}

fn failure_of(answer: &AnswerKind) -> Error {
    match answer {
        AnswerKind::Failure(failure) => Error::from(failure.clone()),
        AnswerKind::Record(record) => panic!("the call should fail, got {record:?}"),
    }
}

async fn wait_for_free_cpus(sandbox: &ClusterSandbox, amount: f64) {
    let expected = Amount::parse(CPU, amount).unwrap();
    let waited = sandbox
        .wait_for(PATIENCE, |status| status.available().get(CPU) == expected)
        .await;
    assert!(waited.is_ok(), "the node reports {amount} CPUs free: {waited:?}");
}

#[tokio::test]
async fn a_burst_of_groups_on_one_session_is_created_then_removed_and_every_cpu_comes_back() {
    let sandbox = sandbox().await;
    let mut session = Session::open(&sandbox).await;
    let groups: Vec<PlacementGroupId> = (0..300).map(|_| PlacementGroupId::random()).collect();
    let sliver = cpus(0.001);
    for (call_id, group) in groups.iter().enumerate() {
        session.send(call_id as u64, create(group.as_bytes(), &sliver));
    }
    let created = session.answers(groups.len()).await;
    assert!(
        created
            .values()
            .all(|answer| state_of(answer) == PlacementGroupState::Created)
    );
    wait_for_free_cpus(&sandbox, 1.2).await;

    let first_remove = groups.len() as u64;
    for (offset, group) in groups.iter().enumerate() {
        session.send(first_remove + offset as u64, remove(group.as_bytes()));
    }
    let removed = session.answers(groups.len()).await;
    assert!(removed.keys().all(|call_id| *call_id >= first_remove));
    assert!(
        removed
            .values()
            .all(|answer| state_of(answer) == PlacementGroupState::Removed)
    );
    wait_for_free_cpus(&sandbox, 1.5).await;
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_calls_on_a_session_are_answered_with_reasons_and_the_session_goes_on() {
    let sandbox = sandbox().await;
    let mut session = Session::open(&sandbox).await;
    session.send(1, None);
    session.send(2, create(b"short", &cpus(1.0)));
    session.send(3, remove(PlacementGroupId::random().as_bytes()));
    session.send(4, create(PlacementGroupId::random().as_bytes(), &ResourceSet::new()));
    let answers = session.answers(4).await;
    let nothing = failure_of(&answers[&1]);
    assert!(
        matches!(&nothing, Error::InvalidArgument(m) if m.contains("names no operation")),
        "{nothing}"
    );
    assert!(matches!(failure_of(&answers[&2]), Error::InvalidArgument(_)));
    assert!(matches!(failure_of(&answers[&3]), Error::NotFound(_)));
    let empty = failure_of(&answers[&4]);
    assert!(matches!(empty, Error::InvalidArgument(_)), "{empty}");

    session.send(5, create(PlacementGroupId::random().as_bytes(), &cpus(1.0)));
    let answers = session.answers(1).await;
    assert_eq!(state_of(&answers[&5]), PlacementGroupState::Created);
    sandbox.shutdown().await.unwrap();
}

fn bundle_op(kind: i32, group: PlacementGroupId, resources: Option<ResourceSet>, commit: bool) -> BundleOp {
    BundleOp {
        kind,
        placement_group_id: group.as_bytes().to_vec(),
        bundles: vec![Bundle {
            index: 0,
            resources: resources.map(|r| r.to_proto()),
        }],
        commit,
    }
}

#[tokio::test]
async fn bundle_operations_are_applied_one_by_one_and_malformed_or_impossible_ones_are_refused_alone() {
    let sandbox = sandbox().await;
    let mut node = NodeManagerServiceClient::new(channel(&sandbox, sandbox.node_address(0)).await);
    let (held, too_big, never_reserved) = (
        PlacementGroupId::random(),
        PlacementGroupId::random(),
        PlacementGroupId::random(),
    );
    let reserve = BundleOpKind::Reserve as i32;
    let ops = vec![
        bundle_op(reserve, held, Some(cpus(1.0)), true),
        bundle_op(99, held, None, false),
        bundle_op(reserve, too_big, Some(cpus(1.0)), false),
        bundle_op(BundleOpKind::Commit as i32, never_reserved, None, false),
        BundleOp {
            placement_group_id: b"short".to_vec(),
            ..bundle_op(BundleOpKind::Release as i32, held, None, false)
        },
    ];
    let results = node
        .apply_bundle_ops(BundleOpsRequest { ops })
        .await
        .unwrap()
        .into_inner()
        .results;
    let errors: Vec<&str> = results.iter().map(|r| r.error.as_str()).collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert_eq!(errors[0], "", "the first reservation fits");
    assert!(errors[1].contains("not one this node knows"), "{errors:?}");
    assert!(errors[2].contains("do not fit"), "only 0.5 CPU is left: {errors:?}");
    assert!(errors[3].contains("is not reserved here"), "{errors:?}");
    assert!(!errors[4].is_empty(), "a malformed id is refused: {errors:?}");
    wait_for_free_cpus(&sandbox, 0.5).await;

    let release = vec![bundle_op(BundleOpKind::Release as i32, held, None, false)];
    let results = node
        .apply_bundle_ops(BundleOpsRequest { ops: release })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results[0].error, "");
    wait_for_free_cpus(&sandbox, 1.5).await;
    sandbox.shutdown().await.unwrap();
}
