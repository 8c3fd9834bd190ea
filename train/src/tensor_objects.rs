//! burn tensors as cluster objects, whatever device they live on: a put
//! stages the tensor to host memory (burn-cuda reads a GPU's through
//! cubecl's pinned staging buffers) and stores it; a get places it on the
//! getter's device. In the process that put it, a get hands back the tensor
//! itself, with no copy.

use burn::prelude::*;
use burn::tensor::TensorData;
use raylet::{Cluster, ObjectRef};
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// A tensor of `D` dimensions stored in the cluster. Pass it to tasks and
/// actors like any object reference.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorRef<const D: usize> {
    object: ObjectRef<TensorData>,
    /// The tensor itself, in the process that put it.
    #[serde(skip)]
    local: Option<Tensor<D>>,
}

impl<const D: usize> TensorRef<D> {
    /// Stores `tensor`: its values are copied to host memory (from its GPU,
    /// if it lives on one) and into the cluster's object store.
    pub fn put(cluster: &Cluster, tensor: Tensor<D>) -> Result<Self, TrainError> {
        let object = cluster.put(&tensor.to_data())?;
        Ok(TensorRef {
            object,
            local: Some(tensor),
        })
    }

    /// The tensor on `device`, in the float type it was put in. In the process that put it, that is the
    /// tensor itself (moved between devices directly if `device` is another
    /// one); elsewhere its values are read from the object store and copied
    /// onto `device`.
    pub fn get(&self, cluster: &Cluster, device: &Device) -> Result<Tensor<D>, TrainError> {
        if let Some(tensor) = &self.local {
            return Ok(tensor.clone().to_device(device));
        }
        let data = cluster.get(&self.object)?;
        if data.rank() != D {
            return Err(TrainError::Loop(format!(
                "object {:?} holds a tensor of {} dimensions, not the {D} asked for",
                self.object,
                data.rank()
            )));
        }
        let dtype = data.dtype();
        Ok(Tensor::from_data(data, (device, dtype)))
    }

    /// Whether this process put the tensor, so that a get does not copy it.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// The object holding the tensor's values.
    pub fn object(&self) -> &ObjectRef<TensorData> {
        &self.object
    }
}
