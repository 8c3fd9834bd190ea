//! An optimizer's state cut to the parameters a rank owns, and the ranks'
//! parts joined again for a checkpoint: burn keys each parameter's state by
//! its id, in the tensors, scalars and paths of a burnpack record.

use std::collections::{BTreeMap, HashSet};

use burn::module::ParamId;
use burn::optim::ModuleOptimizer;
use burn::tensor::Bytes;

use super::ShardingError;

/// The parts of one or more optimizer records, read back from burnpack.
#[derive(Default)]
struct RecordParts {
    tensors: Vec<burn_pack::Tensor>,
    scalars: BTreeMap<String, burn_pack::Scalar>,
    paths: BTreeMap<String, String>,
}

impl RecordParts {
    /// Adds `bytes`' entries for the parameters `keep` accepts.
    fn add(&mut self, bytes: Bytes, keep: impl Fn(u64) -> bool) -> Result<(), ShardingError> {
        let reader = burn_pack::Reader::from_bytes(bytes).map_err(|e| unusable("decode", e))?;
        let id_of = |key: &str| key.split('.').next().and_then(|id| id.parse::<u64>().ok());
        let kept = |key: &str| id_of(key).is_some_and(&keep);
        self.scalars.extend(
            reader
                .scalars()
                .iter()
                .filter(|(key, _)| kept(key))
                .map(|(k, v)| (k.clone(), *v)),
        );
        self.paths.extend(
            reader
                .metadata()
                .iter()
                .filter(|(key, _)| kept(key))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let tensors = reader.into_tensors().map_err(|e| unusable("decode", e))?;
        self.tensors
            .extend(tensors.into_iter().filter(|tensor| tensor.param_id.is_some_and(&keep)));
        Ok(())
    }

    fn into_optimizer(self, optimizer: ModuleOptimizer) -> Result<ModuleOptimizer, ShardingError> {
        let mut writer = burn_pack::Writer::new(self.tensors);
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, *value);
        }
        for (key, value) in &self.paths {
            writer = writer.with_metadata(key, value);
        }
        let bytes = writer.into_bytes().map_err(|e| unusable("encode", e))?;
        optimizer.from_bytes(bytes).map_err(|e| unusable("load", e))
    }
}

/// `optimizer` with the state of the parameters in `owned` only.
pub(crate) fn keep_owned(
    optimizer: ModuleOptimizer,
    owned: &HashSet<ParamId>,
) -> Result<ModuleOptimizer, ShardingError> {
    let bytes = optimizer.into_bytes().map_err(|e| unusable("encode", e))?;
    let mut parts = RecordParts::default();
    parts.add(bytes, |id| owned.contains(&ParamId::from(id)))?;
    parts.into_optimizer(optimizer)
}

/// `optimizer` holding the state of every part (each rank's encoded state).
pub(crate) fn join_parts(optimizer: ModuleOptimizer, parts: Vec<Vec<u8>>) -> Result<ModuleOptimizer, ShardingError> {
    let mut joined = RecordParts::default();
    for part in parts {
        joined.add(Bytes::from_bytes_vec(part), |_| true)?;
    }
    joined.into_optimizer(optimizer)
}

/// The optimizer's state could not `action` (encode, decode, load).
pub(super) fn unusable(action: &'static str, error: impl std::fmt::Display) -> ShardingError {
    ShardingError::OptimizerState {
        action,
        reason: error.to_string(),
    }
}
