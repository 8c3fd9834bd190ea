//! The digits data set (8x8 images of handwritten digits, 1797 of them,
//! from scikit-learn, embedded by smartcore: no download) and an MLP for
//! it. Examples, tests and benchmarks train on it; raylet-train's
//! `digits::DigitsTraining` is a complete data-parallel train loop for it.

mod data;
mod model;

pub use data::{Digit, DigitsSplit, load};
pub use model::{DigitsMlp, batch};
