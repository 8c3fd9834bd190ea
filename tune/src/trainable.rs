//! What each trial runs: a function of its config and context, and its
//! entry in raylet's registry, through which a trial actor (this same
//! binary, started again) finds it by name.

use std::fmt::Display;

use raylet::{EntryKind, RegistryError};

use crate::{TrialConfig, TrialContext, TuneError};

/// What a trainable returns when any error will do (`?` takes every error
/// type, and `String`s): an error fails the trial with its message. A
/// trainable may return `Result<(), E>` for any `E` that displays, too.
pub type TrainableResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A trainable as trial actors run it: it trains with `config` and reports
/// through the context.
pub type TrainableFn = fn(&TrialConfig, &mut TrialContext) -> TrainableResult;

/// A trainable's outcome, its error (of any type that displays) kept as
/// its message. Not a public API.
#[doc(hidden)]
pub fn trial_outcome<E: Display>(outcome: Result<(), E>) -> TrainableResult {
    outcome.map_err(|error| error.to_string().into())
}

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

    pub use super::{RegisteredTrainable, trial_outcome};
}

/// Registers a trainable function so that trial actors can run it:
/// `register_trainable!(objective);` next to `fn objective(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult`.
#[macro_export]
macro_rules! register_trainable {
    ($trainable:path) => {
        $crate::__private::raylet::__register!(
            Trainable,
            || ::std::any::type_name_of_val(&$trainable),
            &$crate::__private::RegisteredTrainable {
                run: |config, context| $crate::__private::trial_outcome($trainable(config, context)),
            }
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
