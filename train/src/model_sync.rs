//! burn models kept in step across a collective group: every rank starts
//! from rank 0's model, and each step's gradients are averaged over the
//! ranks as one fused allreduce, so that every replica takes the same step.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;

use crate::collective::{CollectiveError, CollectiveGroup, ReduceOp};
use crate::sharding::layout::ParamLayout;

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
    let layout = ParamLayout::new(model, group.world_size());
    let mut flat = Vec::new();
    {
        let _phase = raylet::timeline::span("copy_into_fusion_buffer", "train.allreduce");
        layout.flatten_grads(model, &grads, &mut flat);
    }
    group.allreduce(&mut flat, ReduceOp::Mean)?;
    let _phase = raylet::timeline::span("copy_out_of_fusion_buffer", "train.allreduce");
    Ok(layout.grads_from_flat(model, &grads, &flat, None, device))
}
