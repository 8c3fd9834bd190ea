//! The room a round packs demand into: every node that is running or
//! launching, and every node the round opens, with its free resources in
//! one flat array. Nodes are tried in the order they were added: the round
//! adds busy running nodes, then idle ones (so that an idle node keeps
//! demand only where busy nodes have no room, and can be removed
//! otherwise), then launching ones; nodes it opens come last. A node that
//! can no longer hold the least of the demand still to pack is dropped
//! from the order, which keeps every later scan short. A front of free
//! amounts that every node stays within answers, without a scan, that no
//! node has room for a need: most of what a round asks once the existing
//! nodes are full.

use std::ops::Range;

use super::dense::{self, Need};

/// How many copies a fill put where.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Filled {
    pub on_existing: u64,
    pub on_new: u64,
}

pub(super) struct Capacity {
    stride: usize,
    free: Vec<i64>,
    label_set: Vec<usize>,
    /// Nodes below this index existed before the round.
    existing: usize,
    /// Whether demand was packed onto each node this round.
    touched: Vec<bool>,
    /// Marked by a placement group's commit; dropped from `order` by the
    /// next scan that meets it.
    retired: Vec<bool>,
    /// The nodes still worth trying, in the order they are tried.
    order: Vec<usize>,
    /// Free resources, `stride` amounts each, such that every node in
    /// `order` has no more of any resource than one of them: when none of
    /// them holds a need, no node does. Rebuilt from the nodes when it let
    /// a scan through that found no room, widened by every node that gains
    /// resources.
    front: Vec<i64>,
}

impl Capacity {
    pub fn new(stride: usize) -> Self {
        Capacity {
            stride,
            free: Vec::new(),
            label_set: Vec::new(),
            existing: 0,
            touched: Vec::new(),
            retired: Vec::new(),
            order: Vec::new(),
            front: Vec::new(),
        }
    }

    /// Adds a node that exists before the round, tried after those added
    /// before it.
    pub fn add_existing(&mut self, free: &[i64], label_set: usize) -> usize {
        let node = self.push(free, label_set);
        self.existing = self.len();
        node
    }

    /// Opens `count` new nodes with `free` each.
    pub fn open(&mut self, free: &[i64], label_set: usize, count: u32) -> Range<usize> {
        let start = self.len();
        for _ in 0..count {
            self.push(free, label_set);
        }
        if count > 0 {
            widen(&mut self.front, free);
        }
        start..self.len()
    }

    /// Forgets the nodes opened from `len` on.
    pub fn close_from(&mut self, len: usize) {
        self.free.truncate(len * self.stride);
        self.label_set.truncate(len);
        self.touched.truncate(len);
        self.retired.truncate(len);
        while self.order.last().is_some_and(|&node| node >= len) {
            self.order.pop();
        }
    }

    pub fn len(&self) -> usize {
        self.label_set.len()
    }

    pub fn is_existing(&self, node: usize) -> bool {
        node < self.existing
    }

    pub fn touched(&self, node: usize) -> bool {
        self.touched[node]
    }

    pub fn free(&self, node: usize) -> &[i64] {
        &self.free[self.range(node)]
    }

    pub fn copies(&self, node: usize, need: &[(usize, i64)], limit: u64) -> u64 {
        dense::copies(self.free(node), need, limit)
    }

    pub fn take(&mut self, node: usize, need: &[(usize, i64)], copies: u64) {
        self.touched[node] = true;
        dense::take(self.free_mut(node), need, copies);
    }

    pub fn give_back(&mut self, node: usize, need: &[(usize, i64)], copies: u64) {
        dense::give_back(self.free_mut(node), need, copies);
        let range = self.range(node);
        widen(&mut self.front, &self.free[range]);
    }

    /// Whether some node may have room for `need`; `false` means none has.
    pub fn may_hold(&self, need: &[(usize, i64)]) -> bool {
        self.stride == 0
            || self
                .front
                .chunks_exact(self.stride)
                .any(|bound| need.iter().all(|&(resource, amount)| bound[resource] >= amount))
    }

    /// Marks `node` to be dropped from the order if it cannot hold `floor`.
    pub fn retire_unless_covers(&mut self, node: usize, floor: &[i64]) {
        if !dense::covers(self.free(node), floor) {
            self.retired[node] = true;
        }
    }

    /// Drops every node that cannot hold `floor` from the order.
    pub fn prune(&mut self, floor: &[i64]) {
        let mut order = std::mem::take(&mut self.order);
        order.retain(|&node| dense::covers(self.free(node), floor));
        self.order = order;
        self.rebuild_front();
    }

    /// Packs up to `limit` copies of `need`, first fit, on nodes whose label
    /// set `allowed` accepts. Nodes met on the way that cannot hold `floor`,
    /// the least of the demand after this one, are dropped.
    pub fn fill(&mut self, need: &Need, allowed: impl Fn(usize) -> bool, limit: u64, floor: &[i64]) -> Filled {
        let mut filled = Filled::default();
        if !self.may_hold(need) {
            return filled;
        }
        let mut left = limit;
        let mut order = std::mem::take(&mut self.order);
        let (mut kept, mut next) = (0, 0);
        while next < order.len() && left > 0 {
            let node = order[next];
            next += 1;
            if allowed(self.label_set[node]) {
                let copies = self.copies(node, need, left);
                if copies > 0 {
                    self.take(node, need, copies);
                    left -= copies;
                    filled.count(self.is_existing(node), copies);
                }
            }
            if dense::covers(self.free(node), floor) {
                order[kept] = node;
                kept += 1;
            }
        }
        let found_none = next == order.len() && filled.total() == 0;
        close_gap(&mut order, kept, next);
        self.order = order;
        if found_none {
            self.rebuild_front();
        }
        filled
    }

    /// The first node in order that `accepts` takes; nodes marked retired
    /// are dropped on the way.
    pub fn find(&mut self, accepts: impl Fn(&Capacity, usize) -> bool) -> Option<usize> {
        let mut order = std::mem::take(&mut self.order);
        let (mut kept, mut next) = (0, 0);
        let mut found = None;
        while next < order.len() && found.is_none() {
            let node = order[next];
            next += 1;
            if self.retired[node] {
                continue;
            }
            order[kept] = node;
            kept += 1;
            found = accepts(self, node).then_some(node);
        }
        close_gap(&mut order, kept, next);
        self.order = order;
        found
    }

    fn push(&mut self, free: &[i64], label_set: usize) -> usize {
        self.free.extend_from_slice(free);
        self.label_set.push(label_set);
        self.touched.push(false);
        self.retired.push(false);
        self.order.push(self.len() - 1);
        self.len() - 1
    }

    fn rebuild_front(&mut self) {
        self.front.clear();
        for &node in &self.order {
            let range = self.range(node);
            widen(&mut self.front, &self.free[range]);
        }
    }

    /// Where the node's amounts are in `free`.
    fn range(&self, node: usize) -> Range<usize> {
        node * self.stride..(node + 1) * self.stride
    }

    fn free_mut(&mut self, node: usize) -> &mut [i64] {
        let range = self.range(node);
        &mut self.free[range]
    }
}

impl Filled {
    fn count(&mut self, existing: bool, copies: u64) {
        match existing {
            true => self.on_existing += copies,
            false => self.on_new += copies,
        }
    }

    pub fn total(&self) -> u64 {
        self.on_existing + self.on_new
    }
}

/// Adds `free` to `front` unless a bound there has as much of everything;
/// drops the bounds it has as much as.
fn widen(front: &mut Vec<i64>, free: &[i64]) {
    let stride = free.len();
    if stride == 0 || front.chunks_exact(stride).any(|bound| dense::covers(bound, free)) {
        return;
    }
    let mut kept = 0;
    for position in 0..front.len() / stride {
        let start = position * stride;
        if !dense::covers(free, &front[start..start + stride]) {
            front.copy_within(start..start + stride, kept * stride);
            kept += 1;
        }
    }
    front.truncate(kept * stride);
    front.extend_from_slice(free);
}

/// Moves `nodes[next..]` down to `kept` after a scan kept `kept` of the
/// first `next`.
fn close_gap(nodes: &mut Vec<usize>, kept: usize, next: usize) {
    nodes.copy_within(next.., kept);
    nodes.truncate(nodes.len() - (next - kept));
}
