//! The demand resolved for packing: each shape and each group's bundles as
//! needs over the round's resource indices, ordered largest first (first
//! fit decreasing), and the floors, the least of what is still to pack,
//! below which a node is of no more use this round.

use std::cmp::Reverse;

use raylet_proto::PlacementStrategy;

use super::compat::{SelectorId, Selectors};
use super::demand::Demand;
use super::dense::{self, Names, Need};

/// A shape of pending work.
pub(super) struct ShapeItem {
    /// Its place in the round's demand.
    pub index: usize,
    /// `None`: it names a resource no node or type has.
    pub need: Option<Need>,
    pub selector: SelectorId,
    pub count: u64,
    /// Whether some node type could hold one copy, were it launched.
    pub feasible: bool,
}

/// A placement group waiting for room.
pub(super) struct GroupItem {
    pub index: usize,
    /// Largest first; STRICT_PACK's bundles summed into one. `None`: a
    /// bundle names a resource no node or type has.
    pub bundles: Option<Vec<Need>>,
    pub strategy: PlacementStrategy,
    /// Groups with these bundles, each placed all or nothing on its own.
    pub count: u64,
    /// Whether node types could hold every bundle, were they launched.
    pub feasible: bool,
}

/// The demand's shapes, with selectors interned into `selectors`.
pub(super) fn shapes<'a>(demand: &'a Demand, names: &Names, selectors: &mut Selectors<'a>) -> Vec<ShapeItem> {
    demand
        .shapes
        .iter()
        .enumerate()
        .filter(|(_, shape)| shape.count > 0)
        .map(|(index, shape)| ShapeItem {
            index,
            need: names.need(&shape.resources),
            selector: selectors.id(&shape.selector),
            count: shape.count,
            feasible: false,
        })
        .collect()
}

/// The demand's groups, bundles ordered largest first by `scale`.
pub(super) fn groups(demand: &Demand, names: &Names, scale: &[f64]) -> Vec<GroupItem> {
    demand
        .groups
        .iter()
        .enumerate()
        .filter(|(_, group)| group.count > 0 && !group.bundles.is_empty())
        .map(|(index, group)| {
            let needs: Option<Vec<Need>> = group.bundles.iter().map(|bundle| names.need(bundle)).collect();
            let bundles = needs.map(|mut needs| match group.strategy {
                PlacementStrategy::StrictPack => vec![summed(&needs)],
                _ => {
                    needs.sort_by_cached_key(|need| Reverse(size(need, scale).to_bits()));
                    needs
                }
            });
            GroupItem {
                index,
                bundles,
                strategy: group.strategy,
                count: group.count,
                feasible: false,
            }
        })
        .collect()
}

/// Orders shapes largest first, ties in the demand's order. (A size is
/// never negative, so its bits order as it does.)
pub(super) fn order_largest_first(shapes: &mut [ShapeItem], scale: &[f64]) {
    let size_of = |shape: &ShapeItem| shape.need.as_ref().map_or(0.0, |need| size(need, scale)).to_bits();
    shapes.sort_by_cached_key(|shape| (Reverse(size_of(shape)), shape.index));
}

/// For every `i`, the least of the shapes from `i` on, `stride` amounts
/// each, `shapes.len() + 1` floors in all; the last is above everything.
pub(super) fn suffix_floors(shapes: &[ShapeItem], stride: usize) -> Vec<i64> {
    let mut floors = vec![i64::MAX; (shapes.len() + 1) * stride];
    for (i, shape) in shapes.iter().enumerate().rev() {
        let (head, tail) = floors.split_at_mut((i + 1) * stride);
        let floor = &mut head[i * stride..];
        floor.copy_from_slice(&tail[..stride]);
        if let Some(need) = &shape.need {
            dense::lower_to(floor, need);
        }
    }
    floors
}

/// The least of every group's bundles and of `shapes_floor`.
pub(super) fn group_floor(groups: &[GroupItem], shapes_floor: &[i64]) -> Vec<i64> {
    let mut floor = shapes_floor.to_vec();
    for bundle in groups.iter().filter_map(|group| group.bundles.as_ref()).flatten() {
        dense::lower_to(&mut floor, bundle);
    }
    floor
}

/// A need's size for ordering: its amounts, each scaled by the largest
/// amount of that resource any node or type has.
pub(super) fn size(need: &Need, scale: &[f64]) -> f64 {
    need.iter()
        .map(|&(resource, amount)| amount as f64 / scale[resource])
        .sum()
}

/// The amounts of all `needs` added up.
fn summed(needs: &[Need]) -> Need {
    let mut sum: Need = Vec::new();
    for &(resource, amount) in needs.iter().flatten() {
        match sum.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, total)) => *total += amount,
            None => sum.push((resource, amount)),
        }
    }
    sum
}
