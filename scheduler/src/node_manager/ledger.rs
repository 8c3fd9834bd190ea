//! Resource accounting of one node: which worker holds which lease, and what
//! is left. A worker blocked in `get()` gives its CPUs back until it resumes.

use std::collections::HashMap;

use raylet_proto::resources::CPU;
use raylet_proto::{Amount, ResourceSet, WorkerId};

#[derive(Clone, Debug)]
struct Holding {
    demand: ResourceSet,
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

/// The node's total resources and every worker's holding.
#[derive(Clone, Debug)]
pub struct ResourceLedger {
    total: ResourceSet,
    holdings: HashMap<WorkerId, Holding>,
}

impl ResourceLedger {
    pub fn new(total: ResourceSet) -> Self {
        ResourceLedger {
            total,
            holdings: HashMap::new(),
        }
    }

    pub fn total(&self) -> &ResourceSet {
        &self.total
    }

    /// Total minus what every unblocked holding counts. A resumed worker may
    /// push a resource past zero for a while; it shows as zero.
    pub fn available(&self) -> ResourceSet {
        let mut used = ResourceSet::new();
        self.holdings.values().for_each(|h| used.add(&h.counted()));
        let mut available = ResourceSet::new();
        for (name, amount) in self.total.iter() {
            available.set(name, amount - used.get(name));
        }
        available
    }

    /// Whether `demand` fits in what is available now.
    pub fn fits_now(&self, demand: &ResourceSet) -> bool {
        self.available().fits(demand)
    }

    /// Whether `demand` could ever fit on this node.
    pub fn feasible(&self, demand: &ResourceSet) -> bool {
        self.total.fits(demand)
    }

    /// Records that `worker` holds `demand`. The caller checked it fits.
    pub fn hold(&mut self, worker: WorkerId, demand: ResourceSet) {
        self.holdings.insert(worker, Holding { demand, blocked: false });
    }

    /// Changes what `worker` holds, e.g. once an actor placed with a CPU
    /// runs holding none.
    pub fn resize(&mut self, worker: WorkerId, demand: ResourceSet) {
        if let Some(holding) = self.holdings.get_mut(&worker) {
            holding.demand = demand;
        }
    }

    /// Gives back what `worker` holds.
    pub fn release(&mut self, worker: WorkerId) {
        self.holdings.remove(&worker);
    }

    /// Marks `worker` as blocked (its CPUs count as free) or resumed.
    pub fn set_blocked(&mut self, worker: WorkerId, blocked: bool) {
        if let Some(holding) = self.holdings.get_mut(&worker) {
            holding.blocked = blocked;
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
