//! Prepares the whole Python standard library on an embedded cluster and
//! prints what was written: `prepare_stdlib OUT_DIR [VOCAB_SIZE]
//! [SEQUENCE_LENGTH]` (defaults 8192 and 256).

use std::path::PathBuf;
use std::time::Instant;

use raylet_lm::prepare::SplitSummary;
use raylet_lm::{PrepareOptions, prepare_corpus, unigram_entropy};
use raylet_models::corpus::stdlib_dir;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out_dir = PathBuf::from(
        args.next()
            .ok_or("usage: prepare_stdlib OUT_DIR [VOCAB_SIZE] [SEQUENCE_LENGTH]")?,
    );
    let defaults = PrepareOptions::default();
    let options = PrepareOptions {
        vocab_size: args.next().map_or(Ok(defaults.vocab_size), |arg| arg.parse())?,
        sequence_length: args.next().map_or(Ok(defaults.sequence_length), |arg| arg.parse())?,
        ..defaults
    };
    raylet::init()?;
    let started = Instant::now();
    let prepared = prepare_corpus(&stdlib_dir()?, &out_dir, &options)?;
    println!("prepared in {:.1} s with {options:?}", started.elapsed().as_secs_f64());
    println!(
        "vocabulary: {} tokens; skipped (not UTF-8): {:?}",
        prepared.vocab_size, prepared.skipped
    );
    print_split("train", &prepared.train);
    print_split("validation", &prepared.validation);
    let entropy = unigram_entropy(&prepared.train.dir)?;
    println!("unigram entropy of the training rows: {entropy:.3} nats per token");
    Ok(())
}

fn print_split(name: &str, split: &SplitSummary) {
    println!(
        "{name}: {} files, {:.2} MB, {} blocks ({} skipped), {} rows, {} tokens (at most {} dropped), \
         {:.2} bytes per token, {} Parquet files",
        split.source_files,
        split.source_bytes as f64 / 1e6,
        split.blocks,
        split.blocks_skipped,
        split.rows,
        split.tokens,
        split.max_dropped_tokens,
        split.bytes_per_token(),
        split.files.len()
    );
}
