//! The models registered by type (with `register_batch_model!`), so that
//! actors (this binary, started again) can find them by name, load them
//! and apply them to blocks with their types erased.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::{BatchModel, LoadError};
use crate::registry::{self, BlockRows};
use crate::stage::{RowFailure, StageRun};

/// A model loaded in an actor, its types erased.
pub(crate) trait LoadedModel: Send {
    fn apply(&mut self, rows: &BlockRows, run: &mut StageRun) -> Result<BlockRows, RowFailure>;
}

struct Loaded<M: BatchModel> {
    model: M,
    state: M::State,
}

impl<M: BatchModel> LoadedModel for Loaded<M> {
    fn apply(&mut self, rows: &BlockRows, run: &mut StageRun) -> Result<BlockRows, RowFailure> {
        let (model, state) = (&self.model, &mut self.state);
        registry::apply_batches(rows, run, |batch| {
            model.predict(state, batch).map_err(|e| e.to_string())
        })
    }
}

/// Decodes a model's configuration and loads it.
type LoadFn = fn(&[u8]) -> Result<Box<dyn LoadedModel>, LoadError>;

/// One registered model type. Not a public API.
#[doc(hidden)]
pub struct RegisteredModel {
    pub name: fn() -> &'static str,
    load: LoadFn,
}

impl RegisteredModel {
    pub const fn of<M: BatchModel>() -> Self {
        RegisteredModel {
            name: std::any::type_name::<M>,
            load: load_encoded::<M>,
        }
    }
}

/// Every model type registered in this binary.
#[linkme::distributed_slice]
pub static BATCH_MODELS: [RegisteredModel];

fn load_encoded<M: BatchModel>(config: &[u8]) -> Result<Box<dyn LoadedModel>, LoadError> {
    let name = std::any::type_name::<M>();
    let model: M = raylet::codec::decode(config).map_err(|source| LoadError::Config { model: name, source })?;
    let state = model.load().map_err(|source| LoadError::Load { model: name, source })?;
    Ok(Box::new(Loaded { model, state }))
}

/// The registered model called `name`.
pub(crate) fn find(name: &str) -> Option<&'static RegisteredModel> {
    static BY_NAME: OnceLock<HashMap<&'static str, &'static RegisteredModel>> = OnceLock::new();
    let table = BY_NAME.get_or_init(|| BATCH_MODELS.iter().map(|entry| ((entry.name)(), entry)).collect());
    table.get(name).copied()
}

/// Loads the model called `name` from its encoded configuration.
pub(crate) fn load(name: &str, config: &[u8]) -> Result<Box<dyn LoadedModel>, LoadError> {
    let registered = find(name).ok_or_else(|| LoadError::NotRegistered(name.to_string()))?;
    (registered.load)(config)
}
