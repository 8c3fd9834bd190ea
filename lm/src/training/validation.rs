//! Validation loss: the ranks share the validation rows (every
//! `world_size`-th from their rank on), each evaluates its rows without
//! autodiff, and the summed losses give the mean over every row.

use burn::module::Module;
use burn::prelude::*;
use raylet_models::gpt::{Gpt, token_batch};
use raylet_train::TrainError;
use raylet_train::collective::{CollectiveGroup, ReduceOp};

use crate::TokenRow;

/// Rows per forward pass of validation.
const VALIDATION_BATCH_ROWS: usize = 16;

/// The mean next-token loss of `model` over `rows`, computed by every rank
/// of `group` on its part on `device` (without autodiff); every rank must
/// call it.
pub(super) fn validation_loss(
    group: &mut CollectiveGroup,
    model: &Gpt,
    rows: &[TokenRow],
    device: &Device,
) -> Result<f64, TrainError> {
    let evaluated = model.valid();
    let mine: Vec<&[u32]> = rows
        .iter()
        .skip(group.rank())
        .step_by(group.world_size())
        .map(|row| row.ids.as_slice())
        .collect();
    let mut totals = [0.0, 0.0];
    for batch in mine.chunks(VALIDATION_BATCH_ROWS) {
        let loss = evaluated.loss(token_batch(batch, device)).into_scalar::<f32>();
        totals[0] += f64::from(loss) * batch.len() as f64;
        totals[1] += batch.len() as f64;
    }
    group.allreduce(&mut totals, ReduceOp::Sum)?;
    Ok(totals[0] / totals[1].max(1.0))
}
