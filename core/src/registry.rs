//! The compile-time registry of remote functions, and the helpers that the
//! `#[raylet::remote]` expansion calls. Not a public API.

use std::collections::HashMap;
use std::fmt::Display;
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

/// One function made remote by `#[raylet::remote]`.
pub struct RemoteFunction {
    pub name: &'static str,
    pub invoke: Invoke,
}

/// Every remote function linked into this binary.
#[linkme::distributed_slice]
pub static REMOTE_FUNCTIONS: [RemoteFunction];

/// Finds a registered function by name.
pub(crate) fn lookup(name: &str) -> Option<Invoke> {
    static BY_NAME: OnceLock<HashMap<&'static str, Invoke>> = OnceLock::new();
    let table = BY_NAME.get_or_init(|| REMOTE_FUNCTIONS.iter().map(|f| (f.name, f.invoke)).collect());
    table.get(name).copied()
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

pub fn decode_arg<T: DeserializeOwned>(function: &str, index: usize, bytes: &[u8]) -> Result<T, TaskError> {
    raylet_proto::codec::decode(bytes).map_err(|e| {
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
