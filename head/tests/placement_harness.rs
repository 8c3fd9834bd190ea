//! A deterministic harness for the head's placement: virtual nodes that
//! exist as the real [`ResourceLedger`]s behind a fake [`BundleNodes`],
//! reports fed to the real node table by hand, and injected node loss and
//! reservation failures. No timers, no sockets: every run decides the same.
//! It checks every placement group strategy end to end through the real
//! group manager, all-or-nothing reservation, rescheduling after a node
//! dies, what a restarted head frees that its predecessor left reserved,
//! and every task policy over the same node table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raylet_cluster_status::NodeStats;
use raylet_head::placement_groups::{BundleCallError, BundleNodes, GroupManager, GroupRecord, GroupSpec, GroupState};
use raylet_head::state_store::StateStore;
use raylet_head::{Heartbeat, NodeTable, Registration};
use raylet_node::ResourceLedger;
use raylet_placement::{Choice, Placer, Request};
use raylet_proto::resources::{CPU, GPU};
use raylet_proto::{
    Amount, Error, LabelSelector, Labels, NodeId, PlacementGroupId, PlacementStrategy, ResourceSet, Scheduling,
    SchedulingStrategy,
};

/// Virtual node managers: a ledger per address, the failures to inject,
/// and every call made, shared by the harness and the group manager.
#[derive(Clone, Default)]
struct VirtualNodes(Arc<NodesState>);

#[derive(Default)]
struct NodesState {
    ledgers: Mutex<BTreeMap<String, ResourceLedger>>,
    refusing: Mutex<BTreeSet<String>>,
    calls: Mutex<Vec<String>>,
}

impl std::ops::Deref for VirtualNodes {
    type Target = NodesState;
    fn deref(&self) -> &NodesState {
        &self.0
    }
}

impl VirtualNodes {
    fn ledger<T>(&self, address: &str, use_it: impl FnOnce(&mut ResourceLedger) -> T) -> T {
        let mut ledgers = self.ledgers.lock().unwrap();
        use_it(ledgers.get_mut(address).expect("a virtual node"))
    }

    fn alive(&self, address: &str) -> Result<(), BundleCallError> {
        if self.refusing.lock().unwrap().contains(address) {
            return Err(Error::Unavailable(format!("{address} is injected to fail")).into());
        }
        match self.ledgers.lock().unwrap().contains_key(address) {
            true => Ok(()),
            false => Err(Error::Unavailable(format!("{address} is gone")).into()),
        }
    }
}

/// A ledger's refusal, as a node manager answers it.
fn refused(error: impl std::fmt::Display) -> BundleCallError {
    BundleCallError::Refused {
        reason: error.to_string(),
    }
}

impl BundleNodes for VirtualNodes {
    async fn reserve(
        &self,
        address: &str,
        group: PlacementGroupId,
        bundles: Vec<(u32, ResourceSet)>,
        commit: bool,
    ) -> Result<(), BundleCallError> {
        self.calls.lock().unwrap().push(format!("reserve {address}"));
        self.alive(address)?;
        self.ledger(address, |ledger| {
            ledger.reserve_bundles(group, &bundles).map_err(refused)?;
            if commit {
                let indexes: Vec<u32> = bundles.iter().map(|(index, _)| *index).collect();
                ledger.commit_bundles(group, &indexes).map_err(refused)?;
            }
            Ok(())
        })
    }

    async fn commit(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<(), BundleCallError> {
        self.calls.lock().unwrap().push(format!("commit {address}"));
        self.alive(address)?;
        self.ledger(address, |ledger| {
            ledger.commit_bundles(group, &indexes).map_err(refused)
        })
    }

    async fn release(&self, address: &str, group: PlacementGroupId, indexes: Vec<u32>) -> Result<(), BundleCallError> {
        self.calls.lock().unwrap().push(format!("release {address}"));
        self.alive(address)?;
        self.ledger(address, |ledger| ledger.release_bundles(group, &indexes));
        Ok(())
    }
}

/// The head's node table and group manager over virtual nodes.
struct Harness {
    nodes: VirtualNodes,
    table: Arc<Mutex<NodeTable>>,
    groups: GroupManager<VirtualNodes>,
    ids: BTreeMap<String, (NodeId, u64)>,
    clock: Instant,
}

fn resources(cpus: u64, gpus: u64) -> ResourceSet {
    ResourceSet::new()
        .with(CPU, Amount::whole(cpus))
        .with(GPU, Amount::whole(gpus))
}

fn cpus(n: u64) -> ResourceSet {
    ResourceSet::new().with(CPU, Amount::whole(n))
}

impl Harness {
    /// Virtual nodes named `n0`, `n1`, .. with these resources.
    fn new(shapes: &[ResourceSet]) -> Self {
        let nodes = VirtualNodes::default();
        let table = Arc::new(Mutex::new(NodeTable::new(Duration::from_secs(5))));
        let mut harness = Harness {
            groups: GroupManager::new(table.clone(), nodes.clone()),
            nodes,
            table,
            ids: BTreeMap::new(),
            clock: Instant::now(),
        };
        for (i, shape) in shapes.iter().enumerate() {
            harness.add_node(&format!("n{i}"), shape.clone(), Labels::new());
        }
        harness
    }

    fn add_node(&mut self, address: &str, total: ResourceSet, labels: Labels) {
        let node_id = NodeId::random();
        let registration = Registration {
            node_id,
            address: address.to_string(),
            hostname: "virtual".into(),
            is_head_node: false,
            total: total.clone(),
            labels,
            metrics_address: None,
        };
        let incarnation = self.table.lock().unwrap().register(registration, self.clock);
        self.nodes
            .ledgers
            .lock()
            .unwrap()
            .insert(address.to_string(), ResourceLedger::new(total));
        self.ids.insert(address.to_string(), (node_id, incarnation));
    }

    /// Every virtual node reports its ledger, as heartbeats would.
    fn report(&mut self) {
        self.clock += Duration::from_millis(100);
        let ledgers = self.nodes.ledgers.lock().unwrap();
        let mut table = self.table.lock().unwrap();
        for (address, ledger) in ledgers.iter() {
            let (node_id, incarnation) = self.ids[address];
            let heartbeat = Heartbeat {
                node_id,
                incarnation,
                total: ledger.total().clone(),
                available: ledger.available(),
                stats: NodeStats::default(),
                demands: Vec::new(),
            };
            table.heartbeat(heartbeat, self.clock);
        }
    }

    /// The node dies: its ledger is gone and the head marks it dead.
    fn kill(&mut self, address: &str) {
        self.nodes.ledgers.lock().unwrap().remove(address);
        let (node_id, incarnation) = self.ids[address];
        self.table
            .lock()
            .unwrap()
            .unregister(node_id, incarnation, "killed by the harness");
    }

    fn address_of(&self, node_id: NodeId) -> String {
        self.ids
            .iter()
            .find(|(_, (id, _))| *id == node_id)
            .map(|(a, _)| a.clone())
            .unwrap()
    }

    async fn create(&mut self, bundles: Vec<ResourceSet>, strategy: PlacementStrategy) -> GroupRecord {
        let spec = GroupSpec {
            id: PlacementGroupId::random(),
            name: String::new(),
            bundles,
            strategy,
        };
        let record = self.groups.create(spec).await.unwrap();
        self.report();
        record
    }

    fn bundle_addresses(&self, record: &GroupRecord) -> Vec<String> {
        record
            .locations
            .iter()
            .map(|l| self.address_of(l.as_ref().expect("placed").node_id))
            .collect()
    }

    fn available_cpus(&self, address: &str) -> Amount {
        self.nodes.ledger(address, |ledger| ledger.available().get(CPU))
    }
}

fn distinct(addresses: &[String]) -> usize {
    addresses.iter().collect::<BTreeSet<_>>().len()
}

#[tokio::test]
async fn every_group_strategy_places_its_bundles_as_it_promises() {
    let mut harness = Harness::new(&[cpus(6), cpus(6), cpus(6)]);
    let spread = harness.create(vec![cpus(1); 3], PlacementStrategy::Spread).await;
    assert_eq!(spread.state, GroupState::Created);
    assert_eq!(
        distinct(&harness.bundle_addresses(&spread)),
        3,
        "SPREAD uses every node"
    );
    let pack = harness.create(vec![cpus(1); 3], PlacementStrategy::Pack).await;
    assert_eq!(distinct(&harness.bundle_addresses(&pack)), 1, "PACK fills one node");
    let strict_pack = harness.create(vec![cpus(1); 2], PlacementStrategy::StrictPack).await;
    assert_eq!(distinct(&harness.bundle_addresses(&strict_pack)), 1);
    let strict_spread = harness.create(vec![cpus(1); 3], PlacementStrategy::StrictSpread).await;
    assert_eq!(distinct(&harness.bundle_addresses(&strict_spread)), 3);
    let used: u64 = ["n0", "n1", "n2"]
        .iter()
        .map(|a| 6 - harness.available_cpus(a).as_f64() as u64)
        .sum();
    assert_eq!(used, 11, "every bundle holds its CPU on its node");
}

#[tokio::test]
async fn a_refused_reservation_releases_every_other_bundle_and_the_group_waits() {
    let mut harness = Harness::new(&[cpus(2), cpus(2), cpus(2)]);
    harness.nodes.refusing.lock().unwrap().insert("n1".into());
    let record = harness.create(vec![cpus(1); 3], PlacementStrategy::StrictSpread).await;
    assert_eq!(record.state, GroupState::Pending);
    assert!(record.reason.contains("n1"), "{}", record.reason);
    for address in ["n0", "n1", "n2"] {
        assert_eq!(
            harness.available_cpus(address),
            Amount::whole(2),
            "{address} holds no part of the group"
        );
    }
    let calls = harness.nodes.calls.lock().unwrap().clone();
    assert!(
        !calls.iter().any(|call| call.starts_with("commit")),
        "nothing is committed: {calls:?}"
    );

    harness.nodes.refusing.lock().unwrap().clear();
    harness.groups.reconcile_and_place().await;
    let record = harness.groups.record(record.spec.id).unwrap();
    assert_eq!(record.state, GroupState::Created);
    assert_eq!(distinct(&harness.bundle_addresses(&record)), 3);
}

#[tokio::test]
async fn a_group_too_big_for_free_resources_waits_and_one_too_big_for_the_nodes_is_infeasible() {
    let mut harness = Harness::new(&[cpus(2), cpus(2)]);
    let first = harness
        .create(vec![cpus(2), cpus(2)], PlacementStrategy::StrictSpread)
        .await;
    assert_eq!(first.state, GroupState::Created);
    let second = harness.create(vec![cpus(1)], PlacementStrategy::Pack).await;
    assert_eq!(second.state, GroupState::Pending, "{}", second.reason);
    let never = harness.create(vec![cpus(1); 3], PlacementStrategy::StrictSpread).await;
    assert_eq!(never.state, GroupState::Infeasible);
    assert!(never.reason.contains("needs 3 different nodes"), "{}", never.reason);

    let (_, release) = harness.groups.remove(first.spec.id).await.unwrap();
    release.await;
    harness.report();
    harness.groups.reconcile_and_place().await;
    assert_eq!(
        harness.groups.record(second.spec.id).unwrap().state,
        GroupState::Created
    );

    harness.add_node("n2", cpus(2), Labels::new());
    harness.groups.reconcile_and_place().await;
    let grown = harness.groups.record(never.spec.id).unwrap();
    assert_eq!(
        grown.state,
        GroupState::Created,
        "placed once a node joins: {}",
        grown.reason
    );
}

#[tokio::test]
async fn bundles_of_a_dead_node_are_placed_again_and_the_others_stay() {
    let mut harness = Harness::new(&[cpus(2), cpus(2), cpus(2), cpus(2)]);
    let record = harness.create(vec![cpus(1); 3], PlacementStrategy::StrictSpread).await;
    let before = harness.bundle_addresses(&record);
    let victim = before[1].clone();
    harness.kill(&victim);
    harness.groups.reconcile_and_place().await;
    let after = harness.groups.record(record.spec.id).unwrap();
    assert_eq!(after.state, GroupState::Created, "{}", after.reason);
    let after = harness.bundle_addresses(&after);
    assert_eq!(after[0], before[0]);
    assert_eq!(after[2], before[2]);
    assert!(
        !before.contains(&after[1]),
        "bundle 1 moved to the node that had none: {after:?}"
    );

    let spare = after[1].clone();
    harness.kill(&spare);
    harness.groups.reconcile_and_place().await;
    let stuck = harness.groups.record(record.spec.id).unwrap();
    assert_eq!(
        stuck.state,
        GroupState::Rescheduling,
        "no fourth node is left: {}",
        stuck.reason
    );
    assert!(stuck.reason.contains("infeasible"), "{}", stuck.reason);
}

#[tokio::test]
async fn a_removed_group_frees_its_bundles_on_every_node() {
    let mut harness = Harness::new(&[cpus(2), cpus(2)]);
    let record = harness.create(vec![cpus(2), cpus(2)], PlacementStrategy::Spread).await;
    assert_eq!(harness.available_cpus("n0"), Amount::ZERO);
    let (removed, release) = harness.groups.remove(record.spec.id).await.unwrap();
    assert_eq!(removed.state, GroupState::Removed);
    release.await;
    assert_eq!(harness.available_cpus("n0"), Amount::whole(2));
    assert_eq!(harness.available_cpus("n1"), Amount::whole(2));
    let waited = harness.groups.wait(record.spec.id, Duration::ZERO).await.unwrap();
    assert_eq!(waited.state, GroupState::Removed);
}

/// Opens the state store in `dir` once the last head's writer let go of it.
async fn reopen(dir: &std::path::Path) -> StateStore {
    for _ in 0..500 {
        if let Ok(store) = StateStore::open(dir) {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the state store in {} stays locked", dir.display());
}

#[tokio::test]
async fn a_restarted_head_frees_the_bundles_of_a_group_removed_just_before_it_died() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = Harness::new(&[cpus(2), cpus(2)]);
    let store = reopen(dir.path()).await;
    harness.groups = GroupManager::recover(harness.table.clone(), harness.nodes.clone(), store).unwrap();
    let removed = harness.create(vec![cpus(1), cpus(1)], PlacementStrategy::Spread).await;
    let (_, release) = harness.groups.remove(removed.spec.id).await.unwrap();
    drop(release);
    assert_eq!(
        harness.available_cpus("n0"),
        Amount::whole(1),
        "the head died before it freed them"
    );

    harness.groups = GroupManager::new(harness.table.clone(), harness.nodes.clone());
    let store = reopen(dir.path()).await;
    let restarted = GroupManager::recover(harness.table.clone(), harness.nodes.clone(), store).unwrap();
    assert_eq!(restarted.record(removed.spec.id).unwrap().state, GroupState::Removed);
    restarted.release_unrecorded_reservations().await;
    assert_eq!(
        harness.available_cpus("n0"),
        Amount::whole(2),
        "freed by the restarted head"
    );
    assert_eq!(harness.available_cpus("n1"), Amount::whole(2));
    drop(restarted);

    let store = reopen(dir.path()).await;
    let restarted_again = GroupManager::recover(harness.table.clone(), harness.nodes.clone(), store).unwrap();
    let calls = harness.nodes.calls.lock().unwrap().len();
    restarted_again.release_unrecorded_reservations().await;
    assert_eq!(
        harness.nodes.calls.lock().unwrap().len(),
        calls,
        "freed once, not again at every restart"
    );
}

#[tokio::test]
async fn every_task_policy_decides_over_the_heads_node_table() {
    let mut harness = Harness::new(&[resources(8, 2), resources(8, 0), resources(8, 0)]);
    let mut zone = Labels::new();
    zone.insert("zone".into(), "east".into());
    harness.add_node("n3", cpus(8), zone);
    harness.report();
    let mut table = harness.table.lock().unwrap();
    let view = table.placement_view();
    let mut placer = Placer::new(11);
    let index_of = |address: &str| (0..view.len()).find(|&i| view.node(i).address == address).unwrap();
    let mut decide = |demand: &ResourceSet, scheduling: &Scheduling| {
        let demand = view.demand(demand);
        placer.choose(
            view,
            &Request {
                demand: &demand,
                scheduling,
                preferred: None,
            },
        )
    };
    let gpu = decide(&resources(1, 1), &Scheduling::default());
    assert_eq!(gpu, Choice::Run(index_of("n0")), "GPU work goes to the GPU node");
    let spread = Scheduling {
        strategy: SchedulingStrategy::Spread,
        ..Default::default()
    };
    let picks: BTreeSet<_> = (0..4)
        .map(|_| match decide(&cpus(1), &spread) {
            Choice::Run(index) => index,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(picks.len(), 4, "SPREAD visits every node");
    let east = Scheduling {
        label_selector: LabelSelector::default().with("zone", "east").unwrap(),
        ..Default::default()
    };
    assert_eq!(decide(&cpus(1), &east), Choice::Run(index_of("n3")));
    let n2 = harness.ids["n2"].0;
    let affinity = Scheduling {
        strategy: SchedulingStrategy::NodeAffinity {
            node_id: n2,
            soft: false,
        },
        ..Default::default()
    };
    assert_eq!(decide(&cpus(1), &affinity), Choice::Run(index_of("n2")));
    assert!(matches!(
        decide(&resources(1, 4), &Scheduling::default()),
        Choice::Infeasible(_)
    ));
}

#[tokio::test]
async fn a_refusal_while_placing_lost_bundles_again_keeps_the_bundles_that_stayed() {
    let mut harness = Harness::new(&[cpus(4), cpus(4), cpus(4)]);
    let record = harness.create(vec![cpus(2); 3], PlacementStrategy::Pack).await;
    let before = harness.bundle_addresses(&record);
    assert_eq!(before[0], before[1], "PACK puts two bundles on one node: {before:?}");
    let stayed = before[2].clone();
    let spare = ["n0", "n1", "n2"]
        .into_iter()
        .find(|a| *a != before[0] && *a != stayed)
        .unwrap()
        .to_string();
    harness.kill(&before[0]);
    harness.nodes.refusing.lock().unwrap().insert(spare.clone());
    harness.groups.reconcile_and_place().await;
    let refused = harness.groups.record(record.spec.id).unwrap();
    assert_eq!(refused.state, GroupState::Rescheduling, "{}", refused.reason);
    assert_eq!(
        harness.available_cpus(&stayed),
        Amount::whole(2),
        "bundle 2 stays held on {stayed}; only the new bundle there is released"
    );

    harness.nodes.refusing.lock().unwrap().clear();
    harness.report();
    harness.groups.reconcile_and_place().await;
    let placed = harness.groups.record(record.spec.id).unwrap();
    assert_eq!(placed.state, GroupState::Created, "{}", placed.reason);
    assert_eq!(harness.bundle_addresses(&placed)[2], stayed);
    assert_eq!(harness.available_cpus(&stayed), Amount::ZERO);
    assert_eq!(harness.available_cpus(&spare), Amount::whole(2));
}
