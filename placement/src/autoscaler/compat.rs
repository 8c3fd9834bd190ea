//! Which label selectors which labels satisfy, worked out once a round for
//! every distinct selector of the demand and every distinct label set of
//! the nodes and node types, so that packing looks it up in a table.

use std::collections::HashMap;

use raylet_proto::{LabelSelector, Labels};

/// A distinct selector of the round; `None` is the empty selector, which
/// every node satisfies.
pub(super) type SelectorId = Option<usize>;

/// The round's distinct non-empty selectors.
#[derive(Default)]
pub(super) struct Selectors<'a> {
    index: HashMap<&'a LabelSelector, usize>,
    list: Vec<&'a LabelSelector>,
}

impl<'a> Selectors<'a> {
    pub fn id(&mut self, selector: &'a LabelSelector) -> SelectorId {
        if selector.is_empty() {
            return None;
        }
        let list = &mut self.list;
        Some(*self.index.entry(selector).or_insert_with(|| {
            list.push(selector);
            list.len() - 1
        }))
    }
}

/// Whether each selector matches each label set.
pub(super) struct Compat {
    label_sets: usize,
    table: Vec<bool>,
}

impl Compat {
    pub fn new(selectors: &Selectors, label_sets: &[&Labels]) -> Self {
        let table = selectors
            .list
            .iter()
            .flat_map(|selector| label_sets.iter().map(|labels| selector.matches(labels)))
            .collect();
        Compat {
            label_sets: label_sets.len(),
            table,
        }
    }

    pub fn allows(&self, selector: SelectorId, label_set: usize) -> bool {
        selector.is_none_or(|s| self.table[s * self.label_sets + label_set])
    }
}
