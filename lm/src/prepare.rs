//! Preparing the corpus for training: a tokenizer trained on the training
//! split, and both splits tokenized and packed on the cluster into Parquet
//! rows of `sequence_length + 1` token ids.
//!
//! [`prepare_corpus`] scans the corpus on the driver, trains the byte-level
//! BPE tokenizer there on the training split's texts alone (training is one
//! process's work in the `tokenizers` crate) and saves it as
//! `out_dir/tokenizer.json`. Then, for each split, a raylet-data pipeline
//! reads the split's files in blocks of `files_per_block`, tokenizes and
//! packs each block in a pool of actors that each load the tokenizer once
//! (see [`packing`](crate::packing) for the rows and the remainder), and
//! writes the rows with `write_parquet` to `out_dir/train` and
//! `out_dir/validation`: a file per block, recorded in raylet-data's
//! manifest, so every block's rows are there exactly once and a rerun
//! skips the blocks written. `out_dir/preparation.json` records the corpus
//! and options, so that a rerun with others is refused.
//!
//! The workers read the corpus files and the tokenizer by path: on a
//! cluster of several machines both must be on storage every node sees.

use std::path::{Path, PathBuf};

use raylet_data::{ActorPoolStrategy, Dataset, FileSet, WriteSummary};
use raylet_models::corpus::{Corpus, SourceFile, Split};
use raylet_models::tokenizer::LmTokenizer;

use crate::error::LmError;
use crate::packing::TokenizeAndPack;
use crate::preparation_record::{PreparationRecord, Recorded};

/// The tokenizer's file in the output directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The training split's rows' directory in the output directory.
pub const TRAIN_DIR: &str = "train";
/// The validation split's rows' directory in the output directory.
pub const VALIDATION_DIR: &str = "validation";

/// How the corpus becomes rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Tokens the tokenizer learns (fewer when the texts run out of merges).
    pub vocab_size: usize,
    /// Tokens a model reads per example; each row holds one more.
    pub sequence_length: usize,
    /// Source files per block: each block is tokenized as one stream and
    /// drops at most `sequence_length` tokens at its end.
    pub files_per_block: usize,
    /// The most actors tokenizing at once (each holds one CPU).
    pub max_actors: usize,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            vocab_size: 8192,
            sequence_length: 256,
            files_per_block: 64,
            max_actors: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

/// What [`prepare_corpus`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// The saved tokenizer (`out_dir/tokenizer.json`).
    pub tokenizer: PathBuf,
    /// Tokens in its vocabulary, `<|endoftext|>` included.
    pub vocab_size: usize,
    pub train: SplitSummary,
    pub validation: SplitSummary,
    /// Corpus files left out because they are not UTF-8 (relative paths).
    pub skipped: Vec<String>,
}

/// The rows written for one side of the split.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitSummary {
    /// Where its Parquet files are.
    pub dir: PathBuf,
    /// Corpus files read, and their UTF-8 bytes.
    pub source_files: usize,
    pub source_bytes: u64,
    /// Blocks of files, and how many of them a previous run had written.
    pub blocks: usize,
    pub blocks_skipped: usize,
    /// Rows of `sequence_length + 1` ids, and the ids in them.
    pub rows: u64,
    pub tokens: u64,
    /// The most tokens packing dropped: `sequence_length` per block.
    pub max_dropped_tokens: u64,
    /// The Parquet files.
    pub files: Vec<PathBuf>,
}

impl SplitSummary {
    /// Source bytes per token written. The dropped tails' bytes count and
    /// their tokens do not, so this overstates the tokenizer's compression
    /// by at most `max_dropped_tokens / tokens`.
    pub fn bytes_per_token(&self) -> f64 {
        self.source_bytes as f64 / self.tokens as f64
    }
}

/// Prepares the `.py` files under `corpus_dir` for training into `out_dir`
/// (see the [module](self) doc), on the current raylet cluster
/// (`raylet::init` first).
pub fn prepare_corpus(corpus_dir: &Path, out_dir: &Path, options: &PrepareOptions) -> Result<Prepared, LmError> {
    let corpus = Corpus::scan(corpus_dir)?;
    let corpus_dir = std::path::absolute(corpus_dir).map_err(LmError::io("resolving", corpus_dir))?;
    let out_dir = std::path::absolute(out_dir).map_err(LmError::io("resolving", out_dir))?;
    let train_files = split_files(&corpus, Split::Train, &corpus_dir)?;
    let validation_files = split_files(&corpus, Split::Validation, &corpus_dir)?;
    std::fs::create_dir_all(&out_dir).map_err(LmError::io("creating", &out_dir))?;
    let (tokenizer_json, vocab_size) = tokenizer_for(&corpus, &out_dir, options)?;
    let packer = TokenizeAndPack {
        tokenizer_json: tokenizer_json.clone(),
        sequence_length: options.sequence_length,
    };
    let train = write_split(&train_files, &corpus_dir, &out_dir.join(TRAIN_DIR), &packer, options)?;
    let validation = write_split(
        &validation_files,
        &corpus_dir,
        &out_dir.join(VALIDATION_DIR),
        &packer,
        options,
    )?;
    Ok(Prepared {
        tokenizer: tokenizer_json,
        vocab_size,
        train,
        validation,
        skipped: corpus.skipped().to_vec(),
    })
}

/// The files on `split`'s side, or an error when there are none.
fn split_files<'a>(corpus: &'a Corpus, split: Split, corpus_dir: &Path) -> Result<Vec<&'a SourceFile>, LmError> {
    let files: Vec<&SourceFile> = corpus
        .files()
        .iter()
        .filter(|file| Split::of(&file.relative_path) == split)
        .collect();
    if files.is_empty() {
        return Err(LmError::EmptySplit {
            split: split_name(split),
            corpus: corpus_dir.to_owned(),
        });
    }
    Ok(files)
}

fn split_name(split: Split) -> &'static str {
    match split {
        Split::Train => "training",
        Split::Validation => "validation",
    }
}

/// The saved tokenizer's path and vocabulary size: the one a previous run
/// of the same preparation saved, or one trained on the training split now.
fn tokenizer_for(corpus: &Corpus, out_dir: &Path, options: &PrepareOptions) -> Result<(PathBuf, usize), LmError> {
    let record = PreparationRecord::of(corpus, options);
    let path = out_dir.join(TOKENIZER_FILE);
    if record.check(out_dir)? == Recorded::Same
        && let Ok(saved) = LmTokenizer::load(&path)
    {
        return Ok((path, saved.vocab_size()));
    }
    let tokenizer = LmTokenizer::train(corpus.train_texts(), options.vocab_size)?;
    tokenizer.save(&path)?;
    record.write(out_dir)?;
    Ok((path, tokenizer.vocab_size()))
}

/// Tokenizes and packs `files` on the cluster into Parquet files in `dir`.
fn write_split(
    files: &[&SourceFile],
    corpus_dir: &Path,
    dir: &Path,
    packer: &TokenizeAndPack,
    options: &PrepareOptions,
) -> Result<SplitSummary, LmError> {
    let paths = files.iter().map(|file| corpus_dir.join(&file.relative_path));
    let pool = ActorPoolStrategy::autoscaling(1, options.max_actors);
    let written = Dataset::read_binary(FileSet::list(paths))
        .files_per_block(options.files_per_block)
        .map_batches_with(packer.clone(), options.files_per_block, pool)
        .write_parquet(dir)?;
    Ok(split_summary(files, dir, written, options.sequence_length))
}

fn split_summary(files: &[&SourceFile], dir: &Path, written: WriteSummary, sequence_length: usize) -> SplitSummary {
    let blocks = written.blocks_written + written.blocks_skipped;
    SplitSummary {
        dir: dir.to_owned(),
        source_files: files.len(),
        source_bytes: files.iter().map(|file| file.text.len() as u64).sum(),
        blocks,
        blocks_skipped: written.blocks_skipped,
        rows: written.rows,
        tokens: written.rows * (sequence_length as u64 + 1),
        max_dropped_tokens: (blocks * sequence_length) as u64,
        files: written.files,
    }
}
