//! Collectives on burn tensors, whatever device they live on: each rank's
//! tensor is staged to host memory, goes around the group's host rings as
//! any buffer does, and comes back as a tensor on the device it came from.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use super::{CollectiveError, CollectiveGroup, ReduceOp};

impl CollectiveGroup {
    /// `tensor` reduced over every rank with `op`, on `tensor`'s device and
    /// in its float type. `f64` tensors are reduced as `f64`; other float
    /// types (`f16`, `bf16`) as `f32`, then converted back.
    pub fn allreduce_tensor<const D: usize>(
        &mut self,
        tensor: Tensor<D>,
        op: ReduceOp,
    ) -> Result<Tensor<D>, CollectiveError> {
        let device = tensor.device();
        let data = tensor.into_data();
        let (dtype, shape) = (data.dtype(), data.shape().clone());
        let reduced = match dtype {
            DType::F64 => {
                let mut values = host_values::<f64>(data)?;
                self.allreduce(&mut values, op)?;
                TensorData::new(values, shape)
            }
            _ => {
                let mut values = host_values::<f32>(data.convert::<f32>())?;
                self.allreduce(&mut values, op)?;
                TensorData::new(values, shape).convert_dtype(dtype)
            }
        };
        Ok(Tensor::from_data(reduced, (&device, dtype)))
    }

    /// Rank `root`'s tensor on every rank, each on the device of the tensor
    /// it passed (of the same shape and float type as the root's).
    pub fn broadcast_tensor<const D: usize>(
        &mut self,
        tensor: Tensor<D>,
        root: usize,
    ) -> Result<Tensor<D>, CollectiveError> {
        let device = tensor.device();
        let data = tensor.into_data();
        let (dtype, shape) = (data.dtype(), data.shape().clone());
        let mut bytes = data.into_bytes().to_vec();
        self.broadcast_bytes(&mut bytes, root)?;
        let data = TensorData::from_bytes_vec(bytes, shape, dtype);
        Ok(Tensor::from_data(data, (&device, dtype)))
    }
}

fn host_values<E: burn::tensor::Element>(data: TensorData) -> Result<Vec<E>, CollectiveError> {
    data.try_into_vec::<E>()
        .map_err(|error| CollectiveError::InvalidArgument(format!("a tensor's values could not be read: {error:?}")))
}
