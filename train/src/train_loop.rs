//! What a run executes on every worker, and its entry in raylet's registry,
//! through which a worker (this same binary, started again) finds it by name.

use raylet::{EntryKind, RegistryError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{TrainContext, TrainError};

/// A train loop: its fields are the run's configuration, sent to every
/// worker, and [`TrainLoop::run`] is what each worker runs. Register the
/// type with [`register_train_loop!`](crate::register_train_loop) so that
/// workers can find it.
pub trait TrainLoop: Serialize + DeserializeOwned + Send + 'static {
    /// Trains on one worker, with that worker's rank, group, data shard
    /// and report channel.
    fn run(self, context: &mut TrainContext) -> Result<(), TrainError>;

    /// How many times rank 0 reports in a whole run, when known: the
    /// driver's progress bar counts toward it.
    fn reports(&self) -> Option<u64> {
        None
    }

    /// The configuration the run's callbacks are told of (MLflow logs it as
    /// params): every field by default; a loop whose fields carry data
    /// (rows, a tokenizer) leaves that out.
    fn callback_config(&self) -> serde_json::Result<serde_json::Value> {
        config_json(self)
    }
}

/// `config` as JSON, its `f32` fields as written (`0.01`, not the `f64`
/// nearest the `f32`, `0.009999999776482582`).
pub fn config_json<T: Serialize>(config: &T) -> serde_json::Result<serde_json::Value> {
    serde_json::from_str(&serde_json::to_string(config)?)
}

/// One registered train loop, as raylet's registry holds it. Not a public API.
#[doc(hidden)]
pub struct RegisteredLoop {
    pub run: fn(&[u8], &mut TrainContext) -> Result<(), TrainError>,
}

impl RegisteredLoop {
    pub const fn of<L: TrainLoop>() -> Self {
        RegisteredLoop { run: run_encoded::<L> }
    }
}

/// What [`register_train_loop!`](crate::register_train_loop) expands to
/// refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use raylet;

    pub use super::RegisteredLoop;
}

/// Registers a [`TrainLoop`] type so that the workers of a run can run it.
#[macro_export]
macro_rules! register_train_loop {
    ($train_loop:ty) => {
        $crate::__private::raylet::__register!(
            TrainLoop,
            ::std::any::type_name::<$train_loop>,
            &$crate::__private::RegisteredLoop::of::<$train_loop>()
        );
    };
}

fn run_encoded<L: TrainLoop>(config: &[u8], context: &mut TrainContext) -> Result<(), TrainError> {
    let train_loop: L = raylet::codec::decode(config)
        .map_err(|e| TrainError::InvalidConfig(format!("decoding {}: {e}", std::any::type_name::<L>())))?;
    train_loop.run(context)
}

/// The name workers find `L` by, once it is known to be registered.
pub(crate) fn registered_name<L: TrainLoop>() -> Result<&'static str, RegistryError> {
    let name = std::any::type_name::<L>();
    find(name).map(|_| name)
}

/// The registered train loop called `name`.
pub(crate) fn find(name: &str) -> Result<&'static RegisteredLoop, RegistryError> {
    raylet::find_registered(EntryKind::TrainLoop, name)
}
