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
            .shared_objects
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

/// The error of a call that panicked with `payload`. On a worker holding
/// GPUs it names them: a GPU's driver errors surface as panics, and the
/// GPU is what to look at.
pub(super) fn panic_error(function: &str, payload: Box<dyn Any + Send>) -> TaskError {
    let message = crate::error::panic_message(payload.as_ref());
    let message = match super::gpu_ids().as_slice() {
        [] => message,
        ids => format!("{message} (on its node's GPU {})", gpu_list(ids)),
    };
    TaskError::new(TaskErrorKind::Panic, function, message)
}

fn gpu_list(ids: &[u32]) -> String {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    ids.join(", ")
}
