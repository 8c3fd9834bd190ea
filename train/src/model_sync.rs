//! burn models kept in step across a collective group: every rank starts
//! from rank 0's model, and each step's gradients are averaged over the
//! ranks as one fused allreduce, so that every replica takes the same step.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, TensorData};

use crate::collective::{CollectiveError, CollectiveGroup, ReduceOp};

/// Makes `model` rank 0's on every rank: rank 0's record is broadcast and
/// loaded, parameter ids included (an optimizer's state is keyed by them).
pub fn sync_initial_model<M: Module>(group: &mut CollectiveGroup, model: M) -> Result<M, CollectiveError> {
    let mut record = match group.rank() {
        0 => model
            .clone()
            .into_record()
            .into_bytes()
            .map_err(|e| CollectiveError::InvalidArgument(format!("encoding rank 0's model: {e}")))?
            .to_vec(),
        _ => Vec::new(),
    };
    group.broadcast_bytes(&mut record, 0)?;
    if group.rank() == 0 {
        return Ok(model);
    }
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(record))
        .map_err(|e| CollectiveError::InvalidArgument(format!("decoding rank 0's model: {e}")))?;
    Ok(model.load_record(record))
}

/// The mean over every rank of `grads`, the gradients of `model`: flattened
/// in the module's parameter order into one buffer, allreduced, and made
/// into gradients on `device` (the optimizer's, without autodiff) again.
pub fn allreduce_gradients<M: Module>(
    group: &mut CollectiveGroup,
    model: &M,
    grads: GradientsParams,
    device: &Device,
) -> Result<GradientsParams, CollectiveError> {
    crate::telemetry::step();
    let mut flatten = FlattenGrads {
        grads: &grads,
        flat: Vec::new(),
    };
    {
        let _phase = raylet::timeline::span("copy_into_fusion_buffer", "train.allreduce");
        model.visit(&mut flatten);
    }
    let mut flat = flatten.flat;
    group.allreduce(&mut flat, ReduceOp::Mean)?;
    let _phase = raylet::timeline::span("copy_out_of_fusion_buffer", "train.allreduce");
    let mut unflatten = UnflattenGrads {
        had: &grads,
        flat: &flat,
        offset: 0,
        device: device.clone(),
        out: GradientsParams::new(),
    };
    model.visit(&mut unflatten);
    Ok(unflatten.out)
}

/// Appends the gradient of every float parameter that has one.
struct FlattenGrads<'a> {
    grads: &'a GradientsParams,
    flat: Vec<f32>,
}

impl ModuleVisitor for FlattenGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.grads.get::<D>(param.id) {
            let values = grad.into_data().try_into_vec_as::<f32>();
            self.flat.extend(values.expect("a float gradient converts to f32"));
        }
    }
}

/// Cuts the flat buffer back into the gradients of the parameters that had one.
struct UnflattenGrads<'a> {
    had: &'a GradientsParams,
    flat: &'a [f32],
    offset: usize,
    device: Device,
    out: GradientsParams,
}

impl ModuleVisitor for UnflattenGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.had.get::<D>(param.id).is_none() {
            return;
        }
        let shape = param.val().shape();
        let count = shape.num_elements();
        let values = self.flat[self.offset..self.offset + count].to_vec();
        self.offset += count;
        let grad = Tensor::<D>::from_data(TensorData::new(values, shape), &self.device);
        self.out.register(param.id, grad);
    }
}
