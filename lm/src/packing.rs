//! Tokenizing and packing, in the cluster's actors: each actor loads the
//! tokenizer once (from its `tokenizer.json`, a path every node can read)
//! and turns each block of source files into rows of token ids.
//!
//! A block's files, in path order, become one stream of ids: each file's
//! encoding followed by `<|endoftext|>`, so that one end-of-text token
//! separates consecutive documents. The stream is cut into rows of exactly
//! `sequence_length + 1` ids (a model reads the first `sequence_length`
//! and predicts the last `sequence_length`); rows start wherever the
//! previous one ended, so documents run across row boundaries. The tail of
//! the stream too short for a row, at most `sequence_length` ids, is
//! dropped: rows never straddle blocks, so at most `sequence_length` ids
//! per block are lost.

use std::path::PathBuf;

use raylet_data::{BatchModel, FileBytes, ModelError, register_batch_model};
use raylet_models::tokenizer::LmTokenizer;
use serde::{Deserialize, Serialize};

/// One training example: `sequence_length + 1` consecutive token ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRow {
    pub ids: Vec<u32>,
}

/// The batch model that tokenizes a block's files and packs their ids into
/// rows; a batch must be a whole block for rows to be packed per block.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TokenizeAndPack {
    pub tokenizer_json: PathBuf,
    pub sequence_length: usize,
}
register_batch_model!(TokenizeAndPack);

impl BatchModel for TokenizeAndPack {
    type In = FileBytes;
    type Out = TokenRow;
    type State = LmTokenizer;

    fn load(&self) -> Result<LmTokenizer, ModelError> {
        Ok(LmTokenizer::load(&self.tokenizer_json)?)
    }

    fn predict(&self, tokenizer: &mut LmTokenizer, files: Vec<FileBytes>) -> Result<Vec<TokenRow>, ModelError> {
        let stream = token_stream(tokenizer, files)?;
        Ok(pack(&stream, self.sequence_length + 1))
    }
}

/// The ids of `files`, each file's followed by the end-of-text token.
fn token_stream(tokenizer: &LmTokenizer, files: Vec<FileBytes>) -> Result<Vec<u32>, ModelError> {
    let mut stream = Vec::new();
    for file in files {
        let text = String::from_utf8(file.bytes).map_err(|e| format!("{} is not UTF-8: {e}", file.path))?;
        stream.extend(tokenizer.encode(&text)?);
        stream.push(tokenizer.eot_id());
    }
    Ok(stream)
}

/// `stream` cut into rows of `row_length` ids, the shorter tail dropped.
fn pack(stream: &[u32], row_length: usize) -> Vec<TokenRow> {
    stream
        .chunks_exact(row_length)
        .map(|ids| TokenRow { ids: ids.to_vec() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_cut_into_full_rows_and_its_short_tail_dropped() {
        let stream: Vec<u32> = (0..11).collect();
        let rows = pack(&stream, 4);
        assert_eq!(
            rows,
            [vec![0, 1, 2, 3], vec![4, 5, 6, 7]].map(|ids| TokenRow { ids }),
            "ids 8..11 are fewer than a row"
        );
        assert!(pack(&stream[..3], 4).is_empty());
        assert_eq!(
            pack(&stream[..8], 4).len(),
            2,
            "nothing dropped from a whole number of rows"
        );
    }

    #[test]
    fn every_document_ends_with_one_end_of_text_token() {
        let tokenizer = LmTokenizer::train(["def f(x):\n    return x\n"; 10], 300).unwrap();
        let files = ["a = 1\n", "b = 2\n"].map(|text| FileBytes {
            path: "m.py".into(),
            bytes: text.as_bytes().to_vec(),
        });
        let stream = token_stream(&tokenizer, files.to_vec()).unwrap();
        let mut expected = tokenizer.encode("a = 1\n").unwrap();
        expected.push(tokenizer.eot_id());
        expected.extend(tokenizer.encode("b = 2\n").unwrap());
        expected.push(tokenizer.eot_id());
        assert_eq!(stream, expected);
    }

    #[test]
    fn a_file_that_is_not_utf8_is_an_error_naming_it() {
        let tokenizer = LmTokenizer::train(["x = 1\n"; 10], 260).unwrap();
        let file = FileBytes {
            path: "latin1.py".into(),
            bytes: b"name = '\xe9'\n".to_vec(),
        };
        let error = token_stream(&tokenizer, vec![file]).unwrap_err();
        assert!(error.to_string().contains("latin1.py"), "{error}");
    }
}
