//! `read_delta` (feature `delta`): the files of a Delta Lake table's
//! current version, found in its transaction log through the `deltalake`
//! crate, read as Parquet. Tables on a local disk (paths or `file://`).

use crate::DataError;
use raylet_storage as storage;

/// The local paths of the Parquet files of the table at `location`.
pub(crate) fn table_files(location: &str) -> Result<Vec<String>, DataError> {
    let table_error = |message: String| DataError::Format {
        input: location.to_string(),
        message: format!("reading the Delta table: {message}"),
    };
    let url = deltalake::ensure_table_uri(location).map_err(|e| table_error(e.to_string()))?;
    let uris: Vec<String> = storage::run(async move {
        let table = deltalake::open_table(url).await.map_err(|e| e.to_string())?;
        let uris = table.get_file_uris().map_err(|e| e.to_string())?;
        Ok::<_, String>(uris.collect())
    })
    .map_err(table_error)?;
    uris.into_iter()
        .map(|uri| match uri.strip_prefix("file://") {
            Some(path) => Ok(path.to_string()),
            None if !storage::is_url(&uri) => Ok(uri),
            None => Err(table_error(format!(
                "{uri} is not a local file (read_delta reads local tables)"
            ))),
        })
        .collect()
}
