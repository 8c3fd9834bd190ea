//! What a run executes on every worker, and the registry through which a
//! worker (this same binary, started again) finds it by name.

use std::collections::HashMap;
use std::sync::OnceLock;

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

/// One registered train loop. Not a public API.
#[doc(hidden)]
pub struct RegisteredLoop {
    pub name: fn() -> &'static str,
    pub run: fn(&[u8], &mut TrainContext) -> Result<(), TrainError>,
}

impl RegisteredLoop {
    pub const fn of<L: TrainLoop>() -> Self {
        RegisteredLoop {
            name: std::any::type_name::<L>,
            run: run_encoded::<L>,
        }
    }
}

/// Every train loop linked into this binary.
#[linkme::distributed_slice]
pub static TRAIN_LOOPS: [RegisteredLoop];

/// What [`register_train_loop!`](crate::register_train_loop) expands to
/// refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use linkme;

    pub use super::{RegisteredLoop, TRAIN_LOOPS};
}

/// Registers a [`TrainLoop`] type so that the workers of a run can run it.
#[macro_export]
macro_rules! register_train_loop {
    ($train_loop:ty) => {
        const _: () = {
            #[$crate::__private::linkme::distributed_slice($crate::__private::TRAIN_LOOPS)]
            #[linkme(crate = $crate::__private::linkme)]
            static REGISTRATION: $crate::__private::RegisteredLoop =
                $crate::__private::RegisteredLoop::of::<$train_loop>();
        };
    };
}

fn run_encoded<L: TrainLoop>(config: &[u8], context: &mut TrainContext) -> Result<(), TrainError> {
    let train_loop: L = raylet::codec::decode(config)
        .map_err(|e| TrainError::InvalidConfig(format!("decoding {}: {e}", std::any::type_name::<L>())))?;
    train_loop.run(context)
}

/// The name workers find `L` by, once it is known to be registered.
pub(crate) fn registered_name<L: TrainLoop>() -> Result<&'static str, TrainError> {
    let name = std::any::type_name::<L>();
    match find(name) {
        Some(_) => Ok(name),
        None => Err(TrainError::NotRegistered(name.to_string())),
    }
}

/// The registered train loop called `name`.
pub(crate) fn find(name: &str) -> Option<&'static RegisteredLoop> {
    static BY_NAME: OnceLock<HashMap<&'static str, &'static RegisteredLoop>> = OnceLock::new();
    let table = BY_NAME.get_or_init(|| TRAIN_LOOPS.iter().map(|entry| ((entry.name)(), entry)).collect());
    table.get(name).copied()
}
