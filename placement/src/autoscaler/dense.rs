//! Resources in the dense form a round computes with: names interned to
//! indices, rows of raw amounts indexed by them, demands as (index, amount)
//! pairs, and the arithmetic of how many copies of a demand fit in a row.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use raylet_proto::ResourceSet;
use raylet_proto::resources::OBJECT_STORE_MEMORY;

/// A demand's raw amounts as (resource index, amount) pairs; every amount
/// is above zero.
pub(super) type Need = Vec<(usize, i64)>;

/// Resource names interned to row indices.
#[derive(Clone, Debug, Default)]
pub(super) struct Names {
    index: HashMap<String, usize, BuildHasherDefault<NameHasher>>,
    /// Whether each resource counts toward how well a node is used: the
    /// object store does not, as in placement.
    counted: Vec<bool>,
}

impl Names {
    pub fn intern(&mut self, name: &str) -> usize {
        if let Some(&index) = self.index.get(name) {
            return index;
        }
        self.index.insert(name.to_string(), self.counted.len());
        self.counted.push(name != OBJECT_STORE_MEMORY);
        self.counted.len() - 1
    }

    /// Interns every name of `set`.
    pub fn intern_all(&mut self, set: &ResourceSet) {
        for (name, _) in set.iter() {
            self.intern(name);
        }
    }

    pub fn len(&self) -> usize {
        self.counted.len()
    }

    pub fn counted(&self) -> &[bool] {
        &self.counted
    }

    /// `set`'s amounts, interning every name.
    pub fn amounts(&mut self, set: &ResourceSet) -> Vec<(usize, i64)> {
        set.iter()
            .map(|(name, amount)| (self.intern(name), amount.raw()))
            .collect()
    }

    /// `set` as a need; `None` when it names a resource nothing has.
    pub fn need(&self, set: &ResourceSet) -> Option<Need> {
        set.iter()
            .map(|(name, amount)| self.index.get(name).map(|&index| (index, amount.raw())))
            .collect()
    }

    /// Writes `set` into `row`; every name must be interned.
    pub fn fill_row(&self, set: &ResourceSet, row: &mut [i64]) {
        for (name, amount) in set.iter() {
            row[self.index[name]] = amount.raw();
        }
    }
}

/// FNV-1a: resource and type names are short words, for which SipHash's
/// setup costs more than the hashing.
#[derive(Debug)]
pub(super) struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// How many copies of `need` fit in `free`, at most `limit`.
pub(super) fn copies(free: &[i64], need: &[(usize, i64)], limit: u64) -> u64 {
    let mut most = limit;
    for &(resource, amount) in need {
        let have = free[resource];
        if have < amount {
            return 0;
        }
        most = most.min((have / amount) as u64);
    }
    most
}

/// Whether `free` has at least `floor` of every resource.
pub(super) fn covers(free: &[i64], floor: &[i64]) -> bool {
    free.iter().zip(floor).all(|(have, least)| have >= least)
}

/// Takes `copies` of `need` from `free`.
pub(super) fn take(free: &mut [i64], need: &[(usize, i64)], copies: u64) {
    for &(resource, amount) in need {
        free[resource] -= amount * copies as i64;
    }
}

/// Gives `copies` of `need` back to `free`.
pub(super) fn give_back(free: &mut [i64], need: &[(usize, i64)], copies: u64) {
    for &(resource, amount) in need {
        free[resource] += amount * copies as i64;
    }
}

/// Lowers `row` to the componentwise least of `row` and `need`, where
/// resources `need` lacks count as zero.
pub(super) fn lower_to(row: &mut [i64], need: &[(usize, i64)]) {
    for (resource, least) in row.iter_mut().enumerate() {
        let amount = need
            .iter()
            .find(|&&(r, _)| r == resource)
            .map_or(0, |&(_, amount)| amount);
        *least = (*least).min(amount);
    }
}
