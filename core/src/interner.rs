//! Bounded interning: one shared copy of each of a few distinct values
//! (task templates, type names), so that a million tasks or results of one
//! kind hold a pointer each instead of a copy. Past its bound the set
//! starts over; the copies already handed out stay valid.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Distinct values kept at most.
const MAX_INTERNED: usize = 4096;

/// The shared copies of a kind of value.
pub(crate) struct Interner<T: ?Sized>(Mutex<HashSet<Arc<T>>>);

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner(Mutex::new(HashSet::new()))
    }
}

impl<T: ?Sized + Eq + Hash> Interner<T> {
    /// The shared copy of the value equal to `key`, made by `make` when
    /// there is none yet.
    pub(crate) fn intern<Q>(&self, key: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        let mut values = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = values.get(key) {
            return known.clone();
        }
        if values.len() >= MAX_INTERNED {
            values.clear();
        }
        let value = make(key);
        values.insert(value.clone());
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_the_set_starts_over_past_its_bound() {
        let names = Interner::<str>::default();
        let first = names.intern("u64", |name| name.into());
        assert!(Arc::ptr_eq(&first, &names.intern("u64", |name| name.into())));
        for i in 0..MAX_INTERNED {
            names.intern(i.to_string().as_str(), |name| name.into());
        }
        let again = names.intern("u64", |name| name.into());
        assert!(!Arc::ptr_eq(&first, &again), "the set started over");
        assert_eq!(*first, *again);
    }
}
