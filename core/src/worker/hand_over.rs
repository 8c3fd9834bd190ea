//! Readies what a call made for its caller: a value as an object (a large
//! one written into this node's store, the caller registered as a borrower
//! of the references inside it), and a panic as the call's error.

use std::any::Any;

use raylet_proto::ObjectId;
use raylet_proto::v1::TaskSpec;

use super::WorkerContext;
use crate::task_error::{TaskError, TaskErrorKind};
use crate::value::{Body, EncodedValue};

/// Readies a value for its caller as object `id`: a large one goes into
/// this node's store, and the caller is registered as a borrower of the
/// references inside it before the value can reach it. Registrations this
/// worker made for references in the arguments are acknowledged first too.
pub(super) async fn hand_over(
    context: &WorkerContext,
    spec: &TaskSpec,
    id: ObjectId,
    mut value: EncodedValue,
) -> Result<EncodedValue, TaskError> {
    let core = &context.core;
    if let Body::Inline(data) = &value.body
        && data.len() >= crate::INLINE_LIMIT
    {
        let data = data.clone();
        let copy = |out: &mut [u8]| {
            out[..data.len()].copy_from_slice(&data);
            Ok(data.len())
        };
        let stored = core
            .write_object_async(id, data.len(), spec.owner_address.as_str().into(), copy)
            .await;
        let message = |e: crate::Error| format!("the return value could not be stored: {e}");
        value.body =
            Body::Stored(stored.map_err(|e| TaskError::new(TaskErrorKind::Application, &spec.function, message(e)))?);
    }
    for object in value.contained.iter() {
        let raw = object.raw();
        if *raw.owner == *spec.owner_address {
            continue;
        }
        if core.owner.owns(object) {
            core.owner.store.update_borrower(raw.id, &spec.owner_address, 1);
        } else {
            core.owner.borrows.register_for(raw, &spec.owner_address);
        }
    }
    core.owner.borrows.settled().await;
    Ok(value)
}

/// The error of a call that panicked with `payload`.
pub(super) fn panic_error(function: &str, payload: Box<dyn Any + Send>) -> TaskError {
    TaskError::new(
        TaskErrorKind::Panic,
        function,
        crate::error::panic_message(payload.as_ref()),
    )
}
