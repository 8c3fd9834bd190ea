//! Resource accounting of one node: which worker holds which lease, which
//! GPU ids it was given, which placement group bundles are reserved here
//! (their resources set aside, and once committed offered under the
//! bundles' own names), and what is left. A worker blocked in `get()` gives
//! its CPUs back until it resumes.

use std::collections::HashMap;

use raylet_proto::placement_group::{committed_bundle, gpus_asked, is_of_group};
use raylet_proto::resources::{CPU, GPU};
use raylet_proto::{Amount, PlacementGroupId, ResourceSet, WorkerId};

use super::bundle_ops::BundleError;
use super::gpus::GpuPool;

#[derive(Clone, Debug)]
struct Holding {
    demand: ResourceSet,
    gpu_ids: Vec<u32>,
    blocked: bool,
}

impl Holding {
    /// What the holding counts against the node right now.
    fn counted(&self) -> ResourceSet {
        let mut counted = self.demand.clone();
        if self.blocked {
            counted.set(CPU, Amount::ZERO);
        }
        counted
    }
}

/// A placement group bundle reserved on this node.
#[derive(Clone, Debug)]
struct Reservation {
    resources: ResourceSet,
    committed: bool,
}

/// The node's total resources and every worker's holding.
#[derive(Clone, Debug)]
pub struct ResourceLedger {
    /// What the node offers, without bundles.
    machine: ResourceSet,
    /// The machine's resources plus those of committed bundles.
    total: ResourceSet,
    /// What every unblocked holding and every bundle counts, kept as they
    /// change so that a fit is checked without a pass over every bundle.
    used: ResourceSet,
    holdings: HashMap<WorkerId, Holding>,
    bundles: HashMap<(PlacementGroupId, u32), Reservation>,
    gpus: GpuPool,
}

impl ResourceLedger {
    pub fn new(total: ResourceSet) -> Self {
        ResourceLedger {
            gpus: GpuPool::new(total.get(GPU)),
            machine: total.clone(),
            total,
            used: ResourceSet::new(),
            holdings: HashMap::new(),
            bundles: HashMap::new(),
        }
    }

    pub fn total(&self) -> &ResourceSet {
        &self.total
    }

    /// What is free of the machine's resources: their total minus what
    /// every unblocked holding and every bundle counts. A resumed worker may
    /// push a resource past zero for a while; it shows as zero. Bundles'
    /// own names are left out.
    pub fn available(&self) -> ResourceSet {
        let mut available = ResourceSet::new();
        for (name, amount) in self.machine.iter() {
            available.set(name, amount - self.used.get(name));
        }
        available
    }

    /// Whether `demand` fits in what is free now, bundles' names included.
    fn fits_free(&self, demand: &ResourceSet) -> bool {
        demand
            .iter()
            .all(|(name, amount)| self.total.get(name) - self.used.get(name) >= amount)
    }

    /// Whether `demand` fits in what is available now, its GPUs included:
    /// a fraction must fit on one GPU, whole GPUs must be wholly free.
    pub fn fits_now(&self, demand: &ResourceSet) -> bool {
        self.fits_free(demand) && self.gpu_ids_for(demand).is_some()
    }

    /// The GPU ids that `demand` would be given now.
    pub fn gpu_ids_for(&self, demand: &ResourceSet) -> Option<Vec<u32>> {
        self.gpus.assignment(gpus_asked(demand))
    }

    /// Whether `demand` could ever fit on this node.
    pub fn feasible(&self, demand: &ResourceSet) -> bool {
        self.total.fits(demand)
    }

    /// Records that `worker` holds `demand` and returns the GPU ids it is
    /// given. The caller checked that it fits.
    pub fn hold(&mut self, worker: WorkerId, demand: ResourceSet) -> Vec<u32> {
        self.release(worker);
        let gpu_ids = self.gpus.take(gpus_asked(&demand));
        self.used.add(&demand);
        let holding = Holding {
            demand,
            gpu_ids: gpu_ids.clone(),
            blocked: false,
        };
        self.holdings.insert(worker, holding);
        gpu_ids
    }

    /// Changes what `worker` holds, e.g. once an actor placed with a CPU
    /// runs holding none. Its GPU ids stay as they are.
    pub fn resize(&mut self, worker: WorkerId, demand: ResourceSet) {
        if let Some(holding) = self.holdings.get_mut(&worker) {
            self.used.subtract(&holding.counted());
            holding.demand = demand;
            self.used.add(&holding.counted());
        }
    }

    /// Gives back what `worker` holds.
    pub fn release(&mut self, worker: WorkerId) {
        if let Some(holding) = self.holdings.remove(&worker) {
            self.used.subtract(&holding.counted());
            self.gpus.give_back(&holding.gpu_ids, gpus_asked(&holding.demand));
        }
    }

    /// Sets aside the resources of `bundles` of `group`, all of them or,
    /// when they do not fit together now, none. Bundles already here stay.
    pub fn reserve_bundles(
        &mut self,
        group: PlacementGroupId,
        bundles: &[(u32, ResourceSet)],
    ) -> Result<(), BundleError> {
        let mut needed = ResourceSet::new();
        let new: Vec<&(u32, ResourceSet)> = bundles
            .iter()
            .filter(|(index, _)| !self.bundles.contains_key(&(group, *index)))
            .collect();
        new.iter().for_each(|(_, resources)| needed.add(resources));
        if !self.fits_free(&needed) {
            return Err(BundleError::DoNotFit { count: new.len() });
        }
        self.used.add(&needed);
        for (index, resources) in new {
            let reservation = Reservation {
                resources: resources.clone(),
                committed: false,
            };
            self.bundles.insert((group, *index), reservation);
        }
        Ok(())
    }

    /// Offers reserved bundles' resources under their own names.
    pub fn commit_bundles(&mut self, group: PlacementGroupId, indexes: &[u32]) -> Result<(), BundleError> {
        if let Some(index) = indexes.iter().find(|i| !self.bundles.contains_key(&(group, **i))) {
            return Err(BundleError::NotReserved { group, index: *index });
        }
        for index in indexes {
            if let Some(reservation) = self.bundles.get_mut(&(group, *index))
                && !reservation.committed
            {
                reservation.committed = true;
                self.total.add(&committed_bundle(group, *index, &reservation.resources));
            }
        }
        Ok(())
    }

    /// Frees the bundles of `group` with these indexes (all when empty) and
    /// returns the workers that hold leases in the group, for the caller to end.
    pub fn release_bundles(&mut self, group: PlacementGroupId, indexes: &[u32]) -> Vec<WorkerId> {
        let released: Vec<(u32, Reservation)> = self
            .bundles
            .extract_if(|(g, index), _| *g == group && (indexes.is_empty() || indexes.contains(index)))
            .map(|((_, index), reservation)| (index, reservation))
            .collect();
        for (index, reservation) in &released {
            self.used.subtract(&reservation.resources);
            if reservation.committed {
                self.total
                    .subtract(&committed_bundle(group, *index, &reservation.resources));
            }
        }
        let in_group = |holding: &Holding| holding.demand.iter().any(|(name, _)| is_of_group(name, group));
        let workers: Vec<WorkerId> = self
            .holdings
            .iter()
            .filter(|(_, holding)| in_group(holding))
            .map(|(worker, _)| *worker)
            .collect();
        workers.iter().for_each(|worker| self.release(*worker));
        workers
    }

    /// What the node reports to the head: its machine's resources and what
    /// of them is free. Bundles' own names stay on the node: work in a
    /// bundle is sent straight to it.
    pub fn reported(&self) -> (ResourceSet, ResourceSet) {
        (self.machine.clone(), self.available())
    }

    /// Marks `worker` as blocked (its CPUs count as free) or resumed.
    pub fn set_blocked(&mut self, worker: WorkerId, blocked: bool) {
        if let Some(holding) = self.holdings.get_mut(&worker) {
            self.used.subtract(&holding.counted());
            holding.blocked = blocked;
            self.used.add(&holding.counted());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: f64) -> ResourceSet {
        ResourceSet::new().with(CPU, Amount::parse(CPU, n).unwrap())
    }

    #[test]
    fn holdings_subtract_and_releases_give_back() {
        let mut ledger = ResourceLedger::new(cpus(2.0));
        let (a, b) = (WorkerId::random(), WorkerId::random());
        assert!(ledger.fits_now(&cpus(1.0)));
        ledger.hold(a, cpus(1.0));
        ledger.hold(b, cpus(1.0));
        assert!(!ledger.fits_now(&cpus(0.5)));
        assert!(ledger.feasible(&cpus(2.0)));
        assert!(!ledger.feasible(&cpus(3.0)));
        ledger.release(a);
        assert_eq!(ledger.available(), cpus(1.0));
    }

    #[test]
    fn gpu_holdings_get_ids_and_fractions_share_one_until_it_is_full() {
        let gpus = |n: f64| ResourceSet::new().with(GPU, Amount::parse(GPU, n).unwrap());
        let mut ledger = ResourceLedger::new(gpus(2.0));
        let halves: Vec<Vec<u32>> = (0..4).map(|_| ledger.hold(WorkerId::random(), gpus(0.5))).collect();
        assert_eq!(halves, [vec![0], vec![0], vec![1], vec![1]]);
        assert!(!ledger.fits_now(&gpus(0.5)));
        let mut ledger = ResourceLedger::new(gpus(2.0));
        let quarter = WorkerId::random();
        ledger.hold(quarter, gpus(0.25));
        assert!(!ledger.fits_now(&gpus(2.0)), "one id is partly used");
        assert_eq!(ledger.hold(WorkerId::random(), gpus(1.0)), [1]);
        ledger.release(quarter);
        assert_eq!(ledger.gpu_ids_for(&gpus(1.0)), Some(vec![0]));
    }

    #[test]
    fn bundles_are_reserved_all_or_none_then_offered_under_their_names_until_released() {
        let mut ledger = ResourceLedger::new(cpus(4.0));
        let group = PlacementGroupId::random();
        let too_much = [(0, cpus(3.0)), (1, cpus(2.0))];
        assert!(matches!(
            ledger.reserve_bundles(group, &too_much),
            Err(BundleError::DoNotFit { count: 2 })
        ));
        assert_eq!(ledger.available(), cpus(4.0), "nothing is held after a refusal");
        ledger
            .reserve_bundles(group, &[(0, cpus(1.0)), (1, cpus(2.0))])
            .unwrap();
        assert_eq!(ledger.available(), cpus(1.0));
        let in_bundle = raylet_proto::placement_group::demand_in_bundle(group, Some(1), &cpus(2.0)).unwrap();
        assert!(!ledger.fits_now(&in_bundle), "reserved is not yet committed");
        assert!(matches!(
            ledger.commit_bundles(group, &[0, 2]),
            Err(BundleError::NotReserved { index: 2, .. })
        ));
        ledger.commit_bundles(group, &[0, 1]).unwrap();
        assert!(ledger.fits_now(&in_bundle));
        let worker = WorkerId::random();
        ledger.hold(worker, in_bundle.clone());
        assert!(!ledger.fits_now(&in_bundle));
        assert_eq!(ledger.release_bundles(group, &[]), [worker]);
        assert_eq!(ledger.available(), cpus(4.0));
        assert_eq!(ledger.total(), &cpus(4.0));
    }

    #[test]
    fn a_resized_holding_counts_its_new_demand() {
        let mut ledger = ResourceLedger::new(cpus(2.0));
        let actor = WorkerId::random();
        ledger.hold(actor, cpus(1.0));
        ledger.resize(actor, ResourceSet::new());
        assert_eq!(ledger.available(), cpus(2.0));
        ledger.resize(WorkerId::random(), cpus(2.0));
        assert_eq!(ledger.available(), cpus(2.0), "an unknown worker changes nothing");
    }

    #[test]
    fn a_blocked_worker_lends_its_cpus_until_it_resumes() {
        let mut ledger = ResourceLedger::new(cpus(1.0));
        let (outer, inner) = (WorkerId::random(), WorkerId::random());
        ledger.hold(outer, cpus(1.0));
        ledger.set_blocked(outer, true);
        assert!(ledger.fits_now(&cpus(1.0)));
        ledger.hold(inner, cpus(1.0));
        ledger.set_blocked(outer, false);
        assert!(!ledger.fits_now(&cpus(0.1)), "oversubscribed while both run");
        assert_eq!(ledger.available(), ResourceSet::new());
        ledger.release(inner);
        assert!(!ledger.fits_now(&cpus(0.1)));
        ledger.release(outer);
        assert_eq!(ledger.available(), cpus(1.0));
    }
}
