//! The functions transforms run, found by name in every worker (the same
//! binary started again): each `register_*!` macro records a function in
//! raylet's registry with one of the adapters here, which decodes a block's rows, applies the
//! function and encodes what it returns, keeping track of which input each
//! row came from. Typed functions read Arrow rows too (a column per field);
//! Arrow functions take and return record batches.

use std::fmt::Display;

use arrow::array::RecordBatch;
use raylet::{EntryKind, RegistryError};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::block_rows::{BlockRows, RowData};
use crate::columnar;
use crate::encoded_rows::EncodedRows;
use crate::rows_error::RowsError;
use crate::stage::{RowFailure, StageKind, StageRun};

/// Applies a registered function to a block's rows.
pub type ApplyFn = fn(&BlockRows, &mut StageRun) -> Result<BlockRows, RowFailure>;

/// One registered function, as raylet's registry holds it. Not a public API.
#[doc(hidden)]
pub struct RegisteredFn {
    pub kind: StageKind,
    pub apply: ApplyFn,
}

/// The registered function called `name`.
pub(crate) fn find(name: &str) -> Result<&'static RegisteredFn, RegistryError> {
    raylet::find_registered(EntryKind::DataFunction, name)
}

fn decode<T: DeserializeOwned>(rows: &BlockRows, run: &StageRun) -> Result<Vec<T>, RowFailure> {
    match &rows.data {
        RowData::Encoded(rows) => rows.decode().map_err(|e| run.block_failure(e)),
        RowData::Arrow(batches) => columnar::batches_to_rows(batches).map_err(|e| run.block_failure(e)),
    }
}

fn encode<T: Serialize>(rows: &[T], origins: Vec<u32>, run: &StageRun) -> Result<BlockRows, RowFailure> {
    let rows = EncodedRows::encode(rows).map_err(|e| run.block_failure(e))?;
    Ok(BlockRows {
        data: RowData::Encoded(rows),
        origins,
    })
}

#[doc(hidden)]
pub fn apply_map<I, O, E>(
    rows: &BlockRows,
    run: &mut StageRun,
    function: impl Fn(I) -> Result<O, E>,
) -> Result<BlockRows, RowFailure>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
{
    apply_flat_map(rows, run, |row| function(row).map(|value| vec![value]))
}

#[doc(hidden)]
pub fn apply_flat_map<I, O, E>(
    rows: &BlockRows,
    run: &mut StageRun,
    function: impl Fn(I) -> Result<Vec<O>, E>,
) -> Result<BlockRows, RowFailure>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
{
    let (mut out, mut origins) = (Vec::new(), Vec::new());
    for (row, origin) in decode::<I>(rows, run)?.into_iter().zip(&rows.origins) {
        match function(row) {
            Ok(values) => {
                origins.extend(std::iter::repeat_n(*origin, values.len()));
                out.extend(values);
            }
            Err(e) => run.fail(&[*origin], e)?,
        }
    }
    encode(&out, origins, run)
}

#[doc(hidden)]
pub fn apply_filter<T>(
    rows: &BlockRows,
    run: &mut StageRun,
    function: impl Fn(&T) -> bool,
) -> Result<BlockRows, RowFailure>
where
    T: DeserializeOwned + Serialize,
{
    let (mut out, mut origins) = (Vec::new(), Vec::new());
    for (row, origin) in decode::<T>(rows, run)?.into_iter().zip(&rows.origins) {
        if function(&row) {
            out.push(row);
            origins.push(*origin);
        }
    }
    encode(&out, origins, run)
}

/// Calls the function on batches of `run.batch_size` rows. A batch's
/// outputs keep their inputs' origins when there is one output per input,
/// else each takes the batch's first input's.
#[doc(hidden)]
pub fn apply_batches<I, O, E>(
    rows: &BlockRows,
    run: &mut StageRun,
    mut function: impl FnMut(Vec<I>) -> Result<Vec<O>, E>,
) -> Result<BlockRows, RowFailure>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
{
    let (mut out, mut origins) = (Vec::new(), Vec::new());
    let mut input = decode::<I>(rows, run)?.into_iter();
    for batch_origins in rows.origins.chunks(run.batch_size.max(1)) {
        let batch: Vec<I> = input.by_ref().take(batch_origins.len()).collect();
        match function(batch) {
            Ok(values) => {
                match values.len() == batch_origins.len() {
                    true => origins.extend_from_slice(batch_origins),
                    false => origins.extend(std::iter::repeat_n(batch_origins[0], values.len())),
                }
                out.extend(values);
            }
            Err(e) => run.fail(batch_origins, e)?,
        }
    }
    encode(&out, origins, run)
}

/// Cuts a block's record batches into batches of given sizes: a slice of
/// one batch where it holds them all (no copy), else the pieces joined.
struct BatchSlicer<'a> {
    batches: &'a [RecordBatch],
    /// The batch the next rows start in, and the row within it.
    at: (usize, usize),
}

impl<'a> BatchSlicer<'a> {
    fn new(batches: &'a [RecordBatch]) -> Self {
        BatchSlicer { batches, at: (0, 0) }
    }

    /// The next `rows` rows, which the batches must hold.
    fn next(&mut self, rows: usize) -> Result<RecordBatch, arrow::error::ArrowError> {
        let mut pieces = Vec::new();
        let mut wanted = rows;
        while wanted > 0 {
            let (batch, row) = self.at;
            let current = &self.batches[batch];
            let take = wanted.min(current.num_rows() - row);
            pieces.push(current.slice(row, take));
            wanted -= take;
            self.at = match row + take == current.num_rows() {
                true => (batch + 1, 0),
                false => (batch, row + take),
            };
        }
        match pieces.len() {
            1 => Ok(pieces.remove(0)),
            _ => arrow::compute::concat_batches(&self.batches[0].schema(), &pieces),
        }
    }
}

/// Calls the function on record batches of up to `run.batch_size` rows
/// (slices of the block's batches, joined only across their edges). Origins
/// follow the rule of [`apply_batches`].
#[doc(hidden)]
pub fn apply_arrow_batches<E: Display>(
    rows: &BlockRows,
    run: &mut StageRun,
    function: impl Fn(RecordBatch) -> Result<RecordBatch, E>,
) -> Result<BlockRows, RowFailure> {
    let RowData::Arrow(batches) = &rows.data else {
        return Err(run.block_failure("an Arrow function was given typed rows"));
    };
    let mut slicer = BatchSlicer::new(batches);
    let (mut out, mut origins) = (Vec::new(), Vec::new());
    for batch_origins in rows.origins.chunks(run.batch_size.max(1)) {
        let input = slicer.next(batch_origins.len()).map_err(|source| {
            run.block_failure(RowsError::Arrow {
                doing: "joining its batches",
                source,
            })
        })?;
        match function(input) {
            Ok(batch) => {
                match batch.num_rows() == batch_origins.len() {
                    true => origins.extend_from_slice(batch_origins),
                    false => origins.extend(std::iter::repeat_n(batch_origins[0], batch.num_rows())),
                }
                out.push(batch);
            }
            Err(e) => run.fail(batch_origins, e)?,
        }
    }
    Ok(BlockRows {
        data: RowData::Arrow(out),
        origins,
    })
}
