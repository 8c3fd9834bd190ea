//! A byte-level BPE tokenizer for the language model, trained with Hugging
//! Face's `tokenizers`.
//!
//! Text is split GPT-2's way (words, numbers, punctuation runs and
//! whitespace runs, by regex) and each piece is mapped byte by byte onto 256
//! printable characters; BPE then learns merges of those up to the asked
//! vocabulary size. Every byte is in the initial alphabet, so any text
//! encodes, and decoding the ids of a text gives the text back exactly.
//! `<|endoftext|>` is a special token that separates documents; it is never
//! merged with its neighbours, and a text containing it encodes it as
//! [`LmTokenizer::eot_id`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use thiserror::Error;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The token that separates documents.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The 256 byte tokens and [`END_OF_TEXT`].
const MIN_VOCAB_SIZE: usize = 257;

/// Why a tokenizer cannot be trained, saved or loaded, or a text encoded or
/// decoded. The `tokenizers` crate's own errors are boxed trait objects,
/// kept here as they come.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("a vocabulary of {asked} tokens is too small: byte-level BPE needs at least {MIN_VOCAB_SIZE}")]
    VocabTooSmall { asked: usize },
    #[error("training the BPE tokenizer failed: {0}")]
    Train(tokenizers::Error),
    #[error("encoding a text failed: {0}")]
    Encode(tokenizers::Error),
    #[error("decoding {tokens} tokens failed: {error}")]
    Decode { tokens: usize, error: tokenizers::Error },
    #[error("saving the tokenizer to {path} failed: {error}")]
    Save { path: PathBuf, error: tokenizers::Error },
    #[error("loading a tokenizer from {path} failed: {error}")]
    Load { path: PathBuf, error: tokenizers::Error },
    #[error("the tokenizer in {0} has no {END_OF_TEXT} token")]
    NoEndOfText(PathBuf),
}

/// A trained byte-level BPE tokenizer and its end-of-text token.
#[derive(Clone)]
pub struct LmTokenizer {
    tokenizer: Tokenizer,
    eot_id: u32,
}

impl LmTokenizer {
    /// Learns a vocabulary of `vocab_size` tokens (the 256 bytes,
    /// [`END_OF_TEXT`] and the merges) from `texts`, or fewer when the texts
    /// run out of pairs worth merging.
    pub fn train<I, S>(texts: I, vocab_size: usize) -> Result<Self, TokenizerError>
    where
        I: IntoIterator<Item = S>,
        I::IntoIter: Send,
        S: AsRef<str> + Send,
    {
        if vocab_size < MIN_VOCAB_SIZE {
            return Err(TokenizerError::VocabTooSmall { asked: vocab_size });
        }
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer
            .with_pre_tokenizer(Some(byte_level()))
            .with_decoder(Some(ByteLevelDecoder::default()));
        let mut trainer = TrainerWrapper::BpeTrainer(
            BpeTrainerBuilder::new()
                .vocab_size(vocab_size)
                .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
                .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
                .show_progress(false)
                .build(),
        );
        tokenizer
            .train(&mut trainer, texts.into_iter())
            .map_err(TokenizerError::Train)?;
        let eot_id = tokenizer
            .token_to_id(END_OF_TEXT)
            .expect("the trainer adds its special tokens to the vocabulary");
        Ok(LmTokenizer { tokenizer, eot_id })
    }

    /// Reads a tokenizer [`save`](Self::save)d before (Hugging Face's
    /// `tokenizer.json` format).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let tokenizer = Tokenizer::from_file(path).map_err(|error| TokenizerError::Load {
            path: path.to_owned(),
            error,
        })?;
        let eot_id = tokenizer
            .token_to_id(END_OF_TEXT)
            .ok_or_else(|| TokenizerError::NoEndOfText(path.to_owned()))?;
        Ok(LmTokenizer { tokenizer, eot_id })
    }

    /// Writes the tokenizer as Hugging Face's `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        self.tokenizer.save(path, false).map_err(|error| TokenizerError::Save {
            path: path.to_owned(),
            error,
        })
    }

    /// The token ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; ids outside the vocabulary are left out, and byte
    /// sequences that are not UTF-8 (possible in generated ids) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|error| TokenizerError::Decode {
                tokens: ids.len(),
                error,
            })
    }

    /// Tokens in the vocabulary, [`END_OF_TEXT`] included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of [`END_OF_TEXT`].
    pub fn eot_id(&self) -> u32 {
        self.eot_id
    }

    /// The bytes each token id stands for, indexed by id: what a server
    /// streams token by token, holding back a character whose bytes span
    /// tokens. [`END_OF_TEXT`] stands for none (it separates documents).
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let byte_of_char: HashMap<char, u8> = byte_level_chars().map(|(byte, char)| (char, byte)).collect();
        (0..self.vocab_size() as u32)
            .map(|id| match self.tokenizer.id_to_token(id) {
                Some(_) if id == self.eot_id => Vec::new(),
                Some(token) => token.chars().filter_map(|c| byte_of_char.get(&c).copied()).collect(),
                None => Vec::new(),
            })
            .collect()
    }
}

/// GPT-2's map from each byte to the printable character that stands for
/// it in a byte-level token: printable Latin-1 bytes stand for
/// themselves, the others for the characters from U+0100 on, in order.
fn byte_level_chars() -> impl Iterator<Item = (u8, char)> {
    let printable = |byte: u8| matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0;
    (0..=255u8).map(move |byte| {
        if printable(byte) {
            return (byte, char::from(byte));
        }
        let stand_in = char::from_u32(256 + shifted).expect("U+0100 to U+0143 are characters");
        shifted += 1;
        (byte, stand_in)
    })
}

/// GPT-2's byte-level pre-tokenizer, without a space added before the text
/// (which would not decode back to the text).
fn byte_level() -> ByteLevel {
    ByteLevel::default().add_prefix_space(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Corpus, stdlib_dir};

    const TRAINING_BYTES: usize = 400_000;
    const VOCAB_SIZE: usize = 2048;

    /// The first files of the standard library's training split, about
    /// [`TRAINING_BYTES`] in all.
    fn training_sample(corpus: &Corpus) -> Vec<&str> {
        let mut total = 0;
        corpus
            .train_texts()
            .take_while(|text| {
                total += text.len();
                total <= TRAINING_BYTES
            })
            .collect()
    }

    #[test]
    fn a_tokenizer_trained_on_the_stdlib_round_trips_and_compresses_validation_files() {
        let corpus = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
        let tokenizer = LmTokenizer::train(training_sample(&corpus), VOCAB_SIZE).unwrap();
        assert_eq!(tokenizer.vocab_size(), VOCAB_SIZE);

        let (mut bytes, mut tokens) = (0, 0);
        for text in corpus.validation_texts().take(20) {
            let ids = tokenizer.encode(text).unwrap();
            assert!(ids.iter().all(|&id| (id as usize) < VOCAB_SIZE));
            assert_eq!(tokenizer.decode(&ids).unwrap(), text);
            bytes += text.len();
            tokens += ids.len();
        }
        let bytes_per_token = bytes as f64 / tokens as f64;
        assert!(
            bytes_per_token > 2.0,
            "{bytes_per_token} bytes per token over {bytes} bytes"
        );
    }

    #[test]
    fn a_saved_tokenizer_loads_with_the_same_encodings() {
        let texts = [
            "def add(a, b):\n    return a + b\n",
            "class Point:\n    x: int\n    y: int\n",
        ];
        let tokenizer = LmTokenizer::train(texts.repeat(20), 300).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tokenizer.save(&path).unwrap();

        let loaded = LmTokenizer::load(&path).unwrap();

        let probe = "def scale(point, k):\n    return Point(k * point.x, k * point.y)  # \u{e9}\n";
        assert_eq!(loaded.encode(probe).unwrap(), tokenizer.encode(probe).unwrap());
        assert_eq!(loaded.vocab_size(), tokenizer.vocab_size());
        assert_eq!(loaded.eot_id(), tokenizer.eot_id());
    }

    #[test]
    fn end_of_text_is_one_token_that_decodes_back() {
        let tokenizer = LmTokenizer::train(["x = 1\n"; 10], 260).unwrap();
        let text = format!("a = 1\n{END_OF_TEXT}b = 2\n");
        let ids = tokenizer.encode(&text).unwrap();
        assert_eq!(ids.iter().filter(|&&id| id == tokenizer.eot_id()).count(), 1, "{ids:?}");
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    }

    #[test]
    fn the_bytes_of_the_tokens_of_a_text_are_the_text() {
        let texts = ["def f(x):\n    return x  # caf\u{e9} \u{1f600}\n"; 20];
        let tokenizer = LmTokenizer::train(texts, 300).unwrap();
        let table = tokenizer.token_bytes();
        assert_eq!(table.len(), tokenizer.vocab_size());
        assert!(table[tokenizer.eot_id() as usize].is_empty());
        let probe = format!("x = '\u{e9}t\u{e9} \u{1f600}'\n\t{END_OF_TEXT}y\r\n");
        let ids = tokenizer.encode(&probe).unwrap();
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| table[id as usize].clone()).collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), probe.replace(END_OF_TEXT, ""));
    }

    #[test]
    fn a_vocabulary_smaller_than_the_bytes_is_refused() {
        let error = LmTokenizer::train(["x = 1\n"], 256).err().unwrap();
        assert!(
            matches!(error, TokenizerError::VocabTooSmall { asked: 256 }),
            "{error:?}"
        );
    }

    #[test]
    fn loading_a_missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.json");
        let error = LmTokenizer::load(&path).err().unwrap();
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    }
}
