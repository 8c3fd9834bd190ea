//! The configured node types in dense form, built once when the autoscaler
//! starts: each type's resources as a row, its labels as one of the
//! distinct label sets, and its rank by size for breaking ties.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use raylet_proto::Labels;

use super::config::NodeType;
use super::dense::{NameHasher, Names};

pub(super) struct TypeTable {
    names: Names,
    /// Types' resources, `names.len()` amounts a type.
    rows: Vec<i64>,
    index_of: HashMap<String, usize, BuildHasherDefault<NameHasher>>,
    label_sets: Vec<Labels>,
    label_set_of: Vec<usize>,
    /// How many of a type's resources count toward how well it is used.
    counted: Vec<u32>,
    /// Each type's place when the types are ordered smallest first.
    size_rank: Vec<u32>,
}

impl TypeTable {
    pub fn new(types: &[NodeType]) -> Self {
        let mut names = Names::default();
        for node_type in types {
            names.intern_all(&node_type.resources);
        }
        let stride = names.len();
        let mut rows = vec![0; types.len() * stride];
        for (row, node_type) in rows.chunks_exact_mut(stride.max(1)).zip(types) {
            names.fill_row(&node_type.resources, row);
        }
        let (label_sets, label_set_of) = distinct_label_sets(types);
        let counted = rows
            .chunks_exact(stride.max(1))
            .map(|row| {
                row.iter()
                    .zip(names.counted())
                    .filter(|&(&amount, &counts)| amount > 0 && counts)
                    .count() as u32
            })
            .collect();
        let mut table = TypeTable {
            names,
            rows,
            index_of: types.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect(),
            label_sets,
            label_set_of,
            counted,
            size_rank: Vec::new(),
        };
        table.size_rank = table.rank_by_size();
        table
    }

    pub fn len(&self) -> usize {
        self.label_set_of.len()
    }

    /// The resource names the types declare, to extend in a round.
    pub fn names(&self) -> &Names {
        &self.names
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index_of.get(name).copied()
    }

    /// The types' rows with `stride` amounts each (at least as many as the
    /// types declare; the others zero).
    pub fn rows(&self, stride: usize) -> Vec<i64> {
        let own = self.names.len();
        let mut rows = vec![0; self.len() * stride];
        for (t, row) in rows.chunks_exact_mut(stride.max(1)).enumerate() {
            row[..own].copy_from_slice(&self.rows[t * own..(t + 1) * own]);
        }
        rows
    }

    pub fn label_sets(&self) -> &[Labels] {
        &self.label_sets
    }

    pub fn label_set(&self, node_type: usize) -> usize {
        self.label_set_of[node_type]
    }

    pub fn counted(&self, node_type: usize) -> u32 {
        self.counted[node_type]
    }

    pub fn size_rank(&self, node_type: usize) -> u32 {
        self.size_rank[node_type]
    }

    /// Ranks types by the sum of their amounts, each resource scaled by
    /// the largest amount any type has of it; ties by configuration order.
    fn rank_by_size(&self) -> Vec<u32> {
        let stride = self.names.len().max(1);
        let mut largest = vec![1i64; stride];
        for row in self.rows.chunks_exact(stride) {
            for (most, &amount) in largest.iter_mut().zip(row) {
                *most = (*most).max(amount);
            }
        }
        let size = |t: usize| -> f64 {
            let row = &self.rows[t * stride..(t + 1) * stride];
            row.iter().zip(&largest).map(|(&a, &most)| a as f64 / most as f64).sum()
        };
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|&a, &b| size(a).total_cmp(&size(b)).then(a.cmp(&b)));
        let mut rank = vec![0; self.len()];
        for (place, t) in order.into_iter().enumerate() {
            rank[t] = place as u32;
        }
        rank
    }
}

/// The types' distinct label sets, and which one each type has.
fn distinct_label_sets(types: &[NodeType]) -> (Vec<Labels>, Vec<usize>) {
    let mut index: HashMap<&Labels, usize> = HashMap::new();
    let mut sets = Vec::new();
    let of = types
        .iter()
        .map(|node_type| {
            *index.entry(&node_type.labels).or_insert_with(|| {
                sets.push(node_type.labels.clone());
                sets.len() - 1
            })
        })
        .collect();
    (sets, of)
}
