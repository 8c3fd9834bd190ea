//! Typed rows encoded one by one (postcard) into one buffer, with where
//! each ends: a task that does not know the rows' type can still cut,
//! reorder and join them (shuffles, repartitions), and a task that does
//! decodes each in place.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::rows_error::RowsError;

/// Rows of one type, each encoded alone, one after another. Not a public API.
#[doc(hidden)]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedRows {
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
    /// Where each row's encoding ends in `bytes`.
    ends: Vec<u64>,
}

impl EncodedRows {
    /// Encodes `rows`, each alone.
    pub fn encode<T: Serialize>(rows: &[T]) -> Result<Self, RowsError> {
        let mut encoded = EncodedRows {
            bytes: Vec::new(),
            ends: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            encoded.push(row)?;
        }
        Ok(encoded)
    }

    /// Appends one row.
    pub fn push<T: Serialize>(&mut self, row: &T) -> Result<(), RowsError> {
        let start = self.bytes.len();
        let length = raylet::codec::encoded_len(row).map_err(RowsError::codec("encoding its rows"))?;
        self.bytes.resize(start + length, 0);
        raylet::codec::encode_into(row, &mut self.bytes[start..]).map_err(RowsError::codec("encoding its rows"))?;
        self.ends.push(self.bytes.len() as u64);
        Ok(())
    }

    /// Appends rows already encoded one by one (an item's encoding).
    pub fn push_encoded(&mut self, encoded: &[u8]) {
        self.bytes.extend_from_slice(encoded);
        self.ends.push(self.bytes.len() as u64);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The memory the rows take: their encodings and where each ends.
    pub fn bytes(&self) -> u64 {
        (self.bytes.len() + self.ends.len() * std::mem::size_of::<u64>()) as u64
    }

    /// The encoding of row `index`.
    pub fn row(&self, index: usize) -> &[u8] {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1] as usize,
        };
        &self.bytes[start..self.ends[index] as usize]
    }

    /// Every row, decoded as a `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<Vec<T>, RowsError> {
        (0..self.len())
            .map(|index| raylet::codec::decode(self.row(index)).map_err(RowsError::codec("decoding its rows")))
            .collect()
    }

    /// The rows at `indices`, in that order.
    pub fn select(&self, indices: impl IntoIterator<Item = usize>) -> EncodedRows {
        let mut selected = EncodedRows::default();
        for index in indices {
            selected.push_encoded(self.row(index));
        }
        selected
    }

    /// All rows of `parts`, one part after another.
    pub fn concat<'a>(parts: impl IntoIterator<Item = &'a EncodedRows>) -> EncodedRows {
        let mut joined = EncodedRows::default();
        for part in parts {
            let offset = joined.bytes.len() as u64;
            joined.bytes.extend_from_slice(&part.bytes);
            joined.ends.extend(part.ends.iter().map(|end| end + offset));
        }
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_cut_reordered_and_joined_without_their_type() {
        let rows: Vec<(u64, String)> = (0..5).map(|n| (n, "x".repeat(n as usize))).collect();
        let encoded = EncodedRows::encode(&rows).unwrap();
        assert_eq!(encoded.decode::<(u64, String)>().unwrap(), rows);
        let reversed = encoded.select((0..5).rev());
        let joined = EncodedRows::concat([&reversed, &encoded.select([1])]);
        let decoded: Vec<(u64, String)> = joined.decode().unwrap();
        assert_eq!(decoded.iter().map(|r| r.0).collect::<Vec<_>>(), [4, 3, 2, 1, 0, 1]);
        let error = EncodedRows::encode(&[1u8]).unwrap().decode::<String>().unwrap_err();
        assert!(matches!(error, RowsError::Codec { .. }), "{error}");
    }
}
