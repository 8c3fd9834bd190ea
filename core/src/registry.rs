//! The compile-time registry of everything a binary's workers find by
//! name (remote functions, actor classes, and the functions and types the
//! libraries register), and the helpers that the `#[raylet::remote]`
//! expansion calls.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

pub use bytes::Bytes;
pub use linkme;
pub use serde;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::EncodedValue;

/// What running a task produces: what it returned, or the failure.
pub type TaskOutcome = Result<Returned, TaskError>;
/// What running an async task produces.
pub type TaskFuture = Pin<Box<dyn Future<Output = TaskOutcome> + Send>>;
/// One item of a generator, encoded, or the error that ends it.
pub type ItemOutcome = Result<EncodedValue, TaskError>;

/// What a call returned, encoded.
pub enum Returned {
    /// One value: the task's one return object.
    One(EncodedValue),
    /// Several values, one return object each (`num_returns = N`).
    Many(Vec<EncodedValue>),
    /// A generator's items, made one at a time as its caller takes them.
    Items(Items),
}

/// The items of a generator, not made yet.
pub enum Items {
    /// A sync generator: an iterator, advanced on the task's thread.
    Iter(Box<dyn Iterator<Item = ItemOutcome> + Send>),
    /// An async generator: a stream, polled on the worker's runtime.
    Stream(Pin<Box<dyn futures_util::Stream<Item = ItemOutcome> + Send>>),
}

/// How to run a registered function on encoded arguments.
#[derive(Clone, Copy)]
pub enum Invoke {
    Sync(fn(Vec<Bytes>) -> TaskOutcome),
    Async(fn(Vec<Bytes>) -> TaskFuture),
}

/// What a registered name stands for; a name is unique within its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A function made remote by `#[raylet::remote]`.
    RemoteFunction,
    /// A type made an actor by `#[raylet::actor]`.
    ActorClass,
    /// A function of raylet-data's transforms (`register_map!` and others).
    DataFunction,
    /// A model of raylet-data's `map_batches_with` (`register_batch_model!`).
    BatchModel,
    /// A train loop of raylet-train (`register_train_loop!`).
    TrainLoop,
    /// A trainable of raylet-tune (`register_trainable!`).
    Trainable,
    /// A deployment class of raylet-serve (`register_deployment!`).
    Deployment,
}

impl EntryKind {
    /// What registers a name of this kind.
    fn registered_with(self) -> &'static str {
        match self {
            EntryKind::RemoteFunction => "#[raylet::remote]",
            EntryKind::ActorClass => "#[raylet::actor]",
            EntryKind::DataFunction => {
                "register_map!, register_flat_map!, register_filter!, register_batch_fn! or register_arrow_fn!"
            }
            EntryKind::BatchModel => "register_batch_model!",
            EntryKind::TrainLoop => "register_train_loop!",
            EntryKind::Trainable => "register_trainable!",
            EntryKind::Deployment => "register_deployment!",
        }
    }
}

impl Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntryKind::RemoteFunction => "remote function",
            EntryKind::ActorClass => "actor class",
            EntryKind::DataFunction => "data function",
            EntryKind::BatchModel => "batch model",
            EntryKind::TrainLoop => "train loop",
            EntryKind::Trainable => "trainable",
            EntryKind::Deployment => "deployment class",
        })
    }
}

/// One name a macro registered: its kind, and the entry that the library
/// of that kind downcasts to its own type. Made by [`__register!`](crate::__register).
pub struct Registration {
    pub kind: EntryKind,
    /// A function, as `std::any::type_name` is not `const`.
    pub name: fn() -> &'static str,
    pub entry: &'static (dyn Any + Send + Sync),
}

/// Every name registered in this binary, of every kind.
#[linkme::distributed_slice]
pub static REGISTRY: [Registration];

/// Why a name has no entry to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Nothing of the kind is registered under the name.
    #[error(
        "the {kind} `{name}` is not registered in this binary (register it with {}); {kind} names registered: {}",
        kind.registered_with(),
        listed(registered)
    )]
    NotRegistered {
        kind: EntryKind,
        name: String,
        /// The names of the kind that are registered, sorted.
        registered: Vec<&'static str>,
    },
    /// Several entries of the kind are registered under the name.
    #[error("the {kind} `{name}` is registered {count} times in this binary: register it once")]
    Duplicate {
        kind: EntryKind,
        name: String,
        count: usize,
    },
    /// The entry is not of the type its kind's library reads.
    #[error("the {kind} `{name}` is registered with an entry of another type than {expected}")]
    WrongEntry {
        kind: EntryKind,
        name: String,
        expected: &'static str,
    },
}

impl RegistryError {
    /// The name that was looked up.
    pub fn name(&self) -> &str {
        match self {
            RegistryError::NotRegistered { name, .. }
            | RegistryError::Duplicate { name, .. }
            | RegistryError::WrongEntry { name, .. } => name,
        }
    }
}

/// Names as an error lists them.
fn listed(names: &[&str]) -> String {
    match names.is_empty() {
        true => "none".to_string(),
        false => names.join(", "),
    }
}

/// The registrations of each kind and name.
type Index = HashMap<(EntryKind, &'static str), Vec<&'static Registration>>;

fn index() -> &'static Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut index = Index::new();
        for registration in REGISTRY.iter() {
            let key = (registration.kind, (registration.name)());
            index.entry(key).or_default().push(registration);
        }
        index
    })
}

/// The entry of `kind` registered as `name`, as the `T` its library made it.
pub fn find_registered<T: Any>(kind: EntryKind, name: &str) -> Result<&'static T, RegistryError> {
    let registrations = index().get(&(kind, name)).map(Vec::as_slice).unwrap_or_default();
    let [registration] = registrations else {
        let name = name.to_string();
        return Err(match registrations.len() {
            0 => RegistryError::NotRegistered {
                kind,
                name,
                registered: registered_names(kind),
            },
            count => RegistryError::Duplicate { kind, name, count },
        });
    };
    registration
        .entry
        .downcast_ref()
        .ok_or_else(|| RegistryError::WrongEntry {
            kind,
            name: name.to_string(),
            expected: std::any::type_name::<T>(),
        })
}

/// The names of `kind` registered in this binary, sorted, each once.
pub fn registered_names(kind: EntryKind) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = index().keys().filter(|key| key.0 == kind).map(|key| key.1).collect();
    names.sort_unstable();
    names
}

/// Registers `entry` as the `kind` called `name()`: what `#[raylet::remote]`,
/// `#[raylet::actor]` and the libraries' `register_*!` macros expand to.
/// Not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __register {
    ($kind:ident, $name:expr, $entry:expr) => {
        const _: () = {
            #[$crate::__private::linkme::distributed_slice($crate::__private::REGISTRY)]
            #[linkme(crate = $crate::__private::linkme)]
            static REGISTRATION: $crate::__private::Registration = $crate::__private::Registration {
                kind: $crate::__private::EntryKind::$kind,
                name: $name,
                entry: $entry,
            };
        };
    };
}

/// The remote function called `name`.
pub(crate) fn lookup(name: &str) -> Result<Invoke, RegistryError> {
    find_registered(EntryKind::RemoteFunction, name).copied()
}

pub fn check_arity(function: &str, args: &[Bytes], expected: usize) -> Result<(), TaskError> {
    if args.len() == expected {
        return Ok(());
    }
    Err(TaskError::new(
        TaskErrorKind::Argument,
        function,
        format!("expected {expected} arguments, got {}", args.len()),
    ))
}

/// Argument `index` of a call as a `T`; the [`crate::SharedBytes`] in it
/// view `bytes` (the task's message, or the object's shared memory).
pub fn decode_arg<T: DeserializeOwned>(function: &str, index: usize, bytes: &Bytes) -> Result<T, TaskError> {
    crate::shared_bytes::viewing(bytes, raylet_common::codec::decode).map_err(|e| {
        TaskError::new(
            TaskErrorKind::Argument,
            function,
            format!("argument {index}: {}", e.message()),
        )
    })
}

pub fn encode_value<T: Serialize>(function: &str, value: &T) -> TaskOutcome {
    encode_one(function, value).map(Returned::One)
}

pub fn encode_result<T: Serialize, E: Display>(function: &str, result: Result<T, E>) -> TaskOutcome {
    match result {
        Ok(value) => encode_value(function, &value),
        Err(error) => Err(application_error(function, error)),
    }
}

/// Encodes one value of a call's output.
fn encode_one<T: Serialize>(function: &str, value: &T) -> ItemOutcome {
    EncodedValue::encode(value)
        .map_err(|e| TaskError::new(TaskErrorKind::Application, function, format!("the return value: {e}")))
}

/// The values of a tuple, encoded one by one: a call's several returns.
pub trait EncodeReturns {
    fn encode_returns(&self, function: &str) -> Result<Vec<EncodedValue>, TaskError>;
}

macro_rules! encode_returns_of_tuples {
    ($(($($name:ident: $index:tt),+)),+) => {$(
        impl<$($name: Serialize),+> EncodeReturns for ($($name,)+) {
            fn encode_returns(&self, function: &str) -> Result<Vec<EncodedValue>, TaskError> {
                Ok(vec![$(encode_one(function, &self.$index)?),+])
            }
        }
    )+};
}

encode_returns_of_tuples!(
    (A: 0, B: 1),
    (A: 0, B: 1, C: 2),
    (A: 0, B: 1, C: 2, D: 3),
    (A: 0, B: 1, C: 2, D: 3, E: 4),
    (A: 0, B: 1, C: 2, D: 3, E: 4, F: 5),
    (A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6),
    (A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7)
);

/// Encodes a tuple as several returns.
pub fn encode_returns<T: EncodeReturns>(function: &str, values: &T) -> TaskOutcome {
    values.encode_returns(function).map(Returned::Many)
}

pub fn encode_returns_result<T: EncodeReturns, E: Display>(function: &str, result: Result<T, E>) -> TaskOutcome {
    match result {
        Ok(values) => encode_returns(function, &values),
        Err(error) => Err(application_error(function, error)),
    }
}

/// One item of a generator that yields values or `Result`s.
pub trait IntoItem {
    fn into_item(self, function: &'static str) -> ItemOutcome;
}

/// An item that is a plain value.
pub struct Plain<T>(pub T);

impl<T: Serialize> IntoItem for Plain<T> {
    fn into_item(self, function: &'static str) -> ItemOutcome {
        encode_one(function, &self.0)
    }
}

impl<T: Serialize, E: Display> IntoItem for Result<T, E> {
    fn into_item(self, function: &'static str) -> ItemOutcome {
        match self {
            Ok(value) => encode_one(function, &value),
            Err(error) => Err(application_error(function, error)),
        }
    }
}

/// A sync generator's items; each is encoded as the generator makes it.
pub fn iterate<I>(function: &'static str, items: I) -> TaskOutcome
where
    I: IntoIterator + Send + 'static,
    I::IntoIter: Send,
    I::Item: IntoItem,
{
    let items = items.into_iter().map(move |item| item.into_item(function));
    Ok(Returned::Items(Items::Iter(Box::new(items))))
}

/// A sync generator's plain values; each is encoded as the generator makes it.
pub fn iterate_values<I>(function: &'static str, items: I) -> TaskOutcome
where
    I: IntoIterator + Send + 'static,
    I::IntoIter: Send,
    I::Item: Serialize,
{
    iterate(function, items.into_iter().map(Plain))
}

/// An async generator's plain values; each is encoded as the stream makes it.
pub fn stream_values<S>(function: &'static str, items: S) -> TaskOutcome
where
    S: futures_util::Stream + Send + 'static,
    S::Item: Serialize,
{
    use futures_util::StreamExt;
    stream(function, items.map(Plain))
}

/// An async generator's items; each is encoded as the stream makes it.
pub fn stream<S>(function: &'static str, items: S) -> TaskOutcome
where
    S: futures_util::Stream + Send + 'static,
    S::Item: IntoItem,
{
    use futures_util::StreamExt;
    let items = items.map(move |item| item.into_item(function));
    Ok(Returned::Items(Items::Stream(Box::pin(items))))
}

/// The task error for an `Err` the user's code returned.
pub fn application_error(function: &str, error: impl Display) -> TaskError {
    TaskError::new(TaskErrorKind::Application, function, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::__register!(Trainable, || "registry::tests::second", &2u32);
    crate::__register!(Trainable, || "registry::tests::first", &1u32);
    crate::__register!(Deployment, || "registry::tests::other_kind", &3u32);
    crate::__register!(TrainLoop, || "registry::tests::twice", &4u32);
    crate::__register!(TrainLoop, || "registry::tests::twice", &5u32);
    crate::__register!(BatchModel, || "registry::tests::a_number", &6u32);

    #[test]
    fn an_entry_is_found_by_its_kind_and_name() {
        assert_eq!(
            find_registered::<u32>(EntryKind::Trainable, "registry::tests::first"),
            Ok(&1)
        );
        assert_eq!(
            find_registered::<u32>(EntryKind::Trainable, "registry::tests::second"),
            Ok(&2)
        );
        let other_kind = find_registered::<u32>(EntryKind::Trainable, "registry::tests::other_kind");
        assert!(
            matches!(other_kind, Err(RegistryError::NotRegistered { .. })),
            "{other_kind:?}"
        );
    }

    #[test]
    fn a_missing_name_lists_the_names_of_its_kind_sorted() {
        let error = find_registered::<u32>(EntryKind::Trainable, "registry::tests::missing").unwrap_err();
        let registered = vec!["registry::tests::first", "registry::tests::second"];
        assert_eq!(
            error,
            RegistryError::NotRegistered {
                kind: EntryKind::Trainable,
                name: "registry::tests::missing".to_string(),
                registered,
            }
        );
        assert_eq!(error.name(), "registry::tests::missing");
        assert_eq!(
            error.to_string(),
            "the trainable `registry::tests::missing` is not registered in this binary (register it with \
             register_trainable!); trainable names registered: registry::tests::first, registry::tests::second"
        );
        let none = find_registered::<u32>(EntryKind::DataFunction, "registry::tests::missing").unwrap_err();
        assert!(
            none.to_string().ends_with("data function names registered: none"),
            "{none}"
        );
    }

    #[test]
    fn a_name_registered_twice_is_refused() {
        let error = find_registered::<u32>(EntryKind::TrainLoop, "registry::tests::twice").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the train loop `registry::tests::twice` is registered 2 times in this binary: register it once"
        );
        assert_eq!(registered_names(EntryKind::TrainLoop), ["registry::tests::twice"]);
    }

    #[test]
    fn an_entry_of_another_type_is_refused() {
        let error = find_registered::<String>(EntryKind::BatchModel, "registry::tests::a_number").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the batch model `registry::tests::a_number` is registered with an entry of another type than \
             alloc::string::String"
        );
    }
}
