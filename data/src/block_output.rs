//! A processed block as it leaves its task: its rows (typed rows encoded
//! one by one, or an Arrow IPC stream), or the files a sink wrote them to,
//! with the rows left out.

use arrow::array::RecordBatch;
use raylet::SharedBytes;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::block_rows::RowData;
use crate::columnar;
use crate::encoded_rows::EncodedRows;
use crate::rows_error::RowsError;
use crate::stage::RowError;

/// A block's rows between processes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum RowPayload {
    /// Rows of the plan's output type, each encoded alone.
    Typed(EncodedRows),
    /// Arrow record batches as one IPC stream; read from a stored block,
    /// a view of the node's shared memory.
    Arrow(SharedBytes),
}

impl RowPayload {
    /// The payload of `data`, encoded to cross to another process.
    pub fn of(data: RowData) -> Result<RowPayload, RowsError> {
        match data {
            RowData::Encoded(rows) => Ok(RowPayload::Typed(rows)),
            RowData::Arrow(batches) => {
                columnar::encode_ipc(&batches).map(|ipc| RowPayload::Arrow(SharedBytes::from(ipc)))
            }
        }
    }

    /// The bytes the payload takes.
    pub fn bytes(&self) -> u64 {
        match self {
            RowPayload::Typed(rows) => rows.bytes(),
            RowPayload::Arrow(ipc) => ipc.len() as u64,
        }
    }

    /// The rows again, as a stage works on them.
    pub fn into_data(self) -> Result<RowData, RowsError> {
        match self {
            RowPayload::Typed(rows) => Ok(RowData::Encoded(rows)),
            RowPayload::Arrow(ipc) => columnar::decode_ipc(ipc).map(RowData::Arrow),
        }
    }
}

/// A processed block: its rows (or the files a sink wrote them to) and
/// the rows left out under [`OnError::Skip`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BlockOutput {
    pub rows: RowPayload,
    pub count: u64,
    pub skipped: Vec<RowError>,
    /// The files a sink wrote, relative to its location.
    pub files: Vec<String>,
    /// The bytes the block's rows took in its task after reading and
    /// after each stage.
    pub held: Vec<u64>,
}

impl BlockOutput {
    /// The rows, as the plan's output type.
    pub fn decode_rows<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, DataError> {
        let rows = match &self.rows {
            RowPayload::Typed(rows) => rows.decode(),
            RowPayload::Arrow(ipc) => columnar::decode_ipc(ipc.clone()).and_then(|b| columnar::batches_to_rows(&b)),
        };
        rows.map_err(DataError::from)
    }

    /// The rows as Arrow record batches.
    pub fn into_batches(self) -> Result<Vec<RecordBatch>, DataError> {
        match self.rows {
            RowPayload::Arrow(ipc) => Ok(columnar::decode_ipc(ipc)?),
            RowPayload::Typed(_) => Err(DataError::InvalidInput(
                "a block of typed rows was read as Arrow batches".into(),
            )),
        }
    }
}
