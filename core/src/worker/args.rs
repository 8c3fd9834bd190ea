//! A task's arguments, resolved to their bytes: inline values as they are,
//! stored objects mapped from this node's shared memory, references fetched
//! from their owners.

use std::sync::Arc;

use bytes::Bytes;
use raylet_proto::ObjectId;
use raylet_proto::v1::{self, TaskSpec, task_arg};

use super::WorkerContext;
use crate::objects::object_ref::handle::{AnyObjectRef, RawRef};
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{Body, Format, StoredAt};

/// Inline values as they are; stored objects mapped from this node's store;
/// references fetched from their owners on the cluster thread, whose
/// connections stay alive while a task runs here.
pub(super) async fn resolve_args(context: &Arc<WorkerContext>, spec: &TaskSpec) -> Result<Vec<Bytes>, TaskError> {
    let mut args = Vec::with_capacity(spec.args.len());
    for (index, arg) in spec.args.iter().enumerate() {
        let resolved = match &arg.kind {
            Some(task_arg::Kind::Value(bytes)) => Ok(bytes.clone()),
            Some(task_arg::Kind::Stored(stored)) => map_stored(context, spec, stored).await,
            Some(task_arg::Kind::ObjectRef(object)) => fetch(context, object).await,
            None => Err(ArgError::Other("the argument is empty".into())),
        };
        match resolved {
            Ok(bytes) => args.push(bytes),
            Err(ArgError::Upstream(error)) => return Err(error),
            Err(ArgError::Other(message)) => return Err(argument_error(spec, index, message)),
        }
    }
    Ok(args)
}

/// Why an argument has no bytes: the task that makes it failed, or
/// something else went wrong.
enum ArgError {
    Upstream(TaskError),
    Other(String),
}

impl<E: std::fmt::Display> From<E> for ArgError {
    fn from(error: E) -> Self {
        ArgError::Other(error.to_string())
    }
}

async fn map_stored(context: &Arc<WorkerContext>, spec: &TaskSpec, stored: &v1::StoredArg) -> Result<Bytes, ArgError> {
    let object = RawRef {
        id: ObjectId::from_wire(&stored.object_id)?,
        owner: spec.owner_address.as_str().into(),
    };
    let at = StoredAt::from_proto(stored.location.clone().unwrap_or_default());
    map_object(context, object, at).await
}

/// A stored object's bytes, straight from this node's shared memory.
async fn map_object(context: &Arc<WorkerContext>, object: RawRef, at: StoredAt) -> Result<Bytes, ArgError> {
    let objects = context.core.shared_objects.clone();
    let mapped = context
        .core
        .ctx()
        .runtime
        .spawn(async move { objects.map_object(&object, &at).await })
        .await??;
    Ok(Bytes::from_owner(mapped))
}

async fn fetch(context: &Arc<WorkerContext>, object: &v1::ObjectRefProto) -> Result<Bytes, ArgError> {
    let raw = RawRef::from_proto(object)?;
    let object = AnyObjectRef::unheld(raw.clone());
    let id = raw.id;
    let core = context.core.clone();
    let fetched = context
        .core
        .ctx()
        .runtime
        .spawn(async move { core.wait_outcome(&object, None).await })
        .await??;
    let value = fetched
        .ok_or("waiting without a deadline ended")?
        .map_err(ArgError::Upstream)?;
    if value.format != Format::Postcard {
        return Err(ArgError::Other(format!(
            "object {id} was stored as an rkyv archive; pass its ObjectRef and call get_archived() in the task"
        )));
    }
    match value.body {
        Body::Inline(data) => Ok(data),
        Body::Stored(at) => map_object(context, raw, at).await,
    }
}

fn argument_error(spec: &TaskSpec, index: usize, error: impl std::fmt::Display) -> TaskError {
    TaskError::new(
        TaskErrorKind::Argument,
        &spec.function,
        format!("argument {index}: {error}"),
    )
}
