//! Sharded data parallelism, ZeRO's stages (FSDP's FULL_SHARD being stage
//! 3): each rank keeps the optimizer state, and with the higher stages the
//! gradients and the parameters, of its own share of the model only, and
//! the ranks exchange the rest with reduce-scatter and allgather.
//!
//! A rank's share is a run of whole parameters (about 1/n of the model's
//! elements; the largest parameter bounds how even the shares are), so
//! that any burn optimizer steps it: burn keeps an optimizer's state per
//! parameter, and a parameter without a gradient is left alone.
//!
//! With [`ShardingStrategy::Parameters`], parameters outside a rank's share
//! are empty tensors between steps; [`DataParallel::model`] gathers the
//! whole model for the forward and backward passes, and the step empties
//! it again. The whole model is one unit (FSDP would gather layer by
//! layer), so a step still holds every parameter and gradient once.

pub(crate) mod layout;
mod optimizer_state;

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use crate::collective::{CollectiveError, CollectiveGroup, ReduceOp};
use crate::model_sync::sync_initial_model;
use layout::ParamLayout;

/// Why a sharded step, gather or checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardingError {
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// An optimizer's state did not encode, or a rank's part of it did not
    /// decode as a burnpack record (of this optimizer).
    #[error("an optimizer's state does not {action}: {reason}")]
    OptimizerState { action: &'static str, reason: String },
}

/// What each rank keeps of the model's training state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardingStrategy {
    /// Plain data parallelism: every rank keeps everything, and gradients
    /// are allreduced.
    #[default]
    None,
    /// ZeRO stage 1: the optimizer state is sharded. Gradients are
    /// allreduced; each rank steps its share of the parameters, then the
    /// ranks allgather them.
    OptimizerState,
    /// ZeRO stage 2: optimizer state and gradients are sharded. Gradients
    /// are reduce-scattered, so a rank keeps only its share's.
    Gradients,
    /// ZeRO stage 3 (FSDP's FULL_SHARD): optimizer state, gradients and
    /// parameters are sharded; the parameters are gathered for each step.
    Parameters,
}

/// Bytes one rank holds between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMemory {
    /// The model's parameter values this rank keeps (f32).
    pub parameters: u64,
    /// The optimizer's state this rank keeps (its encoded size).
    pub optimizer_state: u64,
}

/// A model and its optimizer trained data-parallel over a group, sharded by
/// a [`ShardingStrategy`].
pub struct DataParallel<M: Module> {
    strategy: ShardingStrategy,
    layout: ParamLayout,
    rank: usize,
    /// The whole model, except with [`ShardingStrategy::Parameters`], where
    /// it holds this rank's parameters and empty tensors for the others.
    model: M,
    optimizer: ModuleOptimizer,
    /// The largest global gradient norm a step takes; larger ones are
    /// scaled down to it.
    max_gradient_norm: Option<f32>,
    /// What the last step spent in the optimizer's update.
    last_update_time: Duration,
    /// The flat gradients' allocation, kept from step to step where the
    /// strategy keeps whole gradients anyway (plain data parallelism and
    /// ZeRO-1): a fresh one would be faulted in page by page every step.
    gradient_buffer: Vec<f32>,
}

impl<M: Module> DataParallel<M> {
    /// Starts every rank from rank 0's `model`, with `optimizer` (fresh, or
    /// loaded from a checkpoint of the whole state: each rank keeps its
    /// share of it).
    pub fn new(
        group: &mut CollectiveGroup,
        model: M,
        optimizer: ModuleOptimizer,
        strategy: ShardingStrategy,
    ) -> Result<Self, ShardingError> {
        let model = sync_initial_model(group, model)?;
        let rank = group.rank();
        let layout = ParamLayout::new(&model, group.world_size());
        let (model, optimizer) = match strategy {
            ShardingStrategy::None => (model, optimizer),
            ShardingStrategy::Parameters => (
                layout.empty_others(model, rank),
                optimizer_state::keep_owned(optimizer, &layout.owned_ids(rank))?,
            ),
            _ => (model, optimizer_state::keep_owned(optimizer, &layout.owned_ids(rank))?),
        };
        Ok(DataParallel {
            strategy,
            layout,
            rank,
            model,
            optimizer,
            max_gradient_norm: None,
            last_update_time: Duration::ZERO,
            gradient_buffer: Vec::new(),
        })
    }

    /// Scales each step's averaged gradients down to a global L2 norm of
    /// `max_norm` when they exceed it (PyTorch's `clip_grad_norm_`), the
    /// norm taken over the whole model whatever each rank holds.
    pub fn clip_gradient_norm(mut self, max_norm: f32) -> Self {
        self.max_gradient_norm = Some(max_norm);
        self
    }

    pub fn strategy(&self) -> ShardingStrategy {
        self.strategy
    }

    /// The time the last [`step`](Self::step) spent in the optimizer's
    /// update of this rank's parameters, without the collectives, the
    /// clipping and the copies around it: the part of a step that is the
    /// optimizer's own work rather than the runtime's.
    pub fn last_update_time(&self) -> Duration {
        self.last_update_time
    }

    /// The whole model, to run forward and backward on (gathered from every
    /// rank with [`ShardingStrategy::Parameters`]; every rank must call it).
    pub fn model(&mut self, group: &mut CollectiveGroup) -> Result<M, ShardingError> {
        match self.strategy {
            ShardingStrategy::Parameters => self.with_others(group, self.model.clone()),
            _ => Ok(self.model.clone()),
        }
    }

    /// One optimizer step with learning rate `lr` from `grads`, this rank's
    /// gradients of `model` (the one [`DataParallel::model`] returned),
    /// averaged over the ranks as the strategy says; `device` is the
    /// optimizer's (without autodiff). With clipping on, returns the global
    /// L2 norm of the averaged gradients before clipping; without, nothing
    /// is spent on it.
    pub fn step(
        &mut self,
        group: &mut CollectiveGroup,
        lr: f64,
        model: M,
        grads: GradientsParams,
        device: &Device,
    ) -> Result<Option<f32>, ShardingError> {
        crate::telemetry::step();
        let mut flat = std::mem::take(&mut self.gradient_buffer);
        self.layout.flatten_grads(&model, &grads, &mut flat);
        let owner = match self.strategy {
            ShardingStrategy::None => {
                group.allreduce(&mut flat, ReduceOp::Mean)?;
                None
            }
            ShardingStrategy::OptimizerState => {
                group.allreduce(&mut flat, ReduceOp::Mean)?;
                Some(self.rank)
            }
            ShardingStrategy::Gradients | ShardingStrategy::Parameters => {
                group.reduce_scatter_segments(&mut flat, self.layout.segments(), ReduceOp::Mean)?;
                Some(self.rank)
            }
        };
        let norm = self.clip(group, &mut flat)?;
        let own_grads = self.layout.grads_from_flat(&model, &grads, &flat, owner, device);
        drop(grads);
        if matches!(self.strategy, ShardingStrategy::None | ShardingStrategy::OptimizerState) {
            self.gradient_buffer = flat;
        } else {
            drop(flat);
        }
        let update_started = Instant::now();
        let stepped = self.optimizer.step(lr, model, own_grads);
        self.last_update_time = update_started.elapsed();
        self.model = match self.strategy {
            ShardingStrategy::None => stepped,
            ShardingStrategy::Parameters => self.layout.empty_others(stepped, self.rank),
            _ => self.with_others(group, stepped)?,
        };
        Ok(norm)
    }

    /// With clipping on, the global norm of the averaged gradients in
    /// `flat`, whose valid part is this rank's segment once they are
    /// reduce-scattered; that part is scaled down to the largest norm allowed.
    fn clip(&self, group: &mut CollectiveGroup, flat: &mut [f32]) -> Result<Option<f32>, ShardingError> {
        let Some(max_norm) = self.max_gradient_norm else {
            return Ok(None);
        };
        let (valid, scattered) = match self.strategy {
            ShardingStrategy::None | ShardingStrategy::OptimizerState => (0..flat.len(), false),
            ShardingStrategy::Gradients | ShardingStrategy::Parameters => {
                (self.layout.segments()[self.rank].clone(), true)
            }
        };
        let mut squares = [sum_of_squares(&flat[valid.clone()])];
        if scattered {
            group.allreduce(&mut squares, ReduceOp::Sum)?;
        }
        let norm = squares[0].sqrt() as f32;
        let scale = max_norm / (norm + 1e-6);
        if scale < 1.0 {
            flat[valid].iter_mut().for_each(|g| *g *= scale);
        }
        Ok(Some(norm))
    }

    /// On rank 0, the whole model and the whole optimizer state, for a
    /// checkpoint (the same files as plain data parallelism writes, so a run
    /// may resume with another strategy or world size); `None` elsewhere.
    /// Every rank must call it.
    pub fn gathered(&mut self, group: &mut CollectiveGroup) -> Result<Option<(M, ModuleOptimizer)>, ShardingError> {
        let model = self.model(group)?;
        if self.strategy == ShardingStrategy::None {
            return Ok((self.rank == 0).then(|| (model, self.optimizer.clone())));
        }
        let own = self
            .optimizer
            .into_bytes()
            .map_err(|e| optimizer_state::unusable("encode", e))?
            .to_vec();
        let parts = group.gather_bytes(own, 0)?;
        match self.rank {
            0 => Ok(Some((
                model,
                optimizer_state::join_parts(self.optimizer.clone(), parts)?,
            ))),
            _ => Ok(None),
        }
    }

    /// What this rank holds between steps.
    pub fn memory(&self) -> Result<ShardMemory, ShardingError> {
        let parameters = self.layout.held_elements(&self.model) * std::mem::size_of::<f32>();
        let optimizer_state = self
            .optimizer
            .into_bytes()
            .map_err(|e| optimizer_state::unusable("encode", e))?
            .len();
        Ok(ShardMemory {
            parameters: parameters as u64,
            optimizer_state: optimizer_state as u64,
        })
    }

    /// `model`, whose share of this rank is up to date, with every other
    /// rank's share allgathered into it.
    fn with_others(&self, group: &mut CollectiveGroup, model: M) -> Result<M, ShardingError> {
        let mut flat = vec![0f32; self.layout.total()];
        self.layout.write_values(&model, self.rank, &mut flat);
        group.allgather_segments(&mut flat, self.layout.segments())?;
        Ok(self.layout.fill_others(model, self.rank, &flat))
    }
}

/// `Σ g²` over `values`: f32 products summed in 16 lanes (which the compiler
/// vectorizes) over blocks of 4096, the blocks' sums added in f64.
fn sum_of_squares(values: &[f32]) -> f64 {
    values
        .chunks(4096)
        .map(|block| {
            let mut lanes = [0f32; 16];
            let mut whole = block.chunks_exact(16);
            for chunk in &mut whole {
                for (lane, &g) in lanes.iter_mut().zip(chunk) {
                    *lane += g * g;
                }
            }
            let rest: f32 = whole.remainder().iter().map(|&g| g * g).sum();
            lanes.iter().map(|&lane| f64::from(lane)).sum::<f64>() + f64::from(rest)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::sum_of_squares;

    #[test]
    fn the_sum_of_squares_matches_an_f64_sum_past_whole_lanes_and_blocks() {
        let values: Vec<f32> = (0..10_007).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let exact: f64 = values.iter().map(|&g| f64::from(g) * f64::from(g)).sum();
        let relative = (sum_of_squares(&values) - exact).abs() / exact;
        assert!(relative < 1e-6, "{relative}");
        assert_eq!(sum_of_squares(&[]), 0.0);
        assert_eq!(sum_of_squares(&[3.0]), 9.0);
    }
}
