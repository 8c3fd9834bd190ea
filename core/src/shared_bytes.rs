//! `SharedBytes`: a byte buffer that a get, or a task's argument, hands out
//! as a view of the bytes where they already are (the node's shared memory
//! for a stored value, the received message for a small one) instead of a
//! copy.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;

use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Bytes to put, pass and return like any value, read without a copy.
///
/// They serialize as a byte string, as `serde_bytes::ByteBuf` does. Where
/// they differ is in reading: getting a stored value that holds them (or
/// receiving them as a task's argument) makes each a view of the node's
/// shared-memory mapping, so 1 GiB of them costs a map, not a copy. A view
/// keeps the whole object mapped, and so pinned in the store (never
/// spilled), until every view cut from it is dropped; copy out the bytes
/// (`to_vec`) to keep a small part of a large object for long. A view's
/// first byte is not aligned to anything.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedBytes(Bytes);

impl SharedBytes {
    /// No bytes.
    pub const fn new() -> Self {
        SharedBytes(Bytes::new())
    }

    /// The bytes, shared with this value rather than copied.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Bytes> for SharedBytes {
    fn from(bytes: Bytes) -> Self {
        SharedBytes(bytes)
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> Self {
        SharedBytes(bytes.into())
    }
}

impl From<&'static [u8]> for SharedBytes {
    fn from(bytes: &'static [u8]) -> Self {
        SharedBytes(Bytes::from_static(bytes))
    }
}

impl From<SharedBytes> for Bytes {
    fn from(shared: SharedBytes) -> Self {
        shared.0
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.0.len())
    }
}

impl Serialize for SharedBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_bytes(SharedBytesVisitor)
    }
}

struct SharedBytesVisitor;

impl<'de> Visitor<'de> for SharedBytesVisitor {
    type Value = SharedBytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_borrowed_bytes<E: de::Error>(self, bytes: &'de [u8]) -> Result<SharedBytes, E> {
        Ok(SharedBytes(view_or_copy(bytes)))
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<SharedBytes, E> {
        Ok(SharedBytes(Bytes::copy_from_slice(bytes)))
    }

    fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<SharedBytes, E> {
        Ok(SharedBytes(bytes.into()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SharedBytes, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(byte) = seq.next_element()? {
            bytes.push(byte);
        }
        Ok(SharedBytes(bytes.into()))
    }
}

thread_local! {
    /// The bytes being decoded on this thread, that `SharedBytes` may view.
    static DECODING: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Runs `decode` over `source`, so that the `SharedBytes` it reads from `source`
/// view its bytes instead of copying them.
pub(crate) fn viewing<R>(source: &Bytes, decode: impl FnOnce(&[u8]) -> R) -> R {
    let outer = DECODING.with(|decoding| decoding.replace(Some(source.clone())));
    let decoded = decode(source);
    DECODING.with(|decoding| decoding.replace(outer));
    decoded
}

/// A view of `bytes` when they lie within what this thread is decoding,
/// else a copy.
fn view_or_copy(bytes: &[u8]) -> Bytes {
    DECODING.with(|decoding| match decoding.borrow().as_ref() {
        Some(source) if contains(source, bytes) => source.slice_ref(bytes),
        _ => Bytes::copy_from_slice(bytes),
    })
}

fn contains(source: &[u8], part: &[u8]) -> bool {
    let range = source.as_ptr_range();
    let part = part.as_ptr_range();
    range.start <= part.start && part.end <= range.end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Sample {
        name: String,
        pieces: Vec<SharedBytes>,
    }

    fn encoded() -> Bytes {
        let sample = Sample {
            name: "sample".into(),
            pieces: vec![SharedBytes::from(vec![7u8; 4096]), SharedBytes::from(&b"tail"[..])],
        };
        raylet_common::codec::encode(&sample).unwrap().into()
    }

    #[test]
    fn bytes_decoded_while_viewing_point_into_the_source() {
        let source = encoded();
        let sample: Sample = viewing(&source, raylet_common::codec::decode).unwrap();
        assert_eq!(sample.name, "sample");
        assert_eq!(&*sample.pieces[0], &[7u8; 4096][..]);
        assert_eq!(&*sample.pieces[1], b"tail");
        for piece in &sample.pieces {
            assert!(contains(&source, piece), "the piece is a view of the source");
        }
    }

    #[test]
    fn bytes_decoded_elsewhere_are_copies_that_outlive_their_source() {
        let source = encoded().to_vec();
        let sample: Sample = raylet_common::codec::decode(&source).unwrap();
        assert!(!contains(&source, &sample.pieces[0]));
        drop(source);
        assert_eq!(&*sample.pieces[1], b"tail");
    }

    #[test]
    fn a_view_ends_with_its_decoding_and_nests() {
        let (outer, inner) = (encoded(), encoded());
        let from_outer: Sample = viewing(&outer, |bytes| {
            let _: Sample = viewing(&inner, raylet_common::codec::decode).unwrap();
            raylet_common::codec::decode(bytes)
        })
        .unwrap();
        assert!(contains(&outer, &from_outer.pieces[0]));
        assert!(DECODING.with(|decoding| decoding.borrow().is_none()));
    }

    #[test]
    fn shared_bytes_read_as_serde_bytes_wrote_them_and_from_json() {
        let written = raylet_common::codec::encode(&serde_bytes::ByteBuf::from(vec![1, 2, 3])).unwrap();
        let read: SharedBytes = raylet_common::codec::decode(&written).unwrap();
        assert_eq!(&*read, &[1, 2, 3]);
        let from_json: SharedBytes = serde_json::from_str("[4, 5]").unwrap();
        assert_eq!(&*from_json, &[4, 5]);
    }
}
