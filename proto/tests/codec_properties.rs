//! Properties of the value codec: any value round-trips through encode and
//! decode, the size it announces is the size it writes, and decoding
//! arbitrary or cut-off bytes is an error, never a panic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use raylet_common::codec::{decode, encode, encode_into, encoded_len};
use serde::{Deserialize, Serialize};

/// A value with the shapes task arguments and results take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Sample {
    id: u64,
    delta: i32,
    name: String,
    bytes: Vec<u8>,
    weight: Option<f64>,
    tags: Vec<(String, u32)>,
    counts: BTreeMap<String, i64>,
    shape: Shape,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Empty,
    Point(i16, i16),
    Named { label: String, flag: bool },
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Empty),
        any::<(i16, i16)>().prop_map(|(x, y)| Shape::Point(x, y)),
        (".*", any::<bool>()).prop_map(|(label, flag)| Shape::Named { label, flag }),
    ]
}

fn sample() -> impl Strategy<Value = Sample> {
    let fields = (
        any::<u64>(),
        any::<i32>(),
        ".*",
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::option::of(proptest::num::f64::NORMAL | proptest::num::f64::ZERO),
        proptest::collection::vec((".{0,8}", any::<u32>()), 0..4),
        proptest::collection::btree_map(".{0,8}", any::<i64>(), 0..4),
        shape(),
    );
    fields.prop_map(|(id, delta, name, bytes, weight, tags, counts, shape)| Sample {
        id,
        delta,
        name,
        bytes,
        weight,
        tags,
        counts,
        shape,
    })
}

proptest! {
    #[test]
    fn any_value_round_trips(value in sample()) {
        let bytes = encode(&value).expect("every sample encodes");
        prop_assert_eq!(decode::<Sample>(&bytes).expect("its own encoding decodes"), value);
    }

    #[test]
    fn the_announced_length_is_the_length_written(value in sample()) {
        let bytes = encode(&value).expect("every sample encodes");
        prop_assert_eq!(encoded_len(&value).expect("sized"), bytes.len());
        let mut buffer = vec![0u8; bytes.len()];
        prop_assert_eq!(encode_into(&value, &mut buffer).expect("fits"), bytes.len());
        prop_assert_eq!(buffer, bytes);
    }

    #[test]
    fn a_cut_off_encoding_is_an_error(value in sample(), cut in 1usize..16) {
        let bytes = encode(&value).expect("every sample encodes");
        let kept = bytes.len().saturating_sub(cut);
        prop_assert!(decode::<Sample>(&bytes[..kept]).is_err());
    }

    #[test]
    fn decoding_arbitrary_bytes_returns_an_error_or_a_value_never_a_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        if let Ok(value) = decode::<Sample>(&bytes) {
            let again = encode(&value).expect("a decoded value encodes");
            let reread = decode::<Sample>(&again).expect("and decodes");
            prop_assert_eq!(encode(&reread).expect("encodes"), again, "compared encoded, as NaN != NaN");
        }
        let _ = decode::<String>(&bytes);
        let _ = decode::<Vec<u64>>(&bytes);
        let _ = decode::<BTreeMap<String, Vec<u8>>>(&bytes);
    }
}
