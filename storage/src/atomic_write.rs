//! Writing a file so that it holds either nothing or all of its bytes, as
//! the sinks' outputs and the manifest need.

use std::io::Write;
use std::path::Path;

use crate::StorageError;

/// Writes `bytes` to `path` through a temporary file that is synced and
/// renamed over it, so that `path` holds either nothing or all of it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let name = path.file_name().expect("a file path").to_string_lossy();
    let temporary = path.with_file_name(format!(".{name}.tmp"));
    let context = || format!("writing {}", path.display());
    let mut file = std::fs::File::create(&temporary).map_err(|e| StorageError::io(context(), e))?;
    file.write_all(bytes).map_err(|e| StorageError::io(context(), e))?;
    file.sync_all().map_err(|e| StorageError::io(context(), e))?;
    std::fs::rename(&temporary, path).map_err(|e| StorageError::io(context(), e))
}
