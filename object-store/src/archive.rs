//! rkyv archives written straight into an object's shared memory, and read
//! back in place after bytecheck has validated them.

use rkyv::api::high::{HighSerializer, HighValidator};
use rkyv::rancor::{self, Source};
use rkyv::ser::allocator::ArenaHandle;
use rkyv::ser::{Positional, Writer};
use rkyv::{Portable, bytecheck::CheckBytes};

use crate::error::{Result, StoreError};

/// Types that can be archived into an object: anything that derives
/// `rkyv::Archive` and `rkyv::Serialize`.
pub trait Archivable:
    for<'a, 'b> rkyv::Serialize<HighSerializer<SliceWriter<'b>, ArenaHandle<'a>, rancor::Error>>
{
}

impl<T> Archivable for T where
    T: for<'a, 'b> rkyv::Serialize<HighSerializer<SliceWriter<'b>, ArenaHandle<'a>, rancor::Error>>
{
}

/// Archived types that can be validated before they are read.
pub trait Checkable: Portable + for<'a> CheckBytes<HighValidator<'a, rancor::Error>> {}

impl<T> Checkable for T where T: Portable + for<'a> CheckBytes<HighValidator<'a, rancor::Error>> {}

/// Writes an archive into a slice, or only measures it when it has none.
pub struct SliceWriter<'a> {
    out: Option<&'a mut [u8]>,
    pos: usize,
}

impl Positional for SliceWriter<'_> {
    fn pos(&self) -> usize {
        self.pos
    }
}

impl<E: Source> Writer<E> for SliceWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::result::Result<(), E> {
        let end = self.pos + bytes.len();
        if let Some(out) = self.out.as_deref_mut() {
            let Some(target) = out.get_mut(self.pos..end) else {
                return Err(E::new(Overflow {
                    needed: end,
                    have: out.len(),
                }));
            };
            target.copy_from_slice(bytes);
        }
        self.pos = end;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the archive needs {needed} bytes, the object has {have}")]
struct Overflow {
    needed: usize,
    have: usize,
}

/// How many bytes `value`'s archive takes; nothing is copied.
pub fn archived_len<T: Archivable>(value: &T) -> Result<usize> {
    let writer = SliceWriter { out: None, pos: 0 };
    let writer = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, writer).map_err(archive_error)?;
    Ok(writer.pos)
}

/// Archives `value` into `out`, which must be 16-byte aligned and at least
/// [`archived_len`] long. Returns the archive's length.
pub fn archive_into<T: Archivable>(value: &T, out: &mut [u8]) -> Result<usize> {
    if !(out.as_ptr() as usize).is_multiple_of(16) {
        return Err(StoreError::Invalid("an archive must start 16-byte aligned".into()));
    }
    let writer = SliceWriter { out: Some(out), pos: 0 };
    let writer = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, writer).map_err(archive_error)?;
    Ok(writer.pos)
}

/// Validates `bytes` as an archived `A` and returns a view of it.
pub fn access<A: Checkable>(bytes: &[u8]) -> Result<&A> {
    rkyv::access::<A, rancor::Error>(bytes).map_err(|e| StoreError::Invalid(format!("the archive is invalid: {e}")))
}

fn archive_error(error: rancor::Error) -> StoreError {
    StoreError::Invalid(format!("cannot archive the value: {error}"))
}

#[cfg(test)]
mod tests {
    use rkyv::util::AlignedVec;

    use super::*;

    #[derive(rkyv::Archive, rkyv::Serialize, Debug, PartialEq)]
    struct Sample {
        name: String,
        values: Vec<u32>,
    }

    #[test]
    fn an_archive_is_measured_then_written_in_place_and_read_back() {
        let sample = Sample {
            name: "weights".into(),
            values: (0..1000).collect(),
        };
        let len = archived_len(&sample).unwrap();
        let mut buffer = AlignedVec::<16>::with_capacity(len);
        buffer.resize(len, 0);
        assert_eq!(archive_into(&sample, &mut buffer).unwrap(), len);
        let archived = access::<ArchivedSample>(&buffer).unwrap();
        assert_eq!(archived.name, "weights");
        assert_eq!(archived.values.len(), 1000);
        assert_eq!(archived.values[999], 999);
    }

    #[test]
    fn garbage_is_rejected_not_read() {
        let mut buffer = AlignedVec::<16>::new();
        buffer.extend_from_slice(&[0xff; 64]);
        assert!(access::<ArchivedSample>(&buffer).is_err());
    }

    #[test]
    fn a_short_buffer_is_an_error_not_a_panic() {
        let sample = Sample {
            name: "x".into(),
            values: vec![1, 2, 3],
        };
        let mut buffer = AlignedVec::<16>::new();
        buffer.resize(8, 0);
        assert!(archive_into(&sample, &mut buffer).is_err());
    }
}
