//! Reading prepared rows back: [`token_rows`] for training (through a
//! shuffled `streaming_split`), and [`unigram_entropy`], the entropy of the
//! tokens' frequencies, which a model that learns anything beats.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;

use raylet_data::{Dataset, FileSet, register_batch_fn};
use serde::{Deserialize, Serialize};

use crate::error::LmError;
use crate::packing::TokenRow;

/// Rows per batch when counting tokens.
const COUNTING_BATCH_ROWS: usize = 4096;

/// How often a token occurs in a batch of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct TokenCount {
    token: u32,
    count: u64,
}

/// The rows a preparation wrote to `dir` (`out_dir/train` or
/// `out_dir/validation`), read from its Parquet files.
pub fn token_rows(dir: &Path) -> Dataset<TokenRow> {
    Dataset::read_parquet(FileSet::dir(dir)).rows::<TokenRow>()
}

/// The entropy of the tokens' frequencies in the rows in `dir`, in nats
/// per token: the loss of a model that predicts every token with its
/// frequency, whatever came before. The tokens are counted on the cluster,
/// a batch at a time, and the counts summed on the driver.
pub fn unigram_entropy(dir: &Path) -> Result<f64, LmError> {
    let batch_counts = token_rows(dir)
        .map_batches(count_tokens, COUNTING_BATCH_ROWS)
        .show_progress(false)
        .take_all()?;
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for TokenCount { token, count } in batch_counts {
        *counts.entry(token).or_default() += count;
    }
    entropy(counts.into_values()).ok_or_else(|| LmError::NoTokens(dir.to_owned()))
}

/// How often each token occurs in `rows`.
fn count_tokens(rows: Vec<TokenRow>) -> Result<Vec<TokenCount>, Infallible> {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for token in rows.iter().flat_map(|row| &row.ids) {
        *counts.entry(*token).or_default() += 1;
    }
    Ok(counts
        .into_iter()
        .map(|(token, count)| TokenCount { token, count })
        .collect())
}
register_batch_fn!(count_tokens);

/// `-Σ p ln p` of the frequencies `counts`; none without any.
fn entropy(counts: impl IntoIterator<Item = u64>) -> Option<f64> {
    let counts: Vec<f64> = counts.into_iter().filter(|&c| c > 0).map(|c| c as f64).collect();
    let total: f64 = counts.iter().sum();
    if total == 0.0 {
        return None;
    }
    Some(-counts.iter().map(|c| c / total * (c / total).ln()).sum::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_is_zero_for_one_token_and_ln_n_for_n_equal_ones() {
        assert_eq!(entropy([7]), Some(0.0));
        let uniform = entropy([5; 8]).unwrap();
        assert!((uniform - 8f64.ln()).abs() < 1e-12, "{uniform}");
        let skewed = entropy([90, 5, 5]).unwrap();
        assert!(skewed > 0.0 && skewed < 3f64.ln(), "{skewed}");
        assert_eq!(entropy([]), None);
    }

    #[test]
    fn tokens_are_counted_over_all_rows() {
        let rows = vec![TokenRow { ids: vec![1, 2, 2] }, TokenRow { ids: vec![2, 3, 1] }];
        let mut counts = count_tokens(rows).unwrap();
        counts.sort_by_key(|count| count.token);
        let pairs: Vec<(u32, u64)> = counts.iter().map(|c| (c.token, c.count)).collect();
        assert_eq!(pairs, [(1, 2), (2, 3), (3, 1)]);
    }
}
