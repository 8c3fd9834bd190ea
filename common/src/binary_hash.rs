//! The content hash that names a build of a binary: tasks carry it, and a
//! worker runs only tasks from a caller with the same build.

use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::{Error, Result};

/// Hashes the file at `path` with XXH3-128, as 32 hex digits.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut hasher = Xxh3::new();
    for_each_chunk(path, |chunk| hasher.update(chunk))?;
    Ok(format!("{:032x}", hasher.digest128()))
}

/// Reads the file at `path` in 1 MiB chunks, handing each to `use_chunk`;
/// returns the file's size.
pub fn for_each_chunk(path: &Path, mut use_chunk: impl FnMut(&[u8])) -> Result<u64> {
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::NotFound(format!("{} cannot be opened: {e}", path.display())))?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut size = 0;
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|e| Error::Internal(format!("reading {}: {e}", path.display())))?;
        if read == 0 {
            return Ok(size);
        }
        use_chunk(&buffer[..read]);
        size += read as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_files_hash_equal_and_different_files_differ() {
        let dir = std::env::temp_dir().join(format!("raylet-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
        std::fs::write(&a, b"same").unwrap();
        std::fs::write(&b, b"same").unwrap();
        std::fs::write(&c, b"other").unwrap();
        assert_eq!(hash_file(&a).unwrap(), hash_file(&b).unwrap());
        assert_ne!(hash_file(&a).unwrap(), hash_file(&c).unwrap());
        assert_eq!(hash_file(&a).unwrap().len(), 32);
        assert!(hash_file(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
