//! Packing a round's demand: min_count launches first, then placement
//! groups in the demand's order, each all or nothing, then shapes largest
//! first. Demand goes on nodes that have room (first fit); what does not
//! fit launches nodes of the type [`Round::choose_type`] picks, and
//! whatever a launch cannot hold waits with the limit that stopped it.

use std::cmp::Reverse;
use std::ops::Range;

use raylet_proto::PlacementStrategy;

use super::capacity::Capacity;
use super::compat::SelectorId;
use super::dense::{self, Need};
use super::items::{self, GroupItem, ShapeItem};
use super::launches::{self, Cause, LaunchEvent};
use super::plan::{DemandRef, Plan, Removal, Unmet, UnmetReason};
use super::round::Round;

/// A type chosen for a need, and how many copies one node of it holds.
struct Choice {
    node_type: usize,
    copies: u64,
}

/// How a type ranks for a need, lowest first: the share of a node it
/// leaves unused (in billionths), then the copies a node holds (most
/// first), then its rank by size.
type Preference = (u64, Reverse<u64>, u32);

impl Round<'_> {
    /// Launches every type below its min_count up to it, demand or not.
    pub fn launch_minimums(&mut self) {
        for t in 0..self.types.len() {
            let min = self.config.node_types[t].min_count;
            let had = self.live[t];
            if had >= min || self.backing_off[t] {
                continue;
            }
            let nodes = (min - had).min(self.limits.most(t));
            if nodes > 0 {
                self.launch(t, nodes, Cause::Minimum { had });
            }
        }
    }

    /// Packs the groups, then the shapes.
    pub fn pack(&mut self) {
        let floors = items::suffix_floors(&self.shapes, self.stride);
        let group_floor = items::group_floor(&self.groups, &floors[..self.stride]);
        self.capacity.prune(&group_floor);
        for group in std::mem::take(&mut self.groups) {
            self.place_group(&group, &group_floor);
        }
        let shapes = std::mem::take(&mut self.shapes);
        for (i, shape) in shapes.iter().enumerate() {
            let floor = &floors[(i + 1) * self.stride..(i + 2) * self.stride];
            self.place_shape(shape, floor);
        }
    }

    /// Whether demand was packed onto node `view` of the cluster view.
    pub fn touched_view(&self, view: usize) -> bool {
        self.capacity_of_view[view].is_some_and(|node| self.capacity.touched(node))
    }

    pub fn into_plan(self, removals: Vec<Removal>) -> Plan {
        Plan {
            launches: launches::merge(&self.events, self.config, self.demand),
            removals,
            unmet: self.unmet,
            fits_existing: self.fits_existing,
        }
    }

    fn place_shape(&mut self, shape: &ShapeItem, floor: &[i64]) {
        let Some(need) = &shape.need else {
            return self.wait(DemandRef::Shape(shape.index), shape.count, UnmetReason::NoTypeFits);
        };
        let (compat, selector) = (&self.compat, shape.selector);
        let filled = self
            .capacity
            .fill(need, |label_set| compat.allows(selector, label_set), shape.count, floor);
        self.fits_existing += filled.on_existing;
        let mut left = shape.count - filled.total();
        while left > 0 {
            match self.launch_for_shape(shape, need, left) {
                Ok(held) => left -= held,
                Err(reason) => return self.wait(DemandRef::Shape(shape.index), left, reason),
            }
        }
    }

    /// Launches nodes for `left` copies of a shape: as many full nodes of
    /// the chosen type as the limits allow, or one for a remainder that
    /// fills less than a node. Returns how many copies they hold.
    fn launch_for_shape(&mut self, shape: &ShapeItem, need: &Need, left: u64) -> Result<u64, UnmetReason> {
        if !shape.feasible {
            return Err(UnmetReason::NoTypeFits);
        }
        let Choice { node_type, copies } = self.choose_type(need, shape.selector, left)?;
        let nodes = match copies < left {
            true => (left / copies).min(u64::from(self.limits.most(node_type))) as u32,
            false => 1,
        };
        let held = (u64::from(nodes) * copies).min(left);
        let cause = Cause::Shape {
            index: shape.index,
            copies: held,
        };
        let mut rest = held;
        for node in self.launch(node_type, nodes, cause) {
            let on_node = rest.min(copies);
            self.capacity.take(node, need, on_node);
            rest -= on_node;
        }
        Ok(held)
    }

    /// Places the groups one by one; once one cannot be placed, neither can
    /// the others like it (room and limits only shrink within a round).
    fn place_group(&mut self, group: &GroupItem, floor: &[i64]) {
        for placed in 0..group.count {
            let nodes = match &group.bundles {
                Some(bundles) => self.try_group(group, bundles),
                None => Err(UnmetReason::NoTypeFits),
            };
            match nodes {
                Ok(nodes) => self.commit_group(&nodes, floor),
                Err(reason) => return self.wait(DemandRef::Group(group.index), group.count - placed, reason),
            }
        }
    }

    /// Finds a node for every bundle, launching where none has room, and
    /// returns them; on a launch it cannot make, undoes it all.
    fn try_group(&mut self, group: &GroupItem, bundles: &[Need]) -> Result<Vec<usize>, UnmetReason> {
        let (nodes_before, events_before) = (self.capacity.len(), self.events.len());
        let mut used = Vec::with_capacity(bundles.len());
        for (b, bundle) in bundles.iter().enumerate() {
            let node = match self.room_for_bundle(group.strategy, bundle, &used) {
                Some(node) => Ok(node),
                None => self.launch_for_bundle(group, bundles, b),
            };
            match node {
                Ok(node) => {
                    self.capacity.take(node, bundle, 1);
                    used.push(node);
                }
                Err(reason) => {
                    self.undo_group(bundles, &used, nodes_before, events_before);
                    return Err(reason);
                }
            }
        }
        Ok(used)
    }

    /// A node with room for `bundle` under `strategy`, given the nodes the
    /// group's earlier bundles took.
    fn room_for_bundle(&mut self, strategy: PlacementStrategy, bundle: &Need, used: &[usize]) -> Option<usize> {
        if !self.capacity.may_hold(bundle) {
            return None;
        }
        let fits = |capacity: &Capacity, node: usize| capacity.copies(node, bundle, 1) == 1;
        let fresh = |capacity: &Capacity, node: usize| !used.contains(&node) && fits(capacity, node);
        match strategy {
            PlacementStrategy::Pack => {
                used_with_room(&self.capacity, used, bundle).or_else(|| self.capacity.find(fits))
            }
            PlacementStrategy::Spread => self
                .capacity
                .find(fresh)
                .or_else(|| used_with_room(&self.capacity, used, bundle)),
            PlacementStrategy::StrictPack | PlacementStrategy::StrictSpread => self.capacity.find(fresh),
        }
    }

    /// Launches one node for bundle `b`. PACK and SPREAD choose its type
    /// for the group's bundles like it still to place, which may share it.
    fn launch_for_bundle(&mut self, group: &GroupItem, bundles: &[Need], b: usize) -> Result<usize, UnmetReason> {
        if !group.feasible {
            return Err(UnmetReason::NoTypeFits);
        }
        let bundle = &bundles[b];
        let sharing = match group.strategy {
            PlacementStrategy::Pack | PlacementStrategy::Spread => {
                bundles[b..].iter().filter(|&other| other == bundle).count() as u64
            }
            PlacementStrategy::StrictPack | PlacementStrategy::StrictSpread => 1,
        };
        let choice = self.choose_type(bundle, None, sharing)?;
        let cause = Cause::Group { index: group.index };
        Ok(self.launch(choice.node_type, 1, cause).start)
    }

    fn undo_group(&mut self, bundles: &[Need], used: &[usize], nodes_before: usize, events_before: usize) {
        for (&node, bundle) in used.iter().zip(bundles) {
            if node < nodes_before {
                self.capacity.give_back(node, bundle, 1);
            }
        }
        self.capacity.close_from(nodes_before);
        for event in self.events.drain(events_before..) {
            self.limits.give_back(event.node_type, event.nodes);
        }
    }

    fn commit_group(&mut self, nodes: &[usize], floor: &[i64]) {
        for &node in nodes {
            self.fits_existing += u64::from(self.capacity.is_existing(node));
            self.capacity.retire_unless_covers(node, floor);
        }
    }

    /// The node type to launch for `count` copies of `need`: among the
    /// types whose labels `selector` accepts, that hold a copy, are not
    /// backing off and are below their max_count, the one that a node's
    /// worth of the copies leaves least unused (the mean over its
    /// resources of the share left free); ties go to the type holding
    /// more copies, then to the smaller type.
    fn choose_type(&self, need: &Need, selector: SelectorId, count: u64) -> Result<Choice, UnmetReason> {
        if let Some(reason) = self.limits.exhausted() {
            return Err(reason);
        }
        let mut best: Option<(Preference, Choice)> = None;
        let (mut backing_off, mut at_max) = (None, None);
        for t in 0..self.types.len() {
            if !self.compat.allows(selector, self.types.label_set(t)) {
                continue;
            }
            let copies = dense::copies(self.type_row(t), need, count);
            if copies == 0 {
                continue;
            }
            if self.backing_off[t] {
                backing_off.get_or_insert(t);
                continue;
            }
            if self.limits.type_at_max(t) {
                at_max.get_or_insert(t);
                continue;
            }
            let key = (self.waste(t, need, copies), Reverse(copies), self.types.size_rank(t));
            if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
                best = Some((key, Choice { node_type: t, copies }));
            }
        }
        let name = |t: usize| self.config.node_types[t].name.clone();
        match (best, backing_off, at_max) {
            (Some((_, choice)), _, _) => Ok(choice),
            (None, Some(t), _) => Err(UnmetReason::BackingOff { node_type: name(t) }),
            (None, None, Some(t)) => Err(UnmetReason::TypeMax { node_type: name(t) }),
            (None, None, None) => Err(UnmetReason::NoTypeFits),
        }
    }

    /// The share of a node of type `t` that `copies` of `need` leave
    /// unused, averaged over its resources, in billionths.
    fn waste(&self, t: usize, need: &Need, copies: u64) -> u64 {
        let row = self.type_row(t);
        let used: f64 = need
            .iter()
            .filter(|&&(resource, _)| self.counted[resource])
            .map(|&(resource, amount)| (copies as f64 * amount as f64 / row[resource] as f64).min(1.0))
            .sum();
        let resources = f64::from(self.types.counted(t).max(1));
        ((1.0 - used / resources).max(0.0) * 1e9) as u64
    }

    /// Opens `nodes` nodes of type `t` and returns them.
    fn launch(&mut self, t: usize, nodes: u32, cause: Cause) -> Range<usize> {
        self.limits.take(t, nodes);
        self.events.push(LaunchEvent {
            node_type: t,
            nodes,
            cause,
        });
        let row = &self.type_rows[t * self.stride..(t + 1) * self.stride];
        self.capacity.open(row, self.types.label_set(t), nodes)
    }

    fn wait(&mut self, demand: DemandRef, count: u64, reason: UnmetReason) {
        self.unmet.push(Unmet { demand, count, reason });
    }
}

/// The first node the group already took that has room for `bundle`.
fn used_with_room(capacity: &Capacity, used: &[usize], bundle: &Need) -> Option<usize> {
    used.iter().copied().find(|&node| capacity.copies(node, bundle, 1) == 1)
}
