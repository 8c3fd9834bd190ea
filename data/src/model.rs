//! Stateful batch functions for actor pools: a [`BatchModel`]'s fields are
//! its configuration, sent to each actor, which loads the model once and
//! applies it to every batch it is given.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Row;

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
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("decoding {model}: {source}")]
    Config {
        model: &'static str,
        source: raylet::codec::Error,
    },
    #[error("loading {model}: {source}")]
    Load { model: &'static str, source: ModelError },
}
