//! The content hash that names a build of a binary: tasks carry it, and a
//! worker runs only tasks from a caller with the same build.

use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::{Error, Result};

/// Hashes the file at `path` with XXH3-128, as 32 hex digits.
pub fn hash_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| Error::NotFound(format!("binary {} cannot be opened: {e}", path.display())))?;
    let mut hasher = Xxh3::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|e| Error::Internal(format!("reading {}: {e}", path.display())))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(format!("{:032x}", hasher.digest128()))
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
