//! The digits data set (8x8 images of handwritten digits, 1797 of them,
//! from scikit-learn, embedded by smartcore: no download), an MLP for it,
//! and [`DigitsTraining`], a complete data-parallel train loop with
//! checkpoints. Examples, tests and benchmarks train on it.

mod data;
mod model;
mod training;

pub use data::{Digit, DigitsSplit, load};
pub use model::{DigitsMlp, batch};
pub use training::DigitsTraining;
