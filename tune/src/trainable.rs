//! What each trial runs: a function of its config and context, and the
//! registry through which a trial actor (this same binary, started again)
//! finds it by name.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::{TrialConfig, TrialContext, TuneError};

/// What a trainable returns: an error of any kind fails the trial.
pub type TrainableResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A trainable: it trains with `config` and reports through the context.
pub type TrainableFn = fn(&TrialConfig, &mut TrialContext) -> TrainableResult;

/// One registered trainable. Not a public API.
#[doc(hidden)]
pub struct RegisteredTrainable {
    pub name: fn() -> &'static str,
    pub run: TrainableFn,
}

/// Every trainable linked into this binary.
#[linkme::distributed_slice]
pub static TRAINABLES: [RegisteredTrainable];

/// What [`register_trainable!`](crate::register_trainable) expands to
/// refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use linkme;

    pub use super::{RegisteredTrainable, TRAINABLES};
}

/// Registers a trainable function so that trial actors can run it:
/// `register_trainable!(objective);` next to `fn objective(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult`.
#[macro_export]
macro_rules! register_trainable {
    ($trainable:path) => {
        const _: () = {
            #[$crate::__private::linkme::distributed_slice($crate::__private::TRAINABLES)]
            #[linkme(crate = $crate::__private::linkme)]
            static REGISTRATION: $crate::__private::RegisteredTrainable = $crate::__private::RegisteredTrainable {
                name: || ::std::any::type_name_of_val(&$trainable),
                run: $trainable,
            };
        };
    };
}

/// The name trial actors find `trainable` by, once it is known to be registered.
pub(crate) fn registered_name<F>(_trainable: &F) -> Result<&'static str, TuneError> {
    let name = std::any::type_name::<F>();
    match find(name) {
        Some(_) => Ok(name),
        None => Err(TuneError::NotRegistered(name.to_string())),
    }
}

/// The registered trainable called `name`.
pub(crate) fn find(name: &str) -> Option<&'static RegisteredTrainable> {
    static BY_NAME: OnceLock<HashMap<&'static str, &'static RegisteredTrainable>> = OnceLock::new();
    let table = BY_NAME.get_or_init(|| TRAINABLES.iter().map(|entry| ((entry.name)(), entry)).collect());
    table.get(name).copied()
}
