//! Samples of the machine's Python standard library: real text, small
//! enough for a test.

use raylet_models::corpus::{Corpus, SourceFile, Split};

/// Standard library files of `split` between 2 and 40 KB, about `bytes` in all.
pub fn stdlib_sample(stdlib: &Corpus, split: Split, bytes: usize) -> Vec<SourceFile> {
    let mut total = 0;
    stdlib
        .files()
        .iter()
        .filter(|file| Split::of(&file.relative_path) == split && (2_000..40_000).contains(&file.text.len()))
        .take_while(|file| {
            total += file.text.len();
            total <= bytes
        })
        .cloned()
        .collect()
}
