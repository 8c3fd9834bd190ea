//! The value codec: serde with postcard. Every value that crosses a process
//! boundary (task arguments, results, `put` objects) goes through here.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// Encodes a value.
/// The size is computed first, so a large value is written once into a
/// buffer of the right length instead of into one that keeps growing.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut buffer = vec![0u8; encoded_len(value)?];
    encode_into(value, &mut buffer)?;
    Ok(buffer)
}

/// How many bytes `value` encodes to.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize> {
    postcard::experimental::serialized_size(value).map_err(|e| encode_error::<T>(e))
}

/// Encodes `value` into `out`, which must be at least [`encoded_len`] long;
/// returns how many bytes were written.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut [u8]) -> Result<usize> {
    postcard::to_slice(value, out)
        .map(|written| written.len())
        .map_err(|e| encode_error::<T>(e))
}

fn encode_error<T: ?Sized>(error: postcard::Error) -> Error {
    Error::InvalidArgument(format!(
        "a value of type {} could not be encoded: {error}",
        std::any::type_name::<T>()
    ))
}

/// Encodes a list from its elements' encodings (each made by [`encode`]),
/// byte for byte as [`encode`] encodes the list itself: postcard writes a
/// sequence as its length (a varint, as a `usize`) and then its elements.
/// Lists can so be cut and joined without knowing the element type.
pub fn encode_list_of_encoded<B: AsRef<[u8]>>(elements: &[B]) -> Result<Vec<u8>> {
    let mut list = encode(&elements.len())?;
    for element in elements {
        list.extend_from_slice(element.as_ref());
    }
    Ok(list)
}

/// Decodes a value; bad bytes are an error, never a panic.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| {
        Error::InvalidArgument(format!(
            "{} bytes could not be decoded as {}: {e}",
            bytes.len(),
            std::any::type_name::<T>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let value = (42u64, "text".to_string(), vec![1.5f32, 2.5]);
        let bytes = encode(&value).unwrap();
        assert_eq!(decode::<(u64, String, Vec<f32>)>(&bytes).unwrap(), value);
    }

    #[test]
    fn a_list_joined_from_encoded_elements_is_the_encoded_list() {
        let list: Vec<(u64, String)> = (0..300).map(|n| (n * 1_000, format!("item {n}"))).collect();
        let elements: Vec<Vec<u8>> = list.iter().map(|item| encode(item).unwrap()).collect();
        assert_eq!(encode_list_of_encoded(&elements).unwrap(), encode(&list).unwrap());
        assert_eq!(
            encode_list_of_encoded::<Vec<u8>>(&[]).unwrap(),
            encode(&Vec::<u64>::new()).unwrap()
        );
    }

    #[test]
    fn garbage_is_an_error() {
        let error = decode::<(String, Vec<u64>)>(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(error.to_string().contains("could not be decoded"), "{error}");
    }
}
