//! The head's job-upload path on arbitrary chunk streams: a blob's bytes
//! sent as `UploadBlob` chunks that may be cut anywhere, skipped, repeated,
//! padded, renamed in a later chunk or broken off, under an honest or a
//! false claim of sha256 and size, received by
//! `raylet_proto::blob::receive_chunks` into a `BlobWriter` in a temporary
//! directory and finished. It never panics; a blob is kept only when the
//! bytes that arrived are exactly the claimed size and hash to the claimed
//! name, and such an upload is always kept; nothing else is left behind.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use raylet_proto::blob::{BlobWriter, is_sha256, receive_chunks};
use raylet_proto::v1::{BlobChunk, BlobRef};
use raylet_proto::{Error, Result};
use sha2::{Digest, Sha256};

/// What the first chunk claims the blob is.
#[derive(Arbitrary, Debug)]
enum Claim {
    Honest,
    /// The true sha256 with another size.
    Size(u64),
    /// Another sha256 (of these bytes) with the true size.
    Hash(Vec<u8>),
    /// Any name at all.
    Name(String, u64),
    /// No blob named.
    Nothing,
}

/// One step of the sender, over the blob's bytes from a cursor.
#[derive(Arbitrary, Debug)]
enum Step {
    /// Sends the next `n` bytes.
    Next(u8),
    /// Skips the next `n` bytes.
    Skip(u8),
    /// Sends again the `n` bytes before the cursor.
    Repeat(u8),
    /// Sends bytes that are not the blob's.
    Extra(Vec<u8>),
    /// Names a blob in a chunk after the first.
    Rename(Claim),
    /// The stream breaks.
    Broken,
}

#[derive(Arbitrary, Debug)]
struct Upload {
    content: Vec<u8>,
    claim: Claim,
    steps: Vec<Step>,
    /// Sends whatever is left after the steps.
    finish: bool,
    /// The largest blob the store takes.
    limit: u16,
    /// The store has the blob already.
    present: bool,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn claimed(claim: &Claim, content: &[u8]) -> Option<BlobRef> {
    let size = content.len() as u64;
    let sha256 = hex(&Sha256::digest(content));
    match claim {
        Claim::Honest => Some(BlobRef { sha256, size }),
        Claim::Size(size) => Some(BlobRef { sha256, size: *size }),
        Claim::Hash(other) => Some(BlobRef {
            sha256: hex(&Sha256::digest(other)),
            size,
        }),
        Claim::Name(name, size) => Some(BlobRef {
            sha256: name.clone(),
            size: *size,
        }),
        Claim::Nothing => None,
    }
}

/// The chunks the sender sends, and whether the stream breaks.
fn chunks(upload: &Upload) -> Vec<Result<BlobChunk>> {
    let content = &upload.content;
    let mut cursor = 0;
    let mut sent = Vec::new();
    for step in &upload.steps {
        let (data, blob) = match step {
            Step::Next(n) => {
                let end = (cursor + usize::from(*n)).min(content.len());
                let data = content[cursor..end].to_vec();
                cursor = end;
                (data, None)
            }
            Step::Skip(n) => {
                cursor = (cursor + usize::from(*n)).min(content.len());
                continue;
            }
            Step::Repeat(n) => (content[cursor.saturating_sub(usize::from(*n))..cursor].to_vec(), None),
            Step::Extra(bytes) => (bytes.clone(), None),
            Step::Rename(claim) => (Vec::new(), claimed(claim, content)),
            Step::Broken => {
                sent.push(Err(Error::Unavailable("the sender went away".into())));
                break;
            }
        };
        sent.push(Ok(BlobChunk {
            blob,
            data: data.into(),
        }));
    }
    if upload.finish && !matches!(sent.last(), Some(Err(_))) {
        sent.push(Ok(BlobChunk {
            blob: None,
            data: content[cursor..].to_vec().into(),
        }));
    }
    if let Some(Ok(first)) = sent.first_mut() {
        first.blob = claimed(&upload.claim, content);
    }
    sent
}

fuzz_target!(|upload: Upload| {
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path();
    let sent = chunks(&upload);
    let limit = u64::from(upload.limit);
    let start = |blob: &BlobRef| match upload.present {
        true => Ok(None),
        false => BlobWriter::create(dir, blob.clone(), limit).map(Some),
    };
    let stream = tokio_stream::iter(sent.clone());
    let kept = runtime().block_on(async {
        let (blob, writer) = receive_chunks(stream, start).await?;
        match writer {
            Some(writer) => writer.finish(0o644).map(|build| Some((blob, build))),
            None => Ok(None),
        }
    });

    let first = sent.first().and_then(|chunk| chunk.as_ref().ok());
    let claim = first.and_then(|chunk| chunk.blob.clone());
    let whole = !sent.iter().any(|chunk| chunk.is_err());
    let arrived: Vec<u8> = sent.iter().flatten().flat_map(|chunk| chunk.data.to_vec()).collect();
    let matches = claim.as_ref().is_some_and(|claim| {
        is_sha256(&claim.sha256)
            && claim.sha256 == hex(&Sha256::digest(&arrived))
            && claim.size == arrived.len() as u64
            && claim.size <= limit
    });

    let names: Vec<String> = std::fs::read_dir(dir)
        .expect("the directory is readable")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .into_string()
                .expect("a UTF-8 name")
        })
        .collect();
    match kept {
        Ok(Some((blob, build))) => {
            assert!(
                matches && whole,
                "kept {blob:?} from {} bytes that are not it",
                arrived.len()
            );
            assert_eq!(names, std::slice::from_ref(&blob.sha256), "only the blob is left");
            let path = dir.join(&blob.sha256);
            assert_eq!(std::fs::read(&path).expect("the kept blob"), arrived);
            assert_eq!(raylet_common::binary_hash::hash_file(&path).expect("it hashes"), build);
        }
        Ok(None) => {
            assert!(upload.present && claim.is_some(), "nothing kept and nothing there");
            assert!(names.is_empty(), "left behind: {names:?}");
        }
        Err(error) => {
            assert!(upload.present || !(matches && whole), "refused a good upload: {error}");
            assert!(names.is_empty(), "left behind: {names:?}");
        }
    }
});
