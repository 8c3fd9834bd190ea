//! `read_parquet`: the planner reads each file's footer and cuts its row
//! groups into blocks (consecutive groups up to the block size), leaving
//! out groups whose statistics rule out the filter; a block's task reads
//! its row groups, only the projected columns (and the filter's), and keeps
//! the matching rows. Local files are read in place; objects in storage by
//! ranges through `object_store`.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::RecordBatch;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{ArrowReaderBuilder, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::predicate::Predicate;
use crate::rows_error::RowsError;
use crate::source_error::SourceError;
use raylet_storage::{self as storage, StorageOptions};

/// What `read_parquet` reads of each file: some columns only (all by
/// default), and the rows that match a filter (all by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ParquetOptions {
    pub columns: Option<Vec<String>>,
    pub filter: Option<Predicate>,
}

impl ParquetOptions {
    /// Reads only these columns.
    pub fn columns(mut self, columns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Keeps only the rows that match `filter`; row groups whose
    /// statistics show that none can are not read at all.
    pub fn filter(mut self, filter: Predicate) -> Self {
        self.filter = Some(filter);
        self
    }
}

/// Rows a block reads: row groups of one file (`None`: the whole file,
/// when its footer could not be read and the task is to report why).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RowGroups {
    pub location: String,
    pub file_size: u64,
    pub groups: Option<Vec<usize>>,
    /// Rows in the groups, by their footer (0 when it was not read).
    pub rows: u64,
}

impl RowGroups {
    /// The file and its groups, for messages.
    pub fn describe(&self) -> String {
        match self.groups.as_deref() {
            Some([one]) => format!("{} (row group {one})", self.location),
            Some([first, .., last]) => format!("{} (row groups {first}..={last})", self.location),
            _ => self.location.clone(),
        }
    }
}

/// One planned block of a Parquet source: its row groups and bytes.
#[derive(Debug)]
pub(crate) struct PlannedGroups {
    pub groups: RowGroups,
    pub bytes: u64,
}

/// The blocks of one file: consecutive row groups that may match, up to
/// `block_bytes` (uncompressed) each.
pub(crate) fn plan_file(
    location: &str,
    file_size: u64,
    options: &ParquetOptions,
    storage: &StorageOptions,
    block_bytes: u64,
) -> Result<Vec<PlannedGroups>, DataError> {
    let metadata = match read_metadata(location, file_size, storage) {
        Ok(metadata) => metadata,
        Err(_) => {
            return Ok(vec![PlannedGroups {
                groups: RowGroups {
                    location: location.to_string(),
                    file_size,
                    groups: None,
                    rows: 0,
                },
                bytes: file_size,
            }]);
        }
    };
    let format_error = |message: String| DataError::Format {
        input: location.to_string(),
        message,
    };
    let schema = parquet::arrow::parquet_to_arrow_schema(
        metadata.file_metadata().schema_descr(),
        metadata.file_metadata().key_value_metadata(),
    )
    .map_err(|e| format_error(e.to_string()))?;
    let wanted = options
        .columns
        .iter()
        .flatten()
        .chain(options.filter.as_ref().map(|f| &f.column));
    for column in wanted {
        if schema.index_of(column).is_err() {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(format_error(format!(
                "no column {column} (its columns: {})",
                names.join(", ")
            )));
        }
    }
    let groups = metadata.row_groups();
    let keep = match &options.filter {
        None => vec![true; groups.len()],
        Some(filter) => {
            let converter =
                StatisticsConverter::try_new(&filter.column, &schema, metadata.file_metadata().schema_descr())
                    .map_err(|e| format_error(e.to_string()))?;
            let mins = converter
                .row_group_mins(groups.iter())
                .map_err(|e| format_error(e.to_string()))?;
            let maxes = converter
                .row_group_maxes(groups.iter())
                .map_err(|e| format_error(e.to_string()))?;
            filter
                .may_match(&mins, &maxes)
                .map_err(|e| format_error(e.to_string()))?
        }
    };
    let mut blocks: Vec<PlannedGroups> = Vec::new();
    let mut current: Option<PlannedGroups> = None;
    for (index, group) in groups.iter().enumerate() {
        if !keep[index] {
            blocks.extend(current.take());
            continue;
        }
        let bytes = group.total_byte_size().max(0) as u64;
        if let Some(block) = current.take_if(|block| block.bytes + bytes > block_bytes) {
            blocks.push(block);
        }
        let block = current.get_or_insert_with(|| PlannedGroups {
            groups: RowGroups {
                location: location.to_string(),
                file_size,
                groups: Some(Vec::new()),
                rows: 0,
            },
            bytes: 0,
        });
        block.groups.groups.as_mut().expect("planned groups").push(index);
        block.groups.rows += group.num_rows().max(0) as u64;
        block.bytes += bytes;
    }
    blocks.extend(current);
    Ok(blocks)
}

fn read_metadata(
    location: &str,
    file_size: u64,
    options: &StorageOptions,
) -> Result<Arc<ParquetMetaData>, SourceError> {
    let (storage, name) = storage::open_file(location, options)?;
    match storage.object(&name) {
        None => {
            let file = std::fs::File::open(location).map_err(SourceError::Open)?;
            Ok(ParquetMetaDataReader::new().parse_and_finish(&file).map(Arc::new)?)
        }
        Some((store, path)) => storage::run(async move {
            let mut reader = ObjectReader { store, path, file_size };
            Ok(reader.get_metadata(None).await?)
        }),
    }
}

/// Reads a block's row groups: the projected columns of the rows that match.
pub(crate) fn read_groups(
    groups: &RowGroups,
    options: &ParquetOptions,
    storage: &StorageOptions,
) -> Result<Vec<RecordBatch>, SourceError> {
    let (store, name) = storage::open_file(&groups.location, storage)?;
    let batches = match store.object(&name) {
        None => {
            let file = std::fs::File::open(&groups.location).map_err(SourceError::Open)?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(SourceError::NotParquet)?;
            configure(builder, groups, options)?
                .build()
                .and_then(|reader| reader.collect::<Result<Vec<_>, _>>().map_err(Into::into))?
        }
        Some((store, path)) => {
            let (groups, options) = (groups.clone(), options.clone());
            storage::run(async move {
                let reader = ObjectReader {
                    store,
                    path,
                    file_size: groups.file_size,
                };
                let builder = ParquetRecordBatchStreamBuilder::new(reader)
                    .await
                    .map_err(SourceError::NotParquet)?;
                let stream = configure(builder, &groups, &options)?.build()?;
                Ok::<_, SourceError>(stream.try_collect::<Vec<_>>().await?)
            })?
        }
    };
    batches.iter().map(|batch| select(batch, options)).collect()
}

/// Rows a reading task asks for at a time.
const BATCH_ROWS: usize = 64 * 1024;

/// The reader of a block's row groups and of the columns it needs.
fn configure<T>(
    builder: ArrowReaderBuilder<T>,
    groups: &RowGroups,
    options: &ParquetOptions,
) -> Result<ArrowReaderBuilder<T>, SourceError> {
    // Buffers are sized for a whole batch: no larger than the block's rows.
    let rows = match groups.rows {
        0 => BATCH_ROWS,
        rows => (rows as usize).min(BATCH_ROWS),
    };
    let mut builder = builder.with_batch_size(rows);
    if let Some(groups) = &groups.groups {
        builder = builder.with_row_groups(groups.clone());
    }
    if let Some(columns) = &options.columns {
        let schema = builder.schema().clone();
        let needed = columns.iter().chain(options.filter.as_ref().map(|f| &f.column));
        let roots = needed
            .map(|name| schema.index_of(name).map_err(|_| SourceError::NoColumn(name.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        builder = builder.with_projection(mask);
    }
    Ok(builder)
}

/// The rows of `batch` that match the filter, with the projected columns.
fn select(batch: &RecordBatch, options: &ParquetOptions) -> Result<RecordBatch, SourceError> {
    let filtered = match &options.filter {
        Some(filter) => filter.filter(batch)?,
        None => batch.clone(),
    };
    match &options.columns {
        None => Ok(filtered),
        Some(columns) => {
            let schema = filtered.schema();
            let indices = columns
                .iter()
                .map(|name| schema.index_of(name).map_err(|_| SourceError::NoColumn(name.clone())))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(filtered
                .project(&indices)
                .map_err(RowsError::arrow("projecting the columns"))?)
        }
    }
}

/// A Parquet file in object storage, read by byte ranges.
struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    file_size: u64,
}

/// Bytes fetched with the footer, so that most footers take one request.
const FOOTER_HINT: usize = 64 << 10;

fn external(error: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(error))
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.store.get_range(&self.path, range).await.map_err(external) }.boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let file_size = self.file_size;
            ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(FOOTER_HINT))
                .load_and_finish(self, file_size)
                .await
                .map(Arc::new)
        }
        .boxed()
    }
}
