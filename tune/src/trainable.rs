//! What each trial runs: a function of its config and context, and its
//! entry in raylet's registry, through which a trial actor (this same
//! binary, started again) finds it by name.

use raylet::{EntryKind, RegistryError};

use crate::{TrialConfig, TrialContext, TuneError};

/// What a trainable returns: an error of any kind fails the trial.
pub type TrainableResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A trainable: it trains with `config` and reports through the context.
pub type TrainableFn = fn(&TrialConfig, &mut TrialContext) -> TrainableResult;

/// One registered trainable, as raylet's registry holds it. Not a public API.
#[doc(hidden)]
pub struct RegisteredTrainable {
    pub run: TrainableFn,
}

/// What [`register_trainable!`](crate::register_trainable) expands to
/// refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use raylet;

    pub use super::RegisteredTrainable;
}

/// Registers a trainable function so that trial actors can run it:
/// `register_trainable!(objective);` next to `fn objective(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult`.
#[macro_export]
macro_rules! register_trainable {
    ($trainable:path) => {
        $crate::__private::raylet::__register!(
            Trainable,
            || ::std::any::type_name_of_val(&$trainable),
            &$crate::__private::RegisteredTrainable { run: $trainable }
        );
    };
}

/// The name trial actors find `trainable` by, once it is known to be registered.
pub(crate) fn registered_name<F>(_trainable: &F) -> Result<&'static str, TuneError> {
    let name = std::any::type_name::<F>();
    find(name)?;
    Ok(name)
}

/// The registered trainable called `name`.
pub(crate) fn find(name: &str) -> Result<&'static RegisteredTrainable, RegistryError> {
    raylet::find_registered(EntryKind::Trainable, name)
}
