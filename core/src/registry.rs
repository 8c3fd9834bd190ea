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

/// What running a task produces: the encoded return value, or the failure.
pub type TaskOutcome = Result<EncodedValue, TaskError>;
/// What running an async task produces.
pub type TaskFuture = Pin<Box<dyn Future<Output = TaskOutcome> + Send>>;

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
    EncodedValue::encode(value)
        .map_err(|e| TaskError::new(TaskErrorKind::Application, function, format!("the return value: {e}")))
}

pub fn encode_result<T: Serialize, E: Display>(function: &str, result: Result<T, E>) -> TaskOutcome {
    match result {
        Ok(value) => encode_value(function, &value),
        Err(error) => Err(application_error(function, error)),
    }
}

/// The task error for an `Err` the user's code returned.
pub fn application_error(function: &str, error: impl Display) -> TaskError {
    TaskError::new(TaskErrorKind::Application, function, error.to_string())
}
