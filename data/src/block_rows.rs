//! A block's rows as tasks hold them: typed rows encoded one by one, or
//! Arrow record batches, each row with the input it came from. Rows of
//! either kind can be counted, picked out, reordered and joined without
//! knowing their type, which is what shuffles and repartitions need.

use std::sync::Arc;

use arrow::array::{RecordBatch, UInt32Array};
use arrow_schema::Schema;

use crate::encoded_rows::EncodedRows;
use crate::rows_error::{RowsError, column_names};

/// A block's rows between stages. Not a public API.
#[doc(hidden)]
pub enum RowData {
    /// Typed rows, each encoded alone.
    Encoded(EncodedRows),
    /// Arrow record batches.
    Arrow(Vec<RecordBatch>),
}

/// Rows a stage works on, with the input each came from. Not a public API.
#[doc(hidden)]
pub struct BlockRows {
    pub data: RowData,
    /// Per row, the index of its input (file or item) within the block.
    pub origins: Vec<u32>,
}

impl RowData {
    pub fn len(&self) -> usize {
        match self {
            RowData::Encoded(rows) => rows.len(),
            RowData::Arrow(batches) => batches.iter().map(RecordBatch::num_rows).sum(),
        }
    }

    /// The memory the rows take.
    pub fn bytes(&self) -> u64 {
        match self {
            RowData::Encoded(rows) => rows.bytes(),
            RowData::Arrow(batches) => batches.iter().map(|b| b.get_array_memory_size() as u64).sum(),
        }
    }

    /// The Arrow rows as one batch (`None` for none at all).
    pub fn single_batch(batches: &[RecordBatch]) -> Result<Option<RecordBatch>, RowsError> {
        match batches {
            [] => Ok(None),
            [one] => Ok(Some(one.clone())),
            [first, ..] => arrow::compute::concat_batches(&first.schema(), batches)
                .map(Some)
                .map_err(RowsError::arrow("joining record batches")),
        }
    }

    /// The rows at `indices`, in that order.
    pub fn select(&self, indices: &[u32]) -> Result<RowData, RowsError> {
        match self {
            RowData::Encoded(rows) => Ok(RowData::Encoded(rows.select(indices.iter().map(|i| *i as usize)))),
            RowData::Arrow(batches) => {
                let Some(batch) = Self::single_batch(batches)? else {
                    return Ok(RowData::Arrow(Vec::new()));
                };
                let picked = arrow::compute::take_record_batch(&batch, &UInt32Array::from(indices.to_vec()))
                    .map_err(RowsError::arrow("picking rows"))?;
                Ok(RowData::Arrow(vec![picked]))
            }
        }
    }

    /// The rows of all `parts`, one after another; they must all be typed
    /// or all Arrow with one schema.
    pub fn concat(parts: Vec<RowData>) -> Result<RowData, RowsError> {
        let mut typed = Vec::new();
        let mut batches = Vec::new();
        for part in parts {
            match part {
                RowData::Encoded(rows) => typed.push(rows),
                RowData::Arrow(part) => batches.extend(part.into_iter().filter(|b| b.num_rows() > 0)),
            }
        }
        match (typed.is_empty(), batches.is_empty()) {
            (false, false) => Err(RowsError::MixedKinds { doing: "joining" }),
            (true, false) => {
                let schema: Arc<Schema> = batches[0].schema();
                if let Some(other) = batches.iter().find(|b| b.schema() != schema) {
                    return Err(RowsError::ColumnsDiffer {
                        left: column_names(&schema),
                        right: column_names(other.schema_ref()),
                    });
                }
                Ok(RowData::Arrow(batches))
            }
            (false, true) => Ok(RowData::Encoded(EncodedRows::concat(&typed))),
            (true, true) => Ok(RowData::Arrow(Vec::new())),
        }
    }
}

impl RowData {
    /// Each row of `self` beside the row of `other` at the same place: typed
    /// rows as pairs (a pair's encoding is its two rows' one after the
    /// other), Arrow rows as the columns of both (a name both have gets
    /// `_1` on the right).
    pub fn zip(self, other: RowData) -> Result<RowData, RowsError> {
        if self.len() != other.len() {
            return Err(RowsError::LengthsDiffer {
                left: self.len(),
                right: other.len(),
            });
        }
        match (self, other) {
            (RowData::Encoded(left), RowData::Encoded(right)) => {
                let mut pairs = EncodedRows::default();
                for row in 0..left.len() {
                    pairs.push_encoded(&[left.row(row), right.row(row)].concat());
                }
                Ok(RowData::Encoded(pairs))
            }
            (RowData::Arrow(left), RowData::Arrow(right)) => {
                let (Some(left), Some(right)) = (Self::single_batch(&left)?, Self::single_batch(&right)?) else {
                    return Ok(RowData::Arrow(Vec::new()));
                };
                let mut columns: Vec<(String, arrow::array::ArrayRef)> = Vec::new();
                for (field, column) in left.schema().fields().iter().zip(left.columns()) {
                    columns.push((field.name().clone(), column.clone()));
                }
                for (field, column) in right.schema().fields().iter().zip(right.columns()) {
                    let mut name = field.name().clone();
                    while columns.iter().any(|(taken, _)| *taken == name) {
                        name.push_str("_1");
                    }
                    columns.push((name, column.clone()));
                }
                let batch = RecordBatch::try_from_iter(columns).map_err(RowsError::arrow("zipping columns"))?;
                Ok(RowData::Arrow(vec![batch]))
            }
            _ => Err(RowsError::MixedKinds { doing: "zipping" }),
        }
    }
}
