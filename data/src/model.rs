//! Stateful batch functions for actor pools: a [`BatchModel`]'s fields are
//! its configuration, sent to each actor, which loads the model once and
//! applies it to every batch it is given. Models are registered by type so
//! that actors (this binary, started again) can find them.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Row;
use crate::registry::{self, EncodedRows};
use crate::stage::{RowFailure, StageRun};

/// A model that an actor loads once and applies to batches of rows, e.g. a
/// classifier read from a checkpoint. Register it with
/// [`register_batch_model!`](crate::register_batch_model).
pub trait BatchModel: Serialize + DeserializeOwned + Send + 'static {
    type In: Row;
    type Out: Row;
    /// What loading makes: weights, buffers, a device.
    type State: Send + 'static;

    /// Runs once in each actor, before its first batch.
    fn load(&self) -> Result<Self::State, ModelError>;

    /// One output per input, or any number for a whole batch.
    fn predict(&self, state: &mut Self::State, batch: Vec<Self::In>) -> Result<Vec<Self::Out>, ModelError>;
}

/// What a model's `load` or `predict` fails with: any error (`?` works on
/// every error type, and on `String`s), reported with its message.
pub type ModelError = Box<dyn std::error::Error + Send + Sync>;

/// Why an actor could not load its model.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0} is not registered in this binary")]
    NotRegistered(String),
    #[error("decoding {model}: {source}")]
    Config {
        model: &'static str,
        source: raylet::proto::Error,
    },
    #[error("loading {model}: {source}")]
    Load { model: &'static str, source: ModelError },
}

/// A model loaded in an actor, its types erased.
pub(crate) trait LoadedModel: Send {
    fn apply(&mut self, rows: &EncodedRows, run: &mut StageRun) -> Result<EncodedRows, RowFailure>;
}

struct Loaded<M: BatchModel> {
    model: M,
    state: M::State,
}

impl<M: BatchModel> LoadedModel for Loaded<M> {
    fn apply(&mut self, rows: &EncodedRows, run: &mut StageRun) -> Result<EncodedRows, RowFailure> {
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

/// Registers a [`BatchModel`] type for
/// [`Dataset::map_batches_with`](crate::Dataset::map_batches_with).
#[macro_export]
macro_rules! register_batch_model {
    ($model:ty) => {
        const _: () = {
            #[$crate::__private::linkme::distributed_slice($crate::__private::BATCH_MODELS)]
            #[linkme(crate = $crate::__private::linkme)]
            static REGISTRATION: $crate::__private::RegisteredModel =
                $crate::__private::RegisteredModel::of::<$model>();
        };
    };
}

fn load_encoded<M: BatchModel>(config: &[u8]) -> Result<Box<dyn LoadedModel>, LoadError> {
    let name = std::any::type_name::<M>();
    let model: M = raylet::proto::codec::decode(config).map_err(|source| LoadError::Config { model: name, source })?;
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
