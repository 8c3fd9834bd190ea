//! The demand a round plans for: pending tasks and actors counted by shape
//! (resources and label selector), and placement groups waiting for room;
//! with the words that describe them in reasons.

use raylet_proto::resources::is_bytes;
use raylet_proto::{Amount, LabelSelector, PlacementStrategy, ResourceSet};

/// Everything waiting for resources.
#[derive(Clone, Debug, Default)]
pub struct Demand {
    /// Pending work counted by shape; each (resources, selector) once.
    pub shapes: Vec<ShapeDemand>,
    pub groups: Vec<GroupDemand>,
}

/// `count` tasks or actors that each need `resources` on a node whose
/// labels satisfy `selector`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeDemand {
    pub resources: ResourceSet,
    pub selector: LabelSelector,
    pub count: u64,
}

/// `count` placement groups with the same bundles and strategy, waiting
/// for room; each gets room for all its bundles, or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDemand {
    /// The first group's name, to name them all in reasons.
    pub name: String,
    /// The bundles still to place (a rescheduled group lists those it lost).
    pub bundles: Vec<ResourceSet>,
    pub strategy: PlacementStrategy,
    pub count: u64,
}

impl Demand {
    /// Tasks, actors and bundles waiting, all together.
    pub fn pending(&self) -> u64 {
        let bundles: u64 = self
            .groups
            .iter()
            .map(|group| group.bundles.len() as u64 * group.count)
            .sum();
        self.shapes.iter().map(|shape| shape.count).sum::<u64>() + bundles
    }
}

impl ShapeDemand {
    /// E.g. `{CPU: 1, GPU: 1} on zone=a`.
    pub fn describe(&self) -> String {
        match self.selector.is_empty() {
            true => describe_resources(&self.resources),
            false => format!("{} on {}", describe_resources(&self.resources), self.selector),
        }
    }
}

impl GroupDemand {
    /// E.g. `placement group 'trainers' (4 bundles, STRICT_SPREAD)`, or
    /// `3 placement groups like 'trainers' (4 bundles each, STRICT_SPREAD)`.
    pub fn describe(&self) -> String {
        let (name, bundles, strategy) = (&self.name, self.bundles.len(), self.strategy);
        match self.count {
            1 => format!("placement group '{name}' ({bundles} bundles, {strategy})"),
            count => format!("{count} placement groups like '{name}' ({bundles} bundles each, {strategy})"),
        }
    }
}

/// E.g. `{CPU: 1, memory: 4 GiB}`.
fn describe_resources(resources: &ResourceSet) -> String {
    let parts: Vec<String> = resources
        .iter()
        .map(|(name, amount)| format!("{name}: {}", describe_amount(name, amount)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

fn describe_amount(name: &str, amount: Amount) -> String {
    let value = amount.as_f64();
    match is_bytes(name) && value >= (1u64 << 30) as f64 {
        true => format!("{} GiB", round_to_hundredths(value / (1u64 << 30) as f64)),
        false => round_to_hundredths(value),
    }
}

/// `2`, `0.5` or `1.33`: no trailing zeros.
fn round_to_hundredths(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
