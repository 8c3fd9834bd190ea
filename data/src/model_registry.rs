//! The models registered by type (with `register_batch_model!`, in
//! raylet's registry), so that actors (this binary, started again) can find them by name, load them
//! and apply them to blocks with their types erased.

use raylet::{EntryKind, RegistryError};

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

/// One registered model type, as raylet's registry holds it. Not a public API.
#[doc(hidden)]
pub struct RegisteredModel {
    load: LoadFn,
}

impl RegisteredModel {
    pub const fn of<M: BatchModel>() -> Self {
        RegisteredModel {
            load: load_encoded::<M>,
        }
    }
}

fn load_encoded<M: BatchModel>(config: &[u8]) -> Result<Box<dyn LoadedModel>, LoadError> {
    let name = std::any::type_name::<M>();
    let model: M = raylet::codec::decode(config).map_err(|source| LoadError::Config { model: name, source })?;
    let state = model.load().map_err(|source| LoadError::Load { model: name, source })?;
    Ok(Box::new(Loaded { model, state }))
}

/// The registered model called `name`.
pub(crate) fn find(name: &str) -> Result<&'static RegisteredModel, RegistryError> {
    raylet::find_registered(EntryKind::BatchModel, name)
}

/// Loads the model called `name` from its encoded configuration.
pub(crate) fn load(name: &str, config: &[u8]) -> Result<Box<dyn LoadedModel>, LoadError> {
    (find(name)?.load)(config)
}
