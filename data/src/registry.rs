//! The functions transforms run, found by name in every worker (the same
//! binary started again): each `register_*!` macro records a function with
//! one of the adapters here, which decodes a block's rows, applies the
//! function and encodes what it returns, keeping track of which input each
//! row came from.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::OnceLock;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::stage::{RowFailure, StageKind, StageRun};

/// Rows a stage works on: encoded, with the input each came from.
pub struct EncodedRows {
    pub rows: Vec<u8>,
    /// Per row, the index of its input (file or item) within the block.
    pub origins: Vec<u32>,
}

/// Applies a registered function to a block's rows.
pub type ApplyFn = fn(&EncodedRows, &mut StageRun) -> Result<EncodedRows, RowFailure>;

/// One registered function. Not a public API.
#[doc(hidden)]
pub struct RegisteredFn {
    pub name: fn() -> &'static str,
    pub kind: StageKind,
    pub apply: ApplyFn,
}

/// Every function registered for transforms in this binary.
#[linkme::distributed_slice]
pub static DATA_FUNCTIONS: [RegisteredFn];

/// The registered function called `name`.
pub(crate) fn find(name: &str) -> Option<&'static RegisteredFn> {
    static BY_NAME: OnceLock<HashMap<&'static str, &'static RegisteredFn>> = OnceLock::new();
    let table = BY_NAME.get_or_init(|| DATA_FUNCTIONS.iter().map(|entry| ((entry.name)(), entry)).collect());
    table.get(name).copied()
}

fn decode<T: DeserializeOwned>(rows: &EncodedRows, run: &StageRun) -> Result<Vec<T>, RowFailure> {
    raylet::proto::codec::decode(&rows.rows).map_err(|e| run.block_failure(format!("decoding its rows: {e}")))
}

fn encode<T: Serialize>(rows: &[T], origins: Vec<u32>, run: &StageRun) -> Result<EncodedRows, RowFailure> {
    let rows = raylet::proto::codec::encode(rows).map_err(|e| run.block_failure(format!("encoding its rows: {e}")))?;
    Ok(EncodedRows { rows, origins })
}

#[doc(hidden)]
pub fn apply_map<I, O, E>(
    rows: &EncodedRows,
    run: &mut StageRun,
    function: impl Fn(I) -> Result<O, E>,
) -> Result<EncodedRows, RowFailure>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
{
    apply_flat_map(rows, run, |row| function(row).map(|value| vec![value]))
}

#[doc(hidden)]
pub fn apply_flat_map<I, O, E>(
    rows: &EncodedRows,
    run: &mut StageRun,
    function: impl Fn(I) -> Result<Vec<O>, E>,
) -> Result<EncodedRows, RowFailure>
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
            Err(e) => run.fail(&[*origin], e.to_string())?,
        }
    }
    encode(&out, origins, run)
}

#[doc(hidden)]
pub fn apply_filter<T>(
    rows: &EncodedRows,
    run: &mut StageRun,
    function: impl Fn(&T) -> bool,
) -> Result<EncodedRows, RowFailure>
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
    rows: &EncodedRows,
    run: &mut StageRun,
    mut function: impl FnMut(Vec<I>) -> Result<Vec<O>, E>,
) -> Result<EncodedRows, RowFailure>
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
            Err(e) => run.fail(batch_origins, e.to_string())?,
        }
    }
    encode(&out, origins, run)
}
