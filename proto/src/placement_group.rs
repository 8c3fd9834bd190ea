//! Placement groups as they travel: their strategies, and the resource names
//! under which a committed bundle's resources appear on its node (as in Ray:
//! `CPU_group_2_<group>` for bundle 2, `CPU_group_<group>` for any bundle).

use std::fmt;

use crate::resources::GPU;
use crate::{Amount, Error, PlacementGroupId, ResourceSet, Result, v1};

/// Every committed bundle adds this resource, so that work in a group that
/// asks for nothing else still lands on the group's nodes.
const BUNDLE_MARKER: &str = "bundle";
/// How much of the marker one bundle adds, and one piece of work asks.
const MARKER_PER_BUNDLE: u64 = 1000;
const MARKER_PER_WORK: f64 = 0.001;

/// How a placement group's bundles are spread over nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacementStrategy {
    /// On as few nodes as fit.
    #[default]
    Pack,
    /// On as many nodes as fit.
    Spread,
    /// Every bundle on one node.
    StrictPack,
    /// Every bundle on a different node.
    StrictSpread,
}

impl PlacementStrategy {
    pub fn from_proto(strategy: v1::PlacementStrategy) -> Self {
        match strategy {
            v1::PlacementStrategy::Pack => PlacementStrategy::Pack,
            v1::PlacementStrategy::Spread => PlacementStrategy::Spread,
            v1::PlacementStrategy::StrictPack => PlacementStrategy::StrictPack,
            v1::PlacementStrategy::StrictSpread => PlacementStrategy::StrictSpread,
        }
    }

    pub fn to_proto(self) -> v1::PlacementStrategy {
        match self {
            PlacementStrategy::Pack => v1::PlacementStrategy::Pack,
            PlacementStrategy::Spread => v1::PlacementStrategy::Spread,
            PlacementStrategy::StrictPack => v1::PlacementStrategy::StrictPack,
            PlacementStrategy::StrictSpread => v1::PlacementStrategy::StrictSpread,
        }
    }
}

impl fmt::Display for PlacementStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            PlacementStrategy::Pack => "PACK",
            PlacementStrategy::Spread => "SPREAD",
            PlacementStrategy::StrictPack => "STRICT_PACK",
            PlacementStrategy::StrictSpread => "STRICT_SPREAD",
        };
        f.write_str(name)
    }
}

/// The name of resource `name` inside group `group`: of bundle `index`, or
/// of any of its bundles.
fn bundle_name(name: &str, group: PlacementGroupId, index: Option<u32>) -> String {
    match index {
        Some(index) => format!("{name}_group_{index}_{group}"),
        None => format!("{name}_group_{group}"),
    }
}

/// What a committed bundle adds to its node's total.
pub fn committed_bundle(group: PlacementGroupId, index: u32, bundle: &ResourceSet) -> ResourceSet {
    let mut added = ResourceSet::new();
    let marker = Amount::whole(MARKER_PER_BUNDLE);
    for (name, amount) in bundle.iter().chain([(BUNDLE_MARKER, marker)]) {
        added.set(&bundle_name(name, group, Some(index)), amount);
        added.set(&bundle_name(name, group, None), amount);
    }
    added
}

/// What work in bundle `index` of `group` (or in any of its bundles) asks
/// for instead of `demand`.
pub fn demand_in_bundle(group: PlacementGroupId, index: Option<u32>, demand: &ResourceSet) -> Result<ResourceSet> {
    let mut renamed = ResourceSet::new();
    let marker = Amount::parse(BUNDLE_MARKER, MARKER_PER_WORK)?;
    for (name, amount) in demand.iter().chain([(BUNDLE_MARKER, marker)]) {
        renamed.set(&bundle_name(name, group, None), amount);
        if index.is_some() {
            renamed.set(&bundle_name(name, group, index), amount);
        }
    }
    Ok(renamed)
}

/// The GPUs `demand` asks for, directly or inside a bundle: either way the
/// work is given GPU ids.
pub fn gpus_asked(demand: &ResourceSet) -> Amount {
    let in_bundles = demand
        .iter()
        .filter(|(name, _)| {
            name.strip_prefix("GPU_group_")
                .is_some_and(|group| !group.contains('_'))
        })
        .fold(Amount::ZERO, |sum, (_, amount)| sum + amount);
    demand.get(GPU) + in_bundles
}

/// Whether `name` is a resource that a committed bundle made.
pub fn is_bundle_resource(name: &str) -> bool {
    name.contains("_group_")
}

/// Whether `name` is a resource of a bundle of `group`.
pub fn is_of_group(name: &str, group: PlacementGroupId) -> bool {
    is_bundle_resource(name) && name.ends_with(&group.to_string())
}

/// Checks bundles as a user gave them: at least one, none empty.
pub fn check_bundles(bundles: &[ResourceSet]) -> Result<()> {
    if bundles.is_empty() {
        return Err(Error::InvalidArgument(
            "a placement group needs at least one bundle".into(),
        ));
    }
    if let Some(index) = bundles.iter().position(ResourceSet::is_empty) {
        return Err(Error::InvalidArgument(format!(
            "bundle {index} of the placement group asks for no resources; every bundle needs some"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::CPU;

    #[test]
    fn work_in_a_bundle_asks_for_what_the_committed_bundle_adds() {
        let group = PlacementGroupId::random();
        let bundle = ResourceSet::new()
            .with(CPU, Amount::whole(2))
            .with(GPU, Amount::whole(1));
        let node = committed_bundle(group, 1, &bundle);
        let half = ResourceSet::new()
            .with(CPU, Amount::whole(1))
            .with(GPU, Amount::parse(GPU, 0.5).unwrap());
        for index in [Some(1), None] {
            let demand = demand_in_bundle(group, index, &half).unwrap();
            assert!(node.fits(&demand), "{demand:?} in {node:?}");
            assert_eq!(gpus_asked(&demand), Amount::parse(GPU, 0.5).unwrap());
            assert!(demand.iter().all(|(name, _)| is_of_group(name, group)));
        }
        let other_bundle = demand_in_bundle(group, Some(0), &half).unwrap();
        assert!(!node.fits(&other_bundle));
        let empty = demand_in_bundle(group, None, &ResourceSet::new()).unwrap();
        assert!(node.fits(&empty), "work that asks nothing still needs the group's node");
    }

    #[test]
    fn bundles_must_be_given_and_ask_for_something() {
        assert!(check_bundles(&[]).is_err());
        let error = check_bundles(&[ResourceSet::new().with(CPU, Amount::whole(1)), ResourceSet::new()]).unwrap_err();
        assert!(error.to_string().contains("bundle 1"), "{error}");
    }
}
