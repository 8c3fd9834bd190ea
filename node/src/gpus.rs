//! The node's GPUs by id: which share of each is leased. A fractional lease
//! goes to the fullest GPU it still fits on, so fractions pack onto one GPU
//! until it is full; whole GPUs are given only when wholly free.

use raylet_proto::Amount;

const WHOLE: i64 = Amount::SCALE;

/// The free share of each GPU, in fixed-point units.
#[derive(Clone, Debug)]
pub(crate) struct GpuPool {
    free: Vec<i64>,
}

impl GpuPool {
    /// One id per whole GPU; a fractional remainder is one more, partial id.
    pub(crate) fn new(total: Amount) -> Self {
        let raw = total.raw();
        let mut free = vec![WHOLE; (raw / WHOLE) as usize];
        if raw % WHOLE > 0 {
            free.push(raw % WHOLE);
        }
        GpuPool { free }
    }

    /// The ids a lease of `amount` GPUs would get now, if it fits.
    pub(crate) fn assignment(&self, amount: Amount) -> Option<Vec<u32>> {
        let raw = amount.raw();
        if raw == 0 {
            return Some(Vec::new());
        }
        if raw < WHOLE {
            let fullest = self
                .free
                .iter()
                .enumerate()
                .filter(|&(_, &free)| free >= raw)
                .min_by_key(|&(id, &free)| (free, id))?;
            return Some(vec![fullest.0 as u32]);
        }
        let wanted = (raw as u64).div_ceil(WHOLE as u64) as usize;
        let ids: Vec<u32> = self
            .free
            .iter()
            .enumerate()
            .filter(|&(_, &free)| free == WHOLE)
            .map(|(id, _)| id as u32)
            .take(wanted)
            .collect();
        (ids.len() == wanted).then_some(ids)
    }

    /// Takes `amount` GPUs (the caller checked that they fit) and returns their ids.
    pub(crate) fn take(&mut self, amount: Amount) -> Vec<u32> {
        let ids = self.assignment(amount).unwrap_or_default();
        let share = share_per_id(amount, ids.len());
        for &id in &ids {
            self.free[id as usize] -= share;
        }
        ids
    }

    /// Gives back what a lease of `amount` GPUs on `ids` took.
    pub(crate) fn give_back(&mut self, ids: &[u32], amount: Amount) {
        let share = share_per_id(amount, ids.len());
        for &id in ids {
            if let Some(free) = self.free.get_mut(id as usize) {
                *free = (*free + share).min(WHOLE);
            }
        }
    }
}

/// A fraction takes its amount from one id; whole GPUs take all of each.
fn share_per_id(amount: Amount, ids: usize) -> i64 {
    match ids {
        0 => 0,
        1 => amount.raw().min(WHOLE),
        _ => WHOLE,
    }
}
