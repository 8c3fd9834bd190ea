//! Arrow data in a dataset: [`Arrow`], the row type of datasets whose
//! blocks are Arrow record batches (`read_parquet`), blocks encoded as
//! Arrow IPC streams between processes, and typed rows read from record
//! batches (through `serde_arrow`).

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::rows_error::{RowsError, column_names};

/// The row type of a dataset held as Arrow record batches, as
/// `read_parquet` makes it: its batches are [`RecordBatch`]es (numeric
/// columns move without a per-row encode), and
/// [`rows`](crate::Dataset::rows) reads each row as a typed struct.
#[derive(Debug)]
pub struct Arrow;

/// `batches` as one Arrow IPC stream (nothing for no batches).
pub(crate) fn encode_ipc(batches: &[RecordBatch]) -> Result<Vec<u8>, RowsError> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    let error = RowsError::arrow("writing an Arrow IPC block");
    let mut writer = StreamWriter::try_new(Vec::new(), &first.schema()).map_err(error)?;
    for batch in batches {
        writer.write(batch).map_err(error)?;
    }
    writer.into_inner().map_err(error)
}

/// The record batches of an Arrow IPC stream. Their columns are the
/// stream's own bytes (a `Vec`, or `SharedBytes` viewing the node's shared
/// memory) without a copy, except those whose start is not aligned for
/// their type, which Arrow copies to an aligned buffer.
pub(crate) fn decode_ipc(bytes: impl Into<Bytes>) -> Result<Vec<RecordBatch>, RowsError> {
    let error = RowsError::arrow("reading an Arrow IPC block");
    let mut buffer = Buffer::from(bytes.into());
    let (mut decoder, mut batches) = (StreamDecoder::new(), Vec::new());
    while !buffer.is_empty() {
        batches.extend(decoder.decode(&mut buffer).map_err(error)?);
    }
    decoder.finish().map_err(error)?;
    Ok(batches)
}

/// Every row of `batches` as a `T`, its fields taken from the columns of
/// the same names.
pub(crate) fn batches_to_rows<T: DeserializeOwned>(batches: &[RecordBatch]) -> Result<Vec<T>, RowsError> {
    let mut rows = Vec::with_capacity(batches.iter().map(RecordBatch::num_rows).sum());
    for batch in batches {
        let batch_rows: Vec<T> = serde_arrow::from_record_batch(batch).map_err(|source| RowsError::FromColumns {
            type_name: std::any::type_name::<T>(),
            columns: column_names(batch.schema_ref()),
            source,
        })?;
        rows.extend(batch_rows);
    }
    Ok(rows)
}

/// `rows` as one record batch, a column per field (the types traced from
/// the rows themselves).
#[cfg(feature = "parquet")]
pub(crate) fn rows_to_batch<T: serde::Serialize>(rows: &[T]) -> Result<RecordBatch, RowsError> {
    use arrow_schema::FieldRef;
    use serde_arrow::schema::{SchemaLike, TracingOptions};

    let options = TracingOptions::default().allow_null_fields(true);
    let fields = Vec::<FieldRef>::from_samples(rows, options).map_err(|source| RowsError::ColumnTypes {
        type_name: std::any::type_name::<T>(),
        source,
    })?;
    serde_arrow::to_record_batch(&fields, &rows).map_err(RowsError::ToColumns)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array};

    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Point {
        id: i64,
        x: f64,
    }

    #[test]
    fn batches_round_trip_through_ipc_and_read_as_rows() {
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("x", Arc::new(Float64Array::from(vec![0.5, 1.5])) as _),
        ])
        .unwrap();
        let bytes = encode_ipc(&[batch.clone(), batch.clone()]).unwrap();
        let decoded = decode_ipc(bytes).unwrap();
        assert_eq!(decoded, vec![batch.clone(), batch]);
        let rows: Vec<Point> = batches_to_rows(&decoded).unwrap();
        assert_eq!(rows[1], Point { id: 2, x: 1.5 });
        assert!(decode_ipc(Vec::new()).unwrap().is_empty());
        let error = decode_ipc(&b"garbage!"[..]).unwrap_err();
        assert!(matches!(error, RowsError::Arrow { .. }), "{error}");
        assert!(error.to_string().contains("Arrow IPC"), "{error}");
    }
}
