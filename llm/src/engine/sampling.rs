//! Choosing each next token from the model's logits: the most likely one
//! at temperature 0, else a draw from the softmax of the logits divided by
//! the temperature, cut to the smallest set of most likely tokens whose
//! probability reaches `top_p` (nucleus sampling). A seed makes the draws
//! repeat.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// How a request's tokens are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 picks the most likely token; higher flattens the distribution.
    pub temperature: f32,
    /// The probability mass the draw is cut to, in `(0, 1]`.
    pub top_p: f32,
    /// Makes the draws repeat; `None` draws a seed.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }
}

/// One sequence's token chooser and its random state.
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub(crate) fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Sampler {
            params,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next token after `logits` (one per vocabulary entry).
    pub(crate) fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let largest = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let temperature = self.params.temperature;
        let weights: Vec<f32> = logits.iter().map(|&l| ((l - largest) / temperature).exp()).collect();
        let candidates = self.nucleus(&weights);
        let total: f32 = candidates.iter().map(|&id| weights[id as usize]).sum();
        let mut left = self.rng.random::<f32>() * total;
        for &id in &candidates {
            left -= weights[id as usize];
            if left <= 0.0 {
                return id;
            }
        }
        *candidates.last().expect("the nucleus has at least one token")
    }

    /// The token ids to draw from: all of them, or the most likely ones
    /// whose share of `weights` reaches `top_p`.
    fn nucleus(&self, weights: &[f32]) -> Vec<u32> {
        let all = 0..weights.len() as u32;
        if self.params.top_p >= 1.0 {
            return all.collect();
        }
        let mut ranked: Vec<u32> = all.collect();
        ranked.sort_unstable_by(|&a, &b| weights[b as usize].total_cmp(&weights[a as usize]));
        let goal = self.params.top_p * weights.iter().sum::<f32>();
        let mut mass = 0.0;
        let kept = ranked
            .iter()
            .position(|&id| {
                mass += weights[id as usize];
                mass >= goal
            })
            .map_or(ranked.len(), |last| last + 1);
        ranked.truncate(kept);
        ranked
    }
}

/// The index of the largest logit (the first of equals).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (index, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = index;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            seed: Some(seed),
        }
    }

    fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut sampler = Sampler::new(params);
        (0..n).map(|_| sampler.sample(logits)).collect()
    }

    #[test]
    fn temperature_zero_takes_the_most_likely_token() {
        let logits = [0.1, 2.5, -1.0, 2.4];
        assert_eq!(draws(SamplingParams::greedy(), &logits, 5), vec![1; 5]);
    }

    #[test]
    fn one_seed_repeats_its_draws_and_another_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let first = draws(params(1.0, 1.0, 11), &logits, 40);
        assert_eq!(draws(params(1.0, 1.0, 11), &logits, 40), first);
        assert_ne!(draws(params(1.0, 1.0, 12), &logits, 40), first);
    }

    #[test]
    fn top_p_draws_only_from_the_smallest_set_that_reaches_it() {
        // Probabilities about 0.64, 0.24, 0.09, 0.03.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let drawn = draws(params(1.0, 0.8, 5), &logits, 500);
        assert!(drawn.iter().all(|&id| id < 2), "{drawn:?}");
        assert!(drawn.contains(&0) && drawn.contains(&1));
        let narrow = draws(params(1.0, 0.5, 5), &logits, 100);
        assert_eq!(narrow, vec![0; 100]);
    }

    #[test]
    fn draws_follow_the_softmax_of_the_logits() {
        let logits = [0.0, (3.0f32).ln()];
        let drawn = draws(params(1.0, 1.0, 9), &logits, 4000);
        let ones = drawn.iter().filter(|&&id| id == 1).count() as f64 / 4000.0;
        assert!(
            (ones - 0.75).abs() < 0.03,
            "token 1 drawn {ones} of the time, expected 0.75"
        );
    }

    #[test]
    fn a_high_temperature_flattens_and_a_low_one_sharpens() {
        let logits = [0.0, 1.0];
        let share = |temperature| {
            let drawn = draws(params(temperature, 1.0, 3), &logits, 4000);
            drawn.iter().filter(|&&id| id == 1).count() as f64 / 4000.0
        };
        assert!(share(0.1) > 0.99);
        assert!((share(100.0) - 0.5).abs() < 0.05);
    }
}
