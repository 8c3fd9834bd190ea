//! The record of what an output directory was prepared from
//! (`preparation.json`): the corpus's digest and the options that shape
//! the rows. raylet-data's manifest skips the blocks a previous run wrote
//! when their files and stages match, but it does not see the tokenizer
//! or the sequence length; this record does, so that a rerun with the same
//! corpus and options resumes (reusing the saved tokenizer) and any other
//! is refused instead of mixed in.

use std::path::{Path, PathBuf};

use raylet_models::corpus::Corpus;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::error::LmError;
use crate::prepare::PrepareOptions;

/// The record's name in the output directory.
const RECORD_FILE: &str = "preparation.json";

/// What identifies a preparation's outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PreparationRecord {
    /// XXH3 of every file's relative path and text, in path order.
    corpus_digest: String,
    vocab_size: usize,
    sequence_length: usize,
    files_per_block: usize,
}

/// Whether an output directory holds this preparation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Nothing was prepared there yet.
    Nothing,
    /// The same corpus and options: a rerun resumes.
    Same,
}

impl PreparationRecord {
    pub fn of(corpus: &Corpus, options: &PrepareOptions) -> Self {
        PreparationRecord {
            corpus_digest: format!("{:016x}", corpus_digest(corpus)),
            vocab_size: options.vocab_size,
            sequence_length: options.sequence_length,
            files_per_block: options.files_per_block,
        }
    }

    /// What `out_dir` records, or an error when it is another preparation.
    pub fn check(&self, out_dir: &Path) -> Result<Recorded, LmError> {
        let path = out_dir.join(RECORD_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Recorded::Nothing),
            Err(error) => return Err(LmError::io("reading", path)(error)),
        };
        match serde_json::from_str::<PreparationRecord>(&text) {
            Ok(recorded) if recorded == *self => Ok(Recorded::Same),
            _ => Err(LmError::OtherPreparation {
                path,
                recorded: text.trim().to_owned(),
                current: self.to_json(),
            }),
        }
    }

    /// Writes the record into `out_dir`.
    pub fn write(&self, out_dir: &Path) -> Result<PathBuf, LmError> {
        let path = out_dir.join(RECORD_FILE);
        std::fs::write(&path, self.to_json()).map_err(LmError::io("writing", &path))?;
        Ok(path)
    }

    fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record is JSON")
    }
}

fn corpus_digest(corpus: &Corpus) -> u64 {
    let mut hasher = Xxh3::new();
    for file in corpus.files() {
        for part in [file.relative_path.as_bytes(), file.text.as_bytes()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus_of(files: &[(&str, &str)]) -> (tempfile::TempDir, Corpus) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let corpus = Corpus::scan(dir.path()).unwrap();
        (dir, corpus)
    }

    #[test]
    fn a_directory_records_one_preparation_and_refuses_others() {
        let (_corpus_dir, corpus) = corpus_of(&[("a.py", "x = 1\n")]);
        let out = tempfile::tempdir().unwrap();
        let options = PrepareOptions::default();
        let record = PreparationRecord::of(&corpus, &options);
        assert_eq!(record.check(out.path()).unwrap(), Recorded::Nothing);
        record.write(out.path()).unwrap();
        assert_eq!(record.check(out.path()).unwrap(), Recorded::Same);

        let longer = PrepareOptions {
            sequence_length: options.sequence_length * 2,
            ..options.clone()
        };
        let error = PreparationRecord::of(&corpus, &longer).check(out.path()).unwrap_err();
        assert!(matches!(error, LmError::OtherPreparation { .. }), "{error:?}");

        let (_other_dir, other) = corpus_of(&[("a.py", "x = 2\n")]);
        let error = PreparationRecord::of(&other, &options).check(out.path()).unwrap_err();
        assert!(error.to_string().contains(RECORD_FILE), "{error}");
    }
}
