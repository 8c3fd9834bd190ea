//! `read_csv`: files of delimited text read as Arrow record batches, with
//! a schema given or inferred once, from the head of the first file, so
//! that every block has the same columns.

use std::io::Cursor;

use arrow::array::RecordBatch;
use arrow::csv::ReaderBuilder;
use arrow::csv::reader::Format;
use arrow_schema::Schema;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::source_error::SourceError;
use raylet_storage::{self as storage, StorageOptions};

/// How `read_csv` reads its files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CsvOptions {
    /// The columns and their types; inferred from the first file when not given.
    pub schema: Option<Schema>,
    pub delimiter: u8,
    /// Whether each file starts with a line of column names (default true).
    pub has_header: bool,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            schema: None,
            delimiter: b',',
            has_header: true,
        }
    }
}

impl CsvOptions {
    pub fn schema(mut self, schema: Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    pub fn delimiter(mut self, delimiter: u8) -> Self {
        self.delimiter = delimiter;
        self
    }

    pub fn has_header(mut self, has_header: bool) -> Self {
        self.has_header = has_header;
        self
    }

    fn format(&self) -> Format {
        Format::default()
            .with_header(self.has_header)
            .with_delimiter(self.delimiter)
    }

    /// The options with a schema: the one given, or one inferred from the
    /// first rows of the file at `location`.
    pub(crate) fn with_schema_of(&self, location: &str, storage: &StorageOptions) -> Result<CsvOptions, DataError> {
        if self.schema.is_some() {
            return Ok(self.clone());
        }
        let (store, name) = storage::open_file(location, storage)?;
        let head = store.read_head(&name, INFER_BYTES)?;
        let whole_lines = match head.len() < INFER_BYTES {
            true => head.len(),
            false => head
                .iter()
                .rposition(|byte| *byte == b'\n')
                .map_or(head.len(), |end| end + 1),
        };
        let (schema, _) = self
            .format()
            .infer_schema(Cursor::new(&head[..whole_lines]), Some(INFER_ROWS))
            .map_err(|e| DataError::Format {
                input: location.to_string(),
                message: format!("inferring a CSV schema: {e}"),
            })?;
        Ok(CsvOptions {
            schema: Some(schema),
            ..self.clone()
        })
    }
}

/// How much of the first file schema inference reads.
const INFER_BYTES: usize = 1 << 20;
const INFER_ROWS: usize = 10_000;
/// Rows a record batch of a CSV file holds at most.
const BATCH_ROWS: usize = 64 * 1024;

/// The rows of one CSV file, by the options' schema.
pub(crate) fn read_file(bytes: Bytes, options: &CsvOptions) -> Result<Vec<RecordBatch>, SourceError> {
    let schema = options.schema.clone().ok_or(SourceError::NoCsvSchema)?;
    ReaderBuilder::new(schema.into())
        .with_format(options.format())
        .with_batch_size(BATCH_ROWS)
        .build(Cursor::new(bytes))
        .and_then(|reader| reader.collect::<Result<Vec<_>, _>>())
        .map_err(SourceError::Csv)
}
