//! Placement group bundle operations as the head sends them, decoded and
//! checked before the node applies any.

use raylet_proto::v1::{BundleOp, BundleOpKind};
use raylet_proto::{Error, PlacementGroupId, ResourceSet};

/// Why the node refused one bundle operation; the head gets its text.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The operation did not decode.
    #[error(transparent)]
    Malformed(#[from] Error),
    /// The new bundles do not fit together in what the node has free now.
    #[error("the {count} bundles do not fit in what the node has free now")]
    DoNotFit { count: usize },
    /// A bundle to commit was never reserved here.
    #[error("bundle {index} of placement group {group} is not reserved here")]
    NotReserved { group: PlacementGroupId, index: u32 },
}

/// One operation on a group's bundles on this node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BundleOperation {
    /// Set the bundles aside, all or none; with `commit`, offer them at once.
    Reserve {
        group: PlacementGroupId,
        bundles: Vec<(u32, ResourceSet)>,
        commit: bool,
    },
    /// Offer reserved bundles to work in the group.
    Commit { group: PlacementGroupId, indexes: Vec<u32> },
    /// Free the bundles (all of the group's here when `indexes` is empty).
    Release { group: PlacementGroupId, indexes: Vec<u32> },
}

impl BundleOperation {
    /// Reads one operation off the wire; a malformed one is refused alone.
    pub(crate) fn decode(op: BundleOp) -> Result<Self, Error> {
        let group = PlacementGroupId::from_wire(&op.placement_group_id)?;
        let indexes = || op.bundles.iter().map(|bundle| bundle.index).collect();
        match op.kind() {
            BundleOpKind::Reserve => {
                let bundles = op
                    .bundles
                    .iter()
                    .map(|bundle| {
                        let resources = bundle.resources.clone().unwrap_or_default();
                        Ok((bundle.index, ResourceSet::from_proto(&resources)?))
                    })
                    .collect::<Result<_, Error>>()?;
                Ok(BundleOperation::Reserve {
                    group,
                    bundles,
                    commit: op.commit,
                })
            }
            BundleOpKind::Commit => Ok(BundleOperation::Commit {
                group,
                indexes: indexes(),
            }),
            BundleOpKind::Release => Ok(BundleOperation::Release {
                group,
                indexes: indexes(),
            }),
            BundleOpKind::Unspecified => Err(Error::InvalidArgument(format!(
                "bundle operation {} for placement group {group} is not one this node knows",
                op.kind
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use raylet_proto::v1::Bundle;

    use super::*;

    fn op(kind: BundleOpKind, group: &[u8]) -> BundleOp {
        BundleOp {
            kind: kind as i32,
            placement_group_id: group.to_vec(),
            bundles: vec![Bundle {
                index: 2,
                resources: None,
            }],
            commit: false,
        }
    }

    #[test]
    fn operations_decode_and_malformed_ones_are_refused_with_a_reason() {
        let group = PlacementGroupId::random();
        let release = BundleOperation::decode(op(BundleOpKind::Release, group.as_bytes())).unwrap();
        assert_eq!(
            release,
            BundleOperation::Release {
                group,
                indexes: vec![2]
            }
        );
        let unknown = BundleOperation::decode(op(BundleOpKind::Unspecified, group.as_bytes())).unwrap_err();
        assert!(unknown.to_string().contains("not one this node knows"), "{unknown}");
        assert!(BundleOperation::decode(op(BundleOpKind::Commit, b"short")).is_err());
        let mut garbage = op(BundleOpKind::Reserve, group.as_bytes());
        garbage.kind = 99;
        assert!(BundleOperation::decode(garbage).is_err());
    }
}
