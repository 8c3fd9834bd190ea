//! The digits, as rows a trainer can shard: 64 pixels scaled to 0..1 and
//! the label, split into a training and a test set.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

/// One 8x8 image and the digit it shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Digit {
    /// Row by row, each from 0.0 (white) to 1.0 (black).
    pub pixels: Vec<f32>,
    pub label: u8,
}

/// The training and the test set.
#[derive(Clone, Debug)]
pub struct DigitsSplit {
    pub train: Vec<Digit>,
    pub test: Vec<Digit>,
}

/// The 1797 digits, shuffled by `seed`, with `test_fraction` of them held
/// out for testing.
pub fn load(test_fraction: f64, seed: u64) -> DigitsSplit {
    let dataset = smartcore::dataset::digits::load_dataset();
    let mut digits: Vec<Digit> = dataset
        .data
        .chunks(dataset.num_features)
        .zip(&dataset.target)
        .map(|(pixels, label)| Digit {
            pixels: pixels.iter().map(|p| p / 16.0).collect(),
            label: *label as u8,
        })
        .collect();
    digits.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let test_count = (digits.len() as f64 * test_fraction).round() as usize;
    let train = digits.split_off(test_count);
    DigitsSplit { train, test: digits }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_digit_is_in_one_of_the_sets_with_its_64_pixels() {
        let split = load(0.2, 7);
        assert_eq!(split.train.len() + split.test.len(), 1797);
        assert_eq!(split.test.len(), 359);
        let all = split.train.iter().chain(&split.test);
        assert!(all.clone().all(|d| d.pixels.len() == 64 && d.label < 10));
        assert!(all.flat_map(|d| &d.pixels).all(|p| (0.0..=1.0).contains(p)));
        assert_eq!(load(0.2, 7).test, split.test, "the same seed shuffles the same way");
    }
}
