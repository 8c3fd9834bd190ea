//! Content-addressed blobs, the binaries and files that jobs ship: their
//! sha256 names, the chunks they travel in (sent and received), and a writer
//! that checks a blob as its chunks arrive.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::Xxh3;

use tokio::io::AsyncReadExt;
use tokio_stream::{Stream, StreamExt};

use crate::v1::{BlobChunk, BlobRef};
use crate::{Error, Result};

/// Bytes per chunk of an upload or a fetch.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Whether `name` is a sha256 as blobs are named: 64 lowercase hex digits.
pub fn is_sha256(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks that `blob` names a blob by a well-formed sha256.
pub fn check_ref(blob: &BlobRef) -> Result<()> {
    match is_sha256(&blob.sha256) {
        true => Ok(()),
        false => Err(Error::InvalidArgument(format!(
            "'{}' is not a sha256 (64 lowercase hex digits)",
            blob.sha256
        ))),
    }
}

/// The sha256 and size of the file at `path`.
pub fn blob_of_file(path: &Path) -> Result<BlobRef> {
    let mut hasher = Sha256::new();
    let size = raylet_common::binary_hash::for_each_chunk(path, |chunk| hasher.update(chunk))?;
    Ok(BlobRef {
        sha256: hex(&hasher.finalize()),
        size,
    })
}

/// Sends `file` as the chunks of `blob`, the first naming it, each wrapped
/// by `wrap`; stops early when the receiver is gone.
pub async fn send_chunks<T>(
    mut file: tokio::fs::File,
    blob: BlobRef,
    chunks: &tokio::sync::mpsc::Sender<T>,
    wrap: impl Fn(BlobChunk) -> T,
) -> std::io::Result<()> {
    let mut first = Some(blob);
    loop {
        let mut data = vec![0u8; CHUNK_BYTES];
        let read = file.read(&mut data).await?;
        if read == 0 && first.is_none() {
            return Ok(());
        }
        data.truncate(read);
        let chunk = BlobChunk {
            blob: first.take(),
            data: data.into(),
        };
        if chunks.send(wrap(chunk)).await.is_err() || read == 0 {
            return Ok(());
        }
    }
}

/// Receives a blob as [`send_chunks`] sends it: the first chunk names the
/// blob, and `start` opens a writer for it or declines (`None`, when the
/// blob is there already); then every chunk's data is written in order, and
/// a blob named again in a later chunk is ignored. Returns the blob the
/// first chunk named and, unless `start` declined, its writer for the
/// caller to [`BlobWriter::finish`], which checks the whole blob.
pub async fn receive_chunks<S, E>(
    mut chunks: S,
    start: impl FnOnce(&BlobRef) -> Result<Option<BlobWriter>>,
) -> Result<(BlobRef, Option<BlobWriter>)>
where
    S: Stream<Item = std::result::Result<BlobChunk, E>> + Unpin,
    Error: From<E>,
{
    let first = chunks
        .next()
        .await
        .transpose()?
        .ok_or_else(|| Error::InvalidArgument("an upload must send at least one chunk".into()))?;
    let blob = first
        .blob
        .ok_or_else(|| Error::InvalidArgument("an upload's first chunk must name its blob".into()))?;
    let Some(mut writer) = start(&blob)? else {
        return Ok((blob, None));
    };
    writer.write(&first.data)?;
    while let Some(chunk) = chunks.next().await.transpose()? {
        writer.write(&chunk.data)?;
    }
    Ok((blob, Some(writer)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a blob's chunks to a temporary file next to its final place,
/// checking size and sha256 as they come; only a blob that matches what it
/// claimed is moved into place. It also computes the XXH3 build hash that
/// worker binaries go by.
pub struct BlobWriter {
    expected: BlobRef,
    limit: u64,
    temp: PartialFile,
    file: std::fs::File,
    sha256: Sha256,
    build: Xxh3,
    written: u64,
}

impl BlobWriter {
    /// Starts a blob that claims to be `expected`, in `dir`; refuses one
    /// larger than `limit` bytes.
    pub fn create(dir: &Path, expected: BlobRef, limit: u64) -> Result<Self> {
        check_ref(&expected)?;
        if expected.size > limit {
            return Err(Error::ResourceExhausted(format!(
                "the blob {} has {} bytes, more than the limit of {limit}",
                expected.sha256, expected.size
            )));
        }
        let temp = PartialFile::new(dir, &expected.sha256);
        let file = std::fs::File::create(temp.path())
            .map_err(|e| Error::Internal(format!("creating {}: {e}", temp.path().display())))?;
        Ok(BlobWriter {
            expected,
            limit,
            temp,
            file,
            sha256: Sha256::new(),
            build: Xxh3::new(),
            written: 0,
        })
    }

    /// Appends a chunk; fails once the blob passes the size it claimed.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.written += data.len() as u64;
        if self.written > self.expected.size.min(self.limit) {
            return Err(Error::InvalidArgument(format!(
                "the blob {} sent more than the {} bytes it claimed",
                self.expected.sha256, self.expected.size
            )));
        }
        self.sha256.update(data);
        self.build.update(data);
        self.file
            .write_all(data)
            .map_err(|e| Error::Internal(format!("writing {}: {e}", self.temp.path().display())))
    }

    /// Checks the whole blob and moves it to `dir/<sha256>`; returns its
    /// build hash.
    pub fn finish(mut self, mode: u32) -> Result<String> {
        let sha256 = hex(&self.sha256.finalize_reset());
        if self.written != self.expected.size || sha256 != self.expected.sha256 {
            return Err(Error::InvalidArgument(format!(
                "the upload does not match its name: it claimed sha256 {} and {} bytes, \
                 and {} bytes with sha256 {sha256} arrived",
                self.expected.sha256, self.expected.size, self.written
            )));
        }
        self.file
            .sync_all()
            .map_err(|e| Error::Internal(format!("syncing {}: {e}", self.temp.path().display())))?;
        set_mode(self.temp.path(), mode)?;
        let target = self.temp.path().with_file_name(&sha256);
        self.temp.persist(&target)?;
        Ok(format!("{:032x}", self.build.digest128()))
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::Internal(format!("setting the mode of {}: {e}", path.display())))
}

/// A blob's file while it arrives, named apart from finished blobs and
/// removed on drop unless it was moved into place.
struct PartialFile(Option<PathBuf>);

impl PartialFile {
    fn new(dir: &Path, name: &str) -> Self {
        let unique: u64 = rand::random();
        PartialFile(Some(dir.join(format!(".{name}.{unique:016x}.partial"))))
    }

    fn path(&self) -> &Path {
        self.0.as_deref().expect("not yet moved into place")
    }

    fn persist(&mut self, target: &Path) -> Result<()> {
        let path = self.0.take().expect("moved into place once");
        std::fs::rename(&path, target).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            Error::Internal(format!("moving {} to {}: {e}", path.display(), target.display()))
        })
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("raylet-blob-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_blob_that_matches_its_name_lands_under_it_and_others_leave_nothing() {
        let dir = dir();
        let source = dir.join("source");
        std::fs::write(&source, b"hello blob").unwrap();
        let blob = blob_of_file(&source).unwrap();
        assert!(is_sha256(&blob.sha256));
        assert_eq!(blob.size, 10);

        let mut writer = BlobWriter::create(&dir, blob.clone(), 1 << 20).unwrap();
        writer.write(b"hello ").unwrap();
        writer.write(b"blob").unwrap();
        let build = writer.finish(0o644).unwrap();
        assert_eq!(std::fs::read(dir.join(&blob.sha256)).unwrap(), b"hello blob");
        assert_eq!(build, raylet_common::binary_hash::hash_file(&source).unwrap());

        let mut corrupt = BlobWriter::create(&dir, blob.clone(), 1 << 20).unwrap();
        corrupt.write(b"hello BLOB").unwrap();
        let error = corrupt.finish(0o644).unwrap_err();
        assert!(error.to_string().contains("does not match"), "{error}");
        let mut long = BlobWriter::create(&dir, blob.clone(), 1 << 20).unwrap();
        assert!(long.write(b"hello blob and more").is_err());
        drop(long);
        let too_big = BlobWriter::create(&dir, blob.clone(), 5).err().unwrap();
        assert!(matches!(too_big, Error::ResourceExhausted(_)), "{too_big}");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "only the source and the good blob: {names:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn chunk(blob: Option<&BlobRef>, data: &[u8]) -> Result<BlobChunk> {
        Ok(BlobChunk {
            blob: blob.cloned(),
            data: data.to_vec().into(),
        })
    }

    #[tokio::test]
    async fn received_chunks_make_the_blob_and_a_stream_without_a_named_first_chunk_is_refused() {
        let dir = dir();
        let source = dir.join("source");
        std::fs::write(&source, b"hello blob").unwrap();
        let blob = blob_of_file(&source).unwrap();
        let start = |blob: &BlobRef| BlobWriter::create(&dir, blob.clone(), 1 << 20).map(Some);

        let chunks = [chunk(Some(&blob), b"hel"), chunk(None, b""), chunk(None, b"lo blob")];
        let stream = tokio_stream::iter(chunks);
        let (named, writer) = receive_chunks(stream, start).await.unwrap();
        assert_eq!(named, blob);
        writer.unwrap().finish(0o644).unwrap();
        assert_eq!(std::fs::read(dir.join(&blob.sha256)).unwrap(), b"hello blob");

        let (_, declined) = receive_chunks(tokio_stream::iter([chunk(Some(&blob), b"x")]), |_| Ok(None))
            .await
            .unwrap();
        assert!(declined.is_none());
        for chunks in [vec![], vec![chunk(None, b"hello blob")]] {
            let error = receive_chunks(tokio_stream::iter(chunks), start).await.err().unwrap();
            assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
        }
        let broken = [chunk(Some(&blob), b"hello"), Err(Error::Unavailable("gone".into()))];
        let error = receive_chunks(tokio_stream::iter(broken), start).await.err().unwrap();
        assert_eq!(error, Error::Unavailable("gone".into()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn names_that_are_not_a_sha256_are_refused() {
        assert!(!is_sha256("../etc/passwd"));
        assert!(!is_sha256(&"A".repeat(64)));
        let bad = BlobRef {
            sha256: "abc".into(),
            size: 1,
        };
        assert!(check_ref(&bad).is_err());
    }
}
