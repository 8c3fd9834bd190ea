//! The nodes an autoscaler could launch: its node types' resources and
//! labels. Work that no alive node can ever fit, but one of these could,
//! waits for the launch instead of failing as infeasible; the head sends
//! the list to every node manager with its view of the cluster.

use raylet_proto::scheduling::{labels_from_proto, labels_to_proto};
use raylet_proto::v1::NodeResources;
use raylet_proto::{LabelSelector, Labels, PlacementStrategy, ResourceSet, Result};

use super::Choice;

/// One node type as placement sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchableNode {
    /// The node type's name.
    pub name: String,
    pub total: ResourceSet,
    pub labels: Labels,
}

/// The node types an autoscaler may launch; empty without an autoscaler.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchableNodes(Vec<LaunchableNode>);

impl LaunchableNodes {
    pub fn new(nodes: Vec<LaunchableNode>) -> Self {
        LaunchableNodes(nodes)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first type that can hold `demand` on its own with labels that
    /// satisfy `selector`.
    pub fn fitting(&self, demand: &ResourceSet, selector: &LabelSelector) -> Option<&LaunchableNode> {
        self.0
            .iter()
            .find(|node| node.total.fits(demand) && selector.matches(&node.labels))
    }

    /// Whether launched nodes could hold a placement group's bundles: each
    /// on a type of its own, or all on one type for STRICT_PACK.
    pub fn fits_group(&self, bundles: &[ResourceSet], strategy: PlacementStrategy) -> bool {
        let anywhere = LabelSelector::default();
        match strategy {
            PlacementStrategy::StrictPack => {
                let mut together = ResourceSet::new();
                bundles.iter().for_each(|bundle| together.add(bundle));
                self.fitting(&together, &anywhere).is_some()
            }
            _ => bundles.iter().all(|bundle| self.fitting(bundle, &anywhere).is_some()),
        }
    }

    /// The wire form: one [`NodeResources`] per type, named in `address`.
    pub fn to_proto(&self) -> Vec<NodeResources> {
        let encode = |node: &LaunchableNode| NodeResources {
            node_id: Vec::new(),
            address: node.name.clone(),
            total: Some(node.total.to_proto()),
            available: None,
            labels: labels_to_proto(&node.labels),
        };
        self.0.iter().map(encode).collect()
    }

    pub fn from_proto(nodes: &[NodeResources]) -> Result<Self> {
        let decode = |node: &NodeResources| -> Result<LaunchableNode> {
            Ok(LaunchableNode {
                name: node.address.clone(),
                total: ResourceSet::from_proto(&node.total.clone().unwrap_or_default())?,
                labels: labels_from_proto(&node.labels)?,
            })
        };
        Ok(LaunchableNodes(nodes.iter().map(decode).collect::<Result<_>>()?))
    }

    /// `choice`, unless it is infeasible while a type could hold `demand`
    /// on labels that satisfy `selector`: then the work awaits a launch.
    pub fn await_launch(&self, choice: Choice, demand: &ResourceSet, selector: &LabelSelector) -> Choice {
        match choice {
            Choice::Infeasible(reason) => match self.fitting(demand, selector) {
                Some(node) => Choice::AwaitLaunch(await_reason(node, &reason)),
                None => Choice::Infeasible(reason),
            },
            other => other,
        }
    }
}

/// Says which type work that no alive node fits waits for.
pub fn await_reason(node: &LaunchableNode, infeasible: &str) -> String {
    format!(
        "waiting for the autoscaler to launch a node of type '{}' ({})",
        node.name,
        infeasible.trim_start_matches("infeasible: ")
    )
}

#[cfg(test)]
mod tests {
    use raylet_proto::Amount;

    use super::*;

    fn cpus(n: u64) -> ResourceSet {
        ResourceSet::new().with("CPU", Amount::whole(n))
    }

    fn types() -> LaunchableNodes {
        LaunchableNodes::new(vec![
            LaunchableNode {
                name: "cpu8".into(),
                total: cpus(8),
                labels: Labels::from([("pool".to_string(), "big".to_string())]),
            },
            LaunchableNode {
                name: "cpu2".into(),
                total: cpus(2),
                labels: Labels::new(),
            },
        ])
    }

    #[test]
    fn work_fits_a_type_with_room_and_matching_labels() {
        let types = types();
        let anywhere = LabelSelector::default();
        assert_eq!(types.fitting(&cpus(8), &anywhere).unwrap().name, "cpu8");
        assert!(types.fitting(&cpus(9), &anywhere).is_none());
        let small_pool = LabelSelector::default().with("pool", "small").unwrap();
        assert!(types.fitting(&cpus(1), &small_pool).is_none());
        let gpu = ResourceSet::new().with("GPU", Amount::whole(1));
        assert!(types.fitting(&gpu, &anywhere).is_none());
    }

    #[test]
    fn strict_pack_needs_one_type_for_all_bundles_and_others_one_per_bundle() {
        let types = types();
        let bundles = vec![cpus(4), cpus(4), cpus(4)];
        assert!(!types.fits_group(&bundles, PlacementStrategy::StrictPack));
        assert!(types.fits_group(&bundles, PlacementStrategy::StrictSpread));
        assert!(types.fits_group(&bundles[..2], PlacementStrategy::StrictPack));
        assert!(!types.fits_group(&[cpus(16)], PlacementStrategy::Pack));
    }

    #[test]
    fn the_wire_form_keeps_names_resources_and_labels() {
        let types = types();
        assert_eq!(LaunchableNodes::from_proto(&types.to_proto()).unwrap(), types);
    }
}
