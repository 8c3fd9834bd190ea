//! `Tensor`: a shape, an element type and one contiguous buffer. Archived
//! with rkyv, its buffer starts 64-byte aligned, so a reader on the same
//! node views a tensor in shared memory as `&[f32]` without copying it.

use rkyv::Place;
use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Positional, Writer};
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

/// The element type of a tensor.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub enum DType {
    U8,
    I32,
    I64,
    F32,
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
}

/// An n-dimensional array in row-major order. Its buffer holds exactly its
/// shape's elements: decoding (serde) and validating (bytecheck) refuse
/// one that does not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[serde(try_from = "TensorParts")]
#[rkyv(derive(Debug), bytecheck(verify))]
pub struct Tensor {
    shape: Vec<u64>,
    dtype: DType,
    #[serde(with = "serde_bytes")]
    #[rkyv(with = AlignedBytes)]
    data: Vec<u8>,
}

/// How many bytes a tensor of `shape` holds; `None` past `usize::MAX`.
fn byte_len(dtype: DType, shape: impl IntoIterator<Item = u64>) -> Option<usize> {
    shape
        .into_iter()
        .try_fold(dtype.size(), |bytes, d| bytes.checked_mul(usize::try_from(d).ok()?))
}

/// Checks that `len` bytes are exactly the elements of `shape`.
fn check_len(dtype: DType, shape: &[u64], len: usize) -> Result<()> {
    match byte_len(dtype, shape.iter().copied()) {
        Some(needed) if needed == len => Ok(()),
        needed => Err(StoreError::Invalid(format!(
            "a {dtype:?} tensor of shape {shape:?} needs {} bytes, got {len}",
            needed.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string())
        ))),
    }
}

/// A tensor as it is decoded, before its length is checked.
#[derive(Deserialize)]
struct TensorParts {
    shape: Vec<u64>,
    dtype: DType,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

impl TryFrom<TensorParts> for Tensor {
    type Error = StoreError;

    fn try_from(parts: TensorParts) -> Result<Tensor> {
        check_len(parts.dtype, &parts.shape, parts.data.len())?;
        Ok(Tensor {
            shape: parts.shape,
            dtype: parts.dtype,
            data: parts.data,
        })
    }
}

impl Tensor {
    /// A tensor over `data`, which must hold exactly the shape's elements.
    pub fn from_bytes(dtype: DType, shape: &[usize], data: Vec<u8>) -> Result<Tensor> {
        let shape: Vec<u64> = shape.iter().map(|d| *d as u64).collect();
        check_len(dtype, &shape, data.len())?;
        Ok(Tensor { shape, dtype, data })
    }

    pub fn from_f32(shape: &[usize], values: &[f32]) -> Result<Tensor> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_bytes(DType::F32, shape, data)
    }

    /// A tensor of zeros; panics, as a `Vec` of that size would, when its
    /// size overflows `usize`.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let len = byte_len(dtype, shape.iter().map(|d| *d as u64)).expect("the tensor's size overflows usize");
        Tensor {
            shape: shape.iter().map(|d| *d as u64).collect(),
            dtype,
            data: vec![0; len],
        }
    }

    pub fn shape(&self) -> Vec<usize> {
        self.shape.iter().map(|d| *d as usize).collect()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// The elements as `f32`, if that is the type.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DType::F32).then(|| f32_values(&self.data).collect())
    }
}

impl ArchivedTensor {
    pub fn shape(&self) -> Vec<usize> {
        self.shape.iter().map(|d| d.to_native() as usize).collect()
    }

    pub fn dtype(&self) -> DType {
        match self.dtype {
            ArchivedDType::U8 => DType::U8,
            ArchivedDType::I32 => DType::I32,
            ArchivedDType::I64 => DType::I64,
            ArchivedDType::F32 => DType::F32,
            ArchivedDType::F64 => DType::F64,
        }
    }

    /// The buffer, in place.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The elements as `&[f32]` in place, if that is the type. Archives are
    /// little-endian, so this view exists only on little-endian machines.
    pub fn as_f32(&self) -> Option<&[f32]> {
        let bytes = self.as_bytes();
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>());
        if self.dtype() != DType::F32 || !aligned || cfg!(target_endian = "big") {
            return None;
        }
        // SAFETY: the pointer is aligned for f32, the length is a whole
        // number of f32s (checked when the tensor was made, and every bit
        // pattern is a valid f32), and the bytes live as long as `self`.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / 4) })
    }
}

/// An archived tensor is valid only when its buffer holds exactly its
/// shape's elements.
// SAFETY: `verify` fails every archived tensor whose buffer is not exactly
// its shape's elements, the one invariant beyond its fields' own, which
// bytecheck has checked before it calls `verify`.
unsafe impl<C> rkyv::bytecheck::Verify<C> for ArchivedTensor
where
    C: Fallible + ?Sized,
    C::Error: Source,
{
    fn verify(&self, _: &mut C) -> std::result::Result<(), C::Error> {
        let shape: Vec<u64> = self.shape.iter().map(|d| d.to_native()).collect();
        check_len(self.dtype(), &shape, self.data.len()).map_err(C::Error::new)
    }
}

fn f32_values(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Where a tensor's buffer starts in an archive: a cache line boundary.
const DATA_ALIGN: usize = 64;

/// Archives a byte buffer at a [`DATA_ALIGN`]ed position.
struct AlignedBytes;

impl ArchiveWith<Vec<u8>> for AlignedBytes {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Vec<u8>, resolver: VecResolver, out: Place<ArchivedVec<u8>>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S: Fallible + Writer + ?Sized> SerializeWith<Vec<u8>, S> for AlignedBytes {
    fn serialize_with(field: &Vec<u8>, serializer: &mut S) -> std::result::Result<VecResolver, S::Error> {
        const ZEROS: [u8; DATA_ALIGN] = [0; DATA_ALIGN];
        let padding = (DATA_ALIGN - serializer.pos() % DATA_ALIGN) % DATA_ALIGN;
        serializer.write(&ZEROS[..padding])?;
        let pos = serializer.pos();
        serializer.write(field)?;
        Ok(VecResolver::from_pos(pos))
    }
}

impl<D: Fallible + ?Sized> DeserializeWith<ArchivedVec<u8>, Vec<u8>, D> for AlignedBytes {
    fn deserialize_with(field: &ArchivedVec<u8>, _: &mut D) -> std::result::Result<Vec<u8>, D::Error> {
        Ok(field.as_slice().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use rkyv::util::AlignedVec;

    use super::*;
    use crate::archive::{access, archive_into, archived_len};

    #[test]
    fn an_archived_tensor_views_its_floats_in_place() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let tensor = Tensor::from_f32(&[10, 100], &values).unwrap();
        let len = archived_len(&tensor).unwrap();
        let mut buffer = AlignedVec::<64>::with_capacity(len);
        buffer.resize(len, 0);
        archive_into(&tensor, &mut buffer).unwrap();
        let archived = access::<ArchivedTensor>(&buffer).unwrap();
        assert_eq!(archived.shape(), vec![10, 100]);
        assert_eq!(archived.dtype(), DType::F32);
        let view = archived.as_f32().unwrap();
        assert_eq!(view, &values[..]);
        assert!((view.as_ptr() as usize).is_multiple_of(DATA_ALIGN));
    }

    #[test]
    fn a_tensor_must_hold_exactly_its_shape() {
        assert!(Tensor::from_bytes(DType::F64, &[2, 2], vec![0; 31]).is_err());
        assert_eq!(Tensor::zeros(DType::I32, &[3, 5]).as_bytes().len(), 60);
    }

    #[test]
    fn a_shape_whose_size_overflows_is_an_error_not_a_panic() {
        let error = Tensor::from_bytes(DType::U8, &[usize::MAX, 2], vec![]).unwrap_err();
        assert!(error.to_string().contains("more than usize::MAX"), "{error}");
        assert!(Tensor::from_bytes(DType::F64, &[1 << 62], vec![]).is_err());
    }

    /// Found by the `value_codec` and `object_archive` fuzz targets: a
    /// tensor whose buffer is not its shape's was decoded and validated.
    #[test]
    fn a_tensor_whose_buffer_is_not_its_shape_is_refused_by_serde_and_bytecheck() {
        let wrong = Tensor {
            shape: vec![2],
            dtype: DType::F32,
            data: vec![0; 4],
        };
        let bytes = raylet_common::codec::encode(&wrong).unwrap();
        assert!(raylet_common::codec::decode::<Tensor>(&bytes).is_err());
        let right = Tensor::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let bytes = raylet_common::codec::encode(&right).unwrap();
        assert_eq!(raylet_common::codec::decode::<Tensor>(&bytes).unwrap(), right);

        let len = archived_len(&wrong).unwrap();
        let mut buffer = AlignedVec::<64>::with_capacity(len);
        buffer.resize(len, 0);
        archive_into(&wrong, &mut buffer).unwrap();
        let error = access::<ArchivedTensor>(&buffer).unwrap_err();
        assert!(error.to_string().contains("needs 8 bytes, got 4"), "{error}");
    }

    #[test]
    fn a_tensor_round_trips_through_serde() {
        let tensor = Tensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap();
        let bytes = raylet_common::codec::encode(&tensor).unwrap();
        let back: Tensor = raylet_common::codec::decode(&bytes).unwrap();
        assert_eq!(back.to_f32().unwrap(), vec![1.0, 2.0, 3.0]);
    }
}
