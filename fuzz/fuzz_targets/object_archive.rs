//! Validates arbitrary object bytes as rkyv archives, the way a reader's
//! `get_archived` does (copied to a 64-byte aligned buffer as
//! `raylet::ArchivedRef` copies an inline value, then checked by
//! `raylet_object_store::archive::access`): as a `Tensor`, the archived type
//! raylet itself reads, and as values users archive. An archive that
//! validates must read without panicking, deserialize, and archive again to
//! the same bytes; an accepted tensor must hold exactly its shape's
//! elements. Inputs starting with 0xff instead build a tensor from the
//! bytes (shape, dtype, data) with `Tensor::from_bytes`, which must refuse
//! or make a tensor whose archive reads back equal.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use raylet_object_store::archive::{Archivable, Checkable, access, archive_into, archived_len};
use raylet_object_store::{ArchivedTensor, DType, Tensor};
use rkyv::rancor;
use rkyv::util::AlignedVec;

type UserRecord = (String, Vec<u32>, Option<Vec<f64>>);

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let archive = aligned(bytes);
    match pick {
        0xff => build_tensor(bytes),
        pick => match pick % 7 {
            0 => {
                if let Ok(archived) = access::<ArchivedTensor>(&archive) {
                    check_tensor(archived);
                }
            }
            1 => stable::<Vec<f32>>(&archive),
            2 => stable::<String>(&archive),
            3 => stable::<Vec<String>>(&archive),
            4 => stable::<UserRecord>(&archive),
            // Not hash maps: rkyv 0.8.18 validates an `ArchivedHashMap` of a
            // capacity near `usize::MAX` with an unchecked
            // `cap.next_multiple_of(16)`, which panics where overflow checks
            // are on (debug and fuzz builds; release builds wrap, then refuse
            // the archive). See fuzz/README.md.
            5 => stable::<Vec<(u32, Option<String>)>>(&archive),
            _ => stable::<BTreeMap<u64, String>>(&archive),
        },
    }
});

/// The bytes at the start of a 64-byte aligned buffer, as an object's
/// mapping or an inline value's copy has them.
fn aligned(bytes: &[u8]) -> AlignedVec<64> {
    let mut buffer = AlignedVec::<64>::with_capacity(bytes.len());
    buffer.extend_from_slice(bytes);
    buffer
}

/// `value`'s archive, written as `put_archived` writes it.
fn archive_of<T: Archivable>(value: &T) -> AlignedVec<64> {
    let len = archived_len(value).expect("a value is measured");
    let mut buffer = AlignedVec::<64>::with_capacity(len);
    buffer.resize(len, 0);
    assert_eq!(archive_into(value, &mut buffer).expect("a value is archived"), len);
    buffer
}

/// When `archive` validates as a `T`: the value it holds, archived,
/// validated and deserialized again, archives to the same bytes.
fn stable<T>(archive: &[u8])
where
    T: rkyv::Archive + Archivable,
    T::Archived: Checkable + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    let Ok(archived) = access::<T::Archived>(archive) else {
        return;
    };
    let value: T = rkyv::deserialize::<T, rancor::Error>(archived).expect("a valid archive deserializes");
    let written = archive_of(&value);
    let reread = access::<T::Archived>(&written).expect("an archive written here validates");
    let again: T = rkyv::deserialize::<T, rancor::Error>(reread).expect("it deserializes");
    assert_eq!(&archive_of(&again)[..], &written[..], "archiving is not stable");
}

fn check_tensor(archived: &ArchivedTensor) {
    let shape = archived.shape();
    let dtype = archived.dtype();
    let bytes = archived.as_bytes();
    let elements = shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
    let needed = elements.and_then(|n| n.checked_mul(dtype.size()));
    assert_eq!(
        needed,
        Some(bytes.len()),
        "an archived {dtype:?} tensor of shape {shape:?} holds {} bytes",
        bytes.len()
    );
    if let Some(floats) = archived.as_f32() {
        assert_eq!(floats.len() * 4, bytes.len());
    }
    let tensor: Tensor = rkyv::deserialize::<Tensor, rancor::Error>(archived).expect("a valid tensor deserializes");
    assert_eq!(tensor.shape(), shape);
    assert_eq!(tensor.as_bytes(), bytes);
}

/// A tensor from up to 4 dimensions (2 bytes each), a dtype and the rest as
/// data; its archive reads back as the same tensor.
fn build_tensor(bytes: &[u8]) {
    let Some((&header, rest)) = bytes.split_first() else {
        return;
    };
    let dtype = [DType::U8, DType::I32, DType::I64, DType::F32, DType::F64][usize::from(header % 5)];
    let dimensions = usize::from(header / 5 % 5);
    let Some((shape, data)) = rest.split_at_checked(dimensions * 2) else {
        return;
    };
    let mut shape: Vec<usize> = shape
        .chunks_exact(2)
        .map(|pair| usize::from(u16::from_le_bytes([pair[0], pair[1]])))
        .collect();
    if header >= 250 {
        shape.push(usize::MAX);
    }
    let Ok(tensor) = Tensor::from_bytes(dtype, &shape, data.to_vec()) else {
        return;
    };
    let archive = archive_of(&tensor);
    let archived = access::<ArchivedTensor>(&archive).expect("a tensor's own archive validates");
    check_tensor(archived);
    assert_eq!(archived.shape(), shape);
    assert_eq!(archived.dtype(), dtype);
    assert_eq!(archived.as_bytes(), data);
}
