//! Decodes arbitrary bytes with the value codec (`raylet_common::codec`,
//! postcard) as one of the kinds of value raylet moves, picked by the first
//! byte: scalars, text, lists, maps, ids, tensors, object references. A
//! value that decodes must encode to bytes that decode to a value encoding
//! to the same bytes, with `encoded_len` and `encode_into` agreeing; a list
//! joined from its elements' encodings must be the list's encoding; a
//! decoded tensor must hold exactly its shape's elements.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use raylet_object_store::{DType, Tensor};
use raylet_common::codec::{decode, encode, encode_into, encode_list_of_encoded, encoded_len};
use raylet_proto::{JobId, Labels, NodeId, ObjectId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An object reference as it is serialized inside a value.
#[derive(Serialize, Deserialize)]
struct WireRef {
    id: [u8; 16],
    owner: String,
}

/// A user's record, with an enum and nested options.
#[derive(Serialize, Deserialize)]
struct Record {
    name: String,
    step: u32,
    loss: Option<f64>,
    phase: Phase,
    tags: Vec<(char, bool)>,
}

#[derive(Serialize, Deserialize)]
enum Phase {
    Train { epoch: u16 },
    Eval(i64),
    Done,
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % 16 {
        0 => value::<u64>(bytes),
        1 => value::<(i8, i128, u16)>(bytes),
        2 => value::<String>(bytes),
        3 => list::<u8>(bytes),
        4 => list::<f32>(bytes),
        5 => value::<(u64, String, Vec<f32>)>(bytes),
        6 => value::<Option<Vec<String>>>(bytes),
        7 => value::<BTreeMap<String, Vec<u64>>>(bytes),
        8 => value::<Labels>(bytes),
        9 => list::<Record>(bytes),
        10 => list::<WireRef>(bytes),
        11 => value::<(NodeId, ObjectId, JobId)>(bytes),
        12 => tensor(bytes),
        13 => list::<Tensor>(bytes),
        14 => value::<std::time::Duration>(bytes),
        _ => value::<(f64, char, bool, ())>(bytes),
    }
});

/// Decodes a `T` and checks it, as [`check`] does.
fn value<T: Serialize + DeserializeOwned>(bytes: &[u8]) {
    check::<T>(bytes);
}

/// Decodes a `T`; when it decodes, checks that its encoding is stable.
fn check<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let value: T = decode(bytes).ok()?;
    let encoded = encode(&value).expect("a decoded value encodes");
    assert_eq!(encoded_len(&value).unwrap(), encoded.len());
    let mut exact = vec![0u8; encoded.len()];
    assert_eq!(encode_into(&value, &mut exact).unwrap(), encoded.len());
    assert_eq!(exact, encoded);
    let again: T = decode(&encoded).expect("a value's own encoding decodes");
    assert_eq!(encode(&again).unwrap(), encoded, "the encoding changed on a round trip");
    Some(value)
}

/// A list, also joined from its elements' encodings.
fn list<T: Serialize + DeserializeOwned>(bytes: &[u8]) {
    let Some(list) = check::<Vec<T>>(bytes) else {
        return;
    };
    let elements: Vec<Vec<u8>> = list.iter().map(|element| encode(element).unwrap()).collect();
    assert_eq!(encode_list_of_encoded(&elements).unwrap(), encode(&list).unwrap());
}

fn tensor(bytes: &[u8]) {
    let Some(tensor) = check::<Tensor>(bytes) else {
        return;
    };
    let elements = tensor.shape().iter().try_fold(1usize, |n, d| n.checked_mul(*d));
    let needed = elements.and_then(|n| n.checked_mul(tensor.dtype().size()));
    assert_eq!(
        needed,
        Some(tensor.as_bytes().len()),
        "a decoded {:?} tensor of shape {:?} holds {} bytes",
        tensor.dtype(),
        tensor.shape(),
        tensor.as_bytes().len()
    );
    if tensor.dtype() == DType::F32 {
        assert_eq!(tensor.to_f32().unwrap().len() * 4, tensor.as_bytes().len());
    }
}
