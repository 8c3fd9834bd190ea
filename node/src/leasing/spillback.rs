//! The placement decision for one queued request: grant it here, let it
//! wait, spill it back to another node (counting it against that node until
//! the next view), or refuse it; and the cluster view the decision uses.

use std::sync::Arc;

use raylet_placement::{Choice, ClusterResources, LaunchableNodes, NodeIndex, Request};
use raylet_proto::ResourceSet;
use raylet_proto::v1::LeaseRefusalKind;

use super::{LeaseManager, LeaseState, NodeView, PendingLease, WorkerContext};

/// What to do with a queued request now.
pub(super) enum Decision {
    Grant,
    Wait,
    /// Send it to the node at this address.
    Spill(String),
    Refuse(LeaseRefusalKind, String),
}

impl LeaseManager {
    /// Takes the head's latest view of the other nodes and of the node
    /// types that may be launched, and answers what it lets run.
    pub(crate) fn set_cluster_view(self: &Arc<Self>, view: Vec<NodeView>, launchable: LaunchableNodes) {
        {
            let mut state = self.state();
            state.launchable = launchable;
            let (cluster, local) = cluster_of(&self.context, state.ledger.total(), view);
            state.cluster = cluster;
            state.local = local;
            state.view += 1;
        }
        self.pump();
    }
}

/// What to do with a request now. A request spilled here (no further
/// spillback) runs here when it ever can, unless, while it waits, another
/// node has room first (one that joined, or whose work ended); any other
/// asks the policy, with this node preferred. A request no node fits waits for the head's next
/// view of the cluster before it is refused: nodes may have joined since
/// the last one.
pub(super) fn decide(state: &mut LeaseState, pending: &PendingLease) -> Decision {
    if !state.sessions.contains_key(&pending.session) {
        return Decision::Refuse(
            LeaseRefusalKind::WorkerStartFailed,
            "the lease session is closed".into(),
        );
    }
    let local = state.local;
    let labels_match = pending
        .scheduling
        .label_selector
        .matches(&state.cluster.node(local).labels);
    let demand = state.cluster.demand(&pending.demand);
    let request = Request {
        demand: &demand,
        scheduling: &pending.scheduling,
        preferred: Some(local),
    };
    if !pending.allow_spillback && labels_match && state.ledger.feasible(&pending.demand) {
        if state.ledger.fits_now(&pending.demand) {
            return Decision::Grant;
        }
        return match state.placer.choose(&state.cluster, &request) {
            Choice::Run(index) if index != local => {
                state.cluster.subtract(index, &demand);
                Decision::Spill(state.cluster.node(index).address.clone())
            }
            _ => Decision::Wait,
        };
    }
    let choice = state.placer.choose(&state.cluster, &request);
    let choice = state
        .launchable
        .await_launch(choice, &pending.demand, &pending.scheduling.label_selector);
    match choice {
        Choice::Run(index) | Choice::Queue(index) if index == local => match state.ledger.fits_now(&pending.demand) {
            true => Decision::Grant,
            false => Decision::Wait,
        },
        Choice::Run(index) | Choice::Queue(index) => {
            state.cluster.subtract(index, &demand);
            Decision::Spill(state.cluster.node(index).address.clone())
        }
        Choice::AwaitLaunch(_) => Decision::Wait,
        Choice::Infeasible(_) if pending.view == state.view => Decision::Wait,
        Choice::Infeasible(reason) => Decision::Refuse(LeaseRefusalKind::Infeasible, reason),
        Choice::Unschedulable(reason) => Decision::Refuse(LeaseRefusalKind::Unschedulable, reason),
    }
}

/// The placement view: this node, with its labels and total, and the
/// others (which the heartbeat reply lists without this one).
pub(super) fn cluster_of(
    context: &WorkerContext,
    total: &ResourceSet,
    others: Vec<NodeView>,
) -> (ClusterResources, NodeIndex) {
    let mut cluster = ClusterResources::new();
    let local = cluster.upsert(context.node_id, &context.node_manager_address, &context.labels, total);
    for node in others {
        let index = cluster.upsert(node.node_id, &node.address, &node.labels, &node.total);
        cluster.set_available(index, &node.available);
    }
    (cluster, local)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use raylet_placement::Placer;
    use raylet_proto::resources::CPU;
    use raylet_proto::{Amount, Labels, NodeId, Scheduling, WorkerId};

    use super::*;
    use crate::leasing::sessions::Session;

    fn cpus(n: u64) -> ResourceSet {
        ResourceSet::new().with(CPU, Amount::whole(n))
    }

    fn node(address: &str, total: u64, available: u64) -> NodeView {
        NodeView {
            node_id: NodeId::random(),
            address: address.into(),
            total: cpus(total),
            available: cpus(available),
            labels: Labels::new(),
        }
    }

    /// A node with `local` CPUs, `used` of them leased, one open session,
    /// and the given other nodes, in its first view of the cluster.
    fn state(local: u64, used: u64, others: Vec<NodeView>) -> LeaseState {
        let context = WorkerContext::for_tests();
        let mut state = LeaseState::new(&context, cpus(local), Placer::new(1));
        if used > 0 {
            state.ledger.hold(WorkerId::random(), cpus(used));
        }
        let (mut cluster, local) = cluster_of(&context, state.ledger.total(), others);
        cluster.set_available(local, &state.ledger.available());
        (state.cluster, state.local) = (cluster, local);
        let (events, _) = raylet_proto::peer_stream::peer_stream("lease session events", "a test owner");
        let session = Session::new(PathBuf::from("/bin/true"), String::new(), String::new(), events);
        state.sessions.insert(1, session);
        state.view = 1;
        state
    }

    fn request(demand: u64, allow_spillback: bool) -> PendingLease {
        PendingLease {
            session: 1,
            request_id: 7,
            demand: cpus(demand),
            scheduling: Scheduling::default(),
            allow_spillback,
            retriable: true,
            outlives_session: false,
            view: 0,
        }
    }

    #[test]
    fn a_request_that_fits_is_granted_here() {
        let mut state = state(2, 0, vec![node("b:1", 8, 8)]);
        assert!(matches!(decide(&mut state, &request(1, true)), Decision::Grant));
    }

    #[test]
    fn a_full_node_spills_to_the_least_utilized_node_with_room() {
        let mut state = state(2, 2, vec![node("b:1", 8, 1), node("c:1", 8, 6), node("d:1", 8, 0)]);
        assert!(matches!(decide(&mut state, &request(1, true)), Decision::Spill(a) if a == "c:1"));
    }

    #[test]
    fn spilled_work_counts_against_the_node_it_went_to() {
        let mut state = state(1, 1, vec![node("b:1", 2, 2), node("c:1", 2, 2)]);
        let mut targets: Vec<String> = (0..4)
            .map(|_| match decide(&mut state, &request(1, true)) {
                Decision::Spill(address) => address,
                _ => panic!("the local node is full"),
            })
            .collect();
        targets.sort();
        assert_eq!(targets, ["b:1", "b:1", "c:1", "c:1"]);
    }

    #[test]
    fn a_spilled_request_waits_here_unless_another_node_has_room_now() {
        let mut state = state(2, 2, vec![node("b:1", 8, 0)]);
        assert!(matches!(decide(&mut state, &request(1, false)), Decision::Wait));
        let mut state = self::state(2, 2, vec![node("b:1", 8, 8)]);
        assert!(matches!(decide(&mut state, &request(1, false)), Decision::Spill(a) if a == "b:1"));
    }

    #[test]
    fn a_request_only_another_node_can_ever_fit_goes_there() {
        let mut state = state(2, 0, vec![node("b:1", 16, 0)]);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Spill(a) if a == "b:1"));
    }

    #[test]
    fn a_request_no_node_can_ever_fit_is_refused_saying_why() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        let Decision::Refuse(LeaseRefusalKind::Infeasible, reason) = decide(&mut state, &request(64, true)) else {
            panic!("an infeasible request must be refused");
        };
        assert!(
            reason.contains("CPU: 64.0") && reason.contains("the most CPU any node has is 4.0"),
            "{reason}"
        );
    }

    #[test]
    fn a_request_only_a_launchable_node_type_fits_waits_for_the_launch_then_goes_there() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        state.launchable = LaunchableNodes::new(vec![raylet_placement::LaunchableNode {
            name: "cpu8".into(),
            total: cpus(8),
            labels: Labels::new(),
        }]);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Wait));
        assert!(matches!(decide(&mut state, &request(64, true)), Decision::Refuse(..)));

        let joined = vec![node("b:1", 4, 4), node("c:1", 8, 8)];
        let (cluster, local) = cluster_of(&WorkerContext::for_tests(), &cpus(2), joined);
        (state.cluster, state.local) = (cluster, local);
        assert!(matches!(decide(&mut state, &request(8, true)), Decision::Spill(a) if a == "c:1"));
    }

    #[test]
    fn a_request_no_node_fits_waits_for_a_view_newer_than_itself() {
        let mut state = state(2, 0, vec![node("b:1", 4, 4)]);
        let mut pending = request(64, true);
        pending.view = state.view;
        assert!(matches!(decide(&mut state, &pending), Decision::Wait));
    }

    #[test]
    fn a_request_of_a_closed_session_is_refused() {
        let mut state = state(2, 0, vec![]);
        let mut orphan = request(1, true);
        orphan.session = 2;
        let Decision::Refuse(LeaseRefusalKind::WorkerStartFailed, reason) = decide(&mut state, &orphan) else {
            panic!("a closed session's request must be refused");
        };
        assert_eq!(reason, "the lease session is closed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_spills_to_a_node_a_new_view_shows_with_room() {
        use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;

        use crate::tests::harness::WorkerPoolTest;

        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        test.leases.request(owner.lease_request(1));
        let spillable = PendingLease {
            allow_spillback: true,
            ..owner.lease_request(2)
        };
        test.leases.request(spillable);
        test.settle().await;
        assert_eq!(owner.events().len(), 1, "one CPU: the second request waits");
        test.leases
            .set_cluster_view(vec![node("b:1", 4, 4)], LaunchableNodes::default());
        let events = owner.events();
        let [LeaseEvent::Spillback(spilled)] = &events[..] else {
            panic!("expected a spillback, got {events:?}");
        };
        assert_eq!((spilled.request_id, spilled.node_address.as_str()), (2, "b:1"));
    }
}
