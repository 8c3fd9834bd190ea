//! Launches as a round makes them: the limits they count against (each
//! type's max_count, max_nodes, max_launch_batch), each launch with what
//! caused it, and the merge into one [`Launch`] per type whose reason says
//! which demand the new nodes hold.

use super::config::AutoscalerConfig;
use super::demand::Demand;
use super::plan::{Launch, UnmetReason};

/// How many reasons one launch lists before it counts the rest.
const REASONS_SHOWN: usize = 3;

/// The launches still allowed this round.
pub(super) struct Limits {
    per_type: Vec<u32>,
    nodes: u32,
    batch: u32,
}

/// Why nodes were launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// The type had `had` nodes, below its min_count.
    Minimum { had: u32 },
    /// `copies` of the demand's shape `index` go on the new nodes.
    Shape { index: usize, copies: u64 },
    /// Bundles of the demand's groups `index` go on them.
    Group { index: usize },
}

pub(super) struct LaunchEvent {
    pub node_type: usize,
    pub nodes: u32,
    pub cause: Cause,
}

impl Cause {
    /// Copies of a shape the launch holds; none for other causes.
    fn copies(self) -> u64 {
        match self {
            Cause::Shape { copies, .. } => copies,
            Cause::Minimum { .. } | Cause::Group { .. } => 0,
        }
    }
}

impl Limits {
    pub fn new(per_type: Vec<u32>, nodes: u32, batch: u32) -> Self {
        Limits { per_type, nodes, batch }
    }

    /// The most nodes of `node_type` that may launch now.
    pub fn most(&self, node_type: usize) -> u32 {
        self.per_type[node_type].min(self.nodes).min(self.batch)
    }

    /// What stops every launch, whatever the type.
    pub fn exhausted(&self) -> Option<UnmetReason> {
        match (self.batch, self.nodes) {
            (0, _) => Some(UnmetReason::LaunchBatch),
            (_, 0) => Some(UnmetReason::MaxNodes),
            _ => None,
        }
    }

    pub fn type_at_max(&self, node_type: usize) -> bool {
        self.per_type[node_type] == 0
    }

    pub fn take(&mut self, node_type: usize, nodes: u32) {
        self.per_type[node_type] -= nodes;
        self.nodes -= nodes;
        self.batch -= nodes;
    }

    pub fn give_back(&mut self, node_type: usize, nodes: u32) {
        self.per_type[node_type] += nodes;
        self.nodes += nodes;
        self.batch += nodes;
    }
}

/// One [`Launch`] per type, in the order the types were first chosen.
pub(super) fn merge(events: &[LaunchEvent], config: &AutoscalerConfig, demand: &Demand) -> Vec<Launch> {
    let mut merged: Vec<(usize, u32, Vec<String>)> = Vec::new();
    for run in events.chunk_by(|a, b| a.node_type == b.node_type && same_demand(a.cause, b.cause)) {
        let node_type = run[0].node_type;
        let nodes: u32 = run.iter().map(|event| event.nodes).sum();
        let reason = describe(run, nodes, config, demand);
        match merged.iter_mut().find(|(t, _, _)| *t == node_type) {
            Some((_, count, reasons)) => {
                *count += nodes;
                reasons.push(reason);
            }
            None => merged.push((node_type, nodes, vec![reason])),
        }
    }
    merged
        .into_iter()
        .map(|(node_type, count, reasons)| Launch {
            node_type: config.node_types[node_type].name.clone(),
            count,
            reason: join_reasons(reasons),
        })
        .collect()
}

fn same_demand(a: Cause, b: Cause) -> bool {
    match (a, b) {
        (Cause::Shape { index: x, .. }, Cause::Shape { index: y, .. }) => x == y,
        (Cause::Group { index: x }, Cause::Group { index: y }) => x == y,
        _ => false,
    }
}

/// The reason for a run of launches of one type for one cause.
fn describe(run: &[LaunchEvent], nodes: u32, config: &AutoscalerConfig, demand: &Demand) -> String {
    let node_type = &config.node_types[run[0].node_type];
    let held = format!("{} of type {}", plural(nodes, "node"), node_type.name);
    let verb = |one: &'static str, many: &'static str| if nodes == 1 { one } else { many };
    match run[0].cause {
        Cause::Minimum { had } => format!(
            "type {} keeps min_count {} and has {had}, {held} {}",
            node_type.name,
            node_type.min_count,
            verb("launches", "launch")
        ),
        Cause::Shape { index, .. } => format!(
            "{} x {} wait, {held} {} them",
            run.iter().map(|event| event.cause.copies()).sum::<u64>(),
            demand.shapes[index].describe(),
            verb("holds", "hold")
        ),
        Cause::Group { index } => format!(
            "bundles of {} wait, {held} {} them",
            demand.groups[index].describe(),
            verb("holds", "hold")
        ),
    }
}

fn join_reasons(reasons: Vec<String>) -> String {
    let more = reasons.len().saturating_sub(REASONS_SHOWN);
    let mut shown: Vec<String> = reasons.into_iter().take(REASONS_SHOWN).collect();
    if more > 0 {
        shown.push(format!("and {more} more"));
    }
    shown.join("; ")
}

/// `1 node` or `3 nodes`.
fn plural(count: u32, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {noun}s"),
    }
}
