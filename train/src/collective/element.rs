//! The element types a collective reduces (`f32`, `f64`) and how.

/// How the ranks' values are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of ranks.
    Mean,
    Max,
}

/// A number a collective can reduce: plain bytes on the wire, in this
/// machine's byte order.
pub trait Element: bytemuck::Pod + PartialOrd + Send + Sync + 'static {
    fn add(self, other: Self) -> Self;
    fn divide(self, count: usize) -> Self;
}

impl Element for f32 {
    fn add(self, other: Self) -> Self {
        self + other
    }

    fn divide(self, count: usize) -> Self {
        self / count as f32
    }
}

impl Element for f64 {
    fn add(self, other: Self) -> Self {
        self + other
    }

    fn divide(self, count: usize) -> Self {
        self / count as f64
    }
}

/// Combines `incoming` into `into`, element by element.
pub(crate) fn combine<T: Element>(into: &mut [T], incoming: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => into.iter_mut().zip(incoming).for_each(|(a, b)| *a = a.add(*b)),
        ReduceOp::Max => into.iter_mut().zip(incoming).for_each(|(a, b)| {
            if *b > *a {
                *a = *b;
            }
        }),
    }
}

/// Turns summed values into means when `op` asks for them.
pub(crate) fn finish<T: Element>(values: &mut [T], op: ReduceOp, world: usize) {
    if op == ReduceOp::Mean {
        values.iter_mut().for_each(|value| *value = value.divide(world));
    }
}
