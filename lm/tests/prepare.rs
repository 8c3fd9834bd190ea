//! Preparing a small corpus of real standard library files on an embedded
//! cluster: the rows are exactly the packed encodings of their split's
//! files, a rerun resumes without duplicates, and bad inputs fail clearly.

use std::path::{Path, PathBuf};

use raylet_lm::prepare::{TOKENIZER_FILE, TRAIN_DIR, VALIDATION_DIR};
use raylet_lm::{LmError, PrepareOptions, Prepared, TokenRow, prepare_corpus, token_rows, unigram_entropy};
use raylet_models::corpus::{Corpus, CorpusError, Split, stdlib_dir};
use raylet_models::tokenizer::LmTokenizer;

use crate::stdlib_sample::stdlib_sample;

const VOCAB_SIZE: usize = 512;
const SEQUENCE_LENGTH: usize = 64;
const FILES_PER_BLOCK: usize = 4;
/// About how many bytes of each split the small corpus holds.
const TRAIN_BYTES: usize = 200_000;
const VALIDATION_BYTES: usize = 40_000;
/// A file that is not UTF-8, to be listed as skipped.
const LATIN1_FILE: &str = "latin1_module.py";

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

fn options() -> PrepareOptions {
    PrepareOptions {
        vocab_size: VOCAB_SIZE,
        sequence_length: SEQUENCE_LENGTH,
        files_per_block: FILES_PER_BLOCK,
        max_actors: 2,
    }
}

/// A corpus directory of real standard library files under their own
/// relative paths (so on their own side of the split), and a file that is
/// not UTF-8.
fn small_corpus(root: &Path) -> PathBuf {
    let stdlib = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
    let dir = root.join("corpus");
    let train = stdlib_sample(&stdlib, Split::Train, TRAIN_BYTES);
    let validation = stdlib_sample(&stdlib, Split::Validation, VALIDATION_BYTES);
    assert!(
        train.len() > 2 * FILES_PER_BLOCK && validation.len() >= 2,
        "too few files"
    );
    for file in train.iter().chain(&validation) {
        let path = dir.join(&file.relative_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &file.text).unwrap();
    }
    std::fs::write(dir.join(LATIN1_FILE), b"name = '\xe9'\n").unwrap();
    dir
}

/// The rows packing gives, computed here from the files of `split`: the
/// files in path order cut into blocks, each block's documents encoded and
/// followed by end-of-text, the stream cut into full rows.
fn expected_rows(corpus_dir: &Path, split: Split, tokenizer: &LmTokenizer) -> Vec<Vec<u32>> {
    let corpus = Corpus::scan(corpus_dir).unwrap();
    let mut paths: Vec<(String, &str)> = corpus
        .files()
        .iter()
        .filter(|file| Split::of(&file.relative_path) == split)
        .map(|file| {
            (
                corpus_dir.join(&file.relative_path).display().to_string(),
                file.text.as_str(),
            )
        })
        .collect();
    paths.sort();
    let mut rows = Vec::new();
    for block in paths.chunks(FILES_PER_BLOCK) {
        let mut stream = Vec::new();
        for (_, text) in block {
            stream.extend(tokenizer.encode(text).unwrap());
            stream.push(tokenizer.eot_id());
        }
        rows.extend(stream.chunks_exact(SEQUENCE_LENGTH + 1).map(<[u32]>::to_vec));
    }
    rows.sort();
    rows
}

/// The rows in `dir`, read back through [`token_rows`], sorted.
fn rows_in(dir: &Path) -> Vec<Vec<u32>> {
    let mut rows: Vec<Vec<u32>> = token_rows(dir)
        .show_progress(false)
        .take_all()
        .unwrap()
        .into_iter()
        .map(|row: TokenRow| row.ids)
        .collect();
    rows.sort();
    rows
}

/// The names of the Parquet files in `dir`, sorted.
fn parquet_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".parquet"))
        .collect();
    names.sort();
    names
}

fn prepare(corpus_dir: &Path, out_dir: &Path) -> Prepared {
    prepare_corpus(corpus_dir, out_dir, &options()).unwrap()
}

#[test]
fn each_split_holds_exactly_the_packed_encodings_of_its_own_files() {
    init();
    let root = tempfile::tempdir().unwrap();
    let corpus_dir = small_corpus(root.path());
    let out = root.path().join("prepared");

    let prepared = prepare(&corpus_dir, &out);

    assert_eq!(prepared.tokenizer, out.join(TOKENIZER_FILE));
    let tokenizer = LmTokenizer::load(&prepared.tokenizer).unwrap();
    assert_eq!((tokenizer.vocab_size(), prepared.vocab_size), (VOCAB_SIZE, VOCAB_SIZE));
    assert_eq!(prepared.skipped, [LATIN1_FILE]);
    for (split, summary, dir) in [
        (Split::Train, &prepared.train, TRAIN_DIR),
        (Split::Validation, &prepared.validation, VALIDATION_DIR),
    ] {
        let rows = rows_in(&out.join(dir));
        assert!(!rows.is_empty(), "{split:?} has rows");
        assert!(rows.iter().all(|row| row.len() == SEQUENCE_LENGTH + 1));
        assert!(rows.iter().flatten().all(|&id| (id as usize) < VOCAB_SIZE));
        assert_eq!(rows, expected_rows(&corpus_dir, split, &tokenizer), "{split:?}");
        assert_eq!(summary.rows, rows.len() as u64);
        assert_eq!(summary.tokens, summary.rows * (SEQUENCE_LENGTH as u64 + 1));
        assert_eq!(summary.blocks, summary.source_files.div_ceil(FILES_PER_BLOCK));
        assert_eq!(summary.files.len(), parquet_files(&summary.dir).len());
        let bytes_per_token = summary.bytes_per_token();
        assert!((1.5..8.0).contains(&bytes_per_token), "{split:?}: {bytes_per_token}");
    }
    assert!(prepared.train.blocks > 1, "the training split spans blocks");

    let entropy = unigram_entropy(&out.join(TRAIN_DIR)).unwrap();
    assert!(entropy > 1.0 && entropy < (VOCAB_SIZE as f64).ln(), "{entropy} nats");
}

#[test]
fn a_rerun_resumes_without_duplicates_and_a_fresh_run_writes_the_same_rows() {
    init();
    let root = tempfile::tempdir().unwrap();
    let corpus_dir = small_corpus(root.path());
    let first_dir = root.path().join("first");
    let first = prepare(&corpus_dir, &first_dir);
    let rows_of = |dir: &Path| [TRAIN_DIR, VALIDATION_DIR].map(|split| rows_in(&dir.join(split)));
    let files_of = |dir: &Path| [TRAIN_DIR, VALIDATION_DIR].map(|split| parquet_files(&dir.join(split)));
    let (first_rows, first_files) = (rows_of(&first_dir), files_of(&first_dir));

    let rerun = prepare(&corpus_dir, &first_dir);
    assert_eq!(
        rerun.train.blocks_skipped, first.train.blocks,
        "every block was written"
    );
    assert_eq!(rerun.validation.blocks_skipped, first.validation.blocks);
    assert_eq!(
        (&rerun.train.files, rerun.train.rows),
        (&first.train.files, first.train.rows)
    );
    assert_eq!(files_of(&first_dir), first_files, "no file added");
    assert_eq!(rows_of(&first_dir), first_rows);

    let second_dir = root.path().join("second");
    let second = prepare(&corpus_dir, &second_dir);
    assert_eq!(second.train.blocks_skipped, 0);
    assert_eq!(
        std::fs::read(&second.tokenizer).unwrap(),
        std::fs::read(&first.tokenizer).unwrap(),
        "the tokenizer trains the same"
    );
    assert_eq!(rows_of(&second_dir), first_rows);

    let longer = PrepareOptions {
        sequence_length: 2 * SEQUENCE_LENGTH,
        ..options()
    };
    let error = prepare_corpus(&corpus_dir, &first_dir, &longer).unwrap_err();
    assert!(matches!(error, LmError::OtherPreparation { .. }), "{error:?}");
}

#[test]
fn a_missing_corpus_directory_fails_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("no-such-corpus");
    let error = prepare_corpus(&missing, &root.path().join("out"), &options()).unwrap_err();
    assert!(
        matches!(error, LmError::Corpus(CorpusError::Unreadable { .. })),
        "{error:?}"
    );
    assert!(error.to_string().contains(&missing.display().to_string()), "{error}");
    assert!(!root.path().join("out").exists(), "nothing written");
}

#[test]
fn a_corpus_without_validation_files_is_refused_before_any_work() {
    let root = tempfile::tempdir().unwrap();
    let corpus_dir = root.path().join("corpus");
    std::fs::create_dir_all(&corpus_dir).unwrap();
    let name = (0..)
        .map(|index| format!("module_{index}.py"))
        .find(|name| Split::of(name) == Split::Train)
        .unwrap();
    std::fs::write(corpus_dir.join(&name), "x = 1\n").unwrap();
    let error = prepare_corpus(&corpus_dir, &root.path().join("out"), &options()).unwrap_err();
    assert!(
        matches!(
            error,
            LmError::EmptySplit {
                split: "validation",
                ..
            }
        ),
        "{error:?}"
    );
}
