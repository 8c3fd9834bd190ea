//! The worker's task service: owners push tasks over a stream; arguments
//! are resolved here, then the executor runs them in order.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use raylet_proto::v1::worker_service_server::WorkerService;
use raylet_proto::v1::{TaskBatch, TaskSpec, WorkerEvents, task_arg};
use raylet_proto::{ObjectId, TaskId};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::WorkerContext;
use super::executor::Execution;
use crate::object_ref::{AnyObjectRef, RawRef};
use crate::task::{TaskError, TaskErrorKind};

pub(crate) struct WorkerServiceImpl {
    pub(crate) context: Arc<WorkerContext>,
}

#[tonic::async_trait]
impl WorkerService for WorkerServiceImpl {
    type PushTasksStream = Pin<Box<dyn Stream<Item = Result<WorkerEvents, Status>> + Send>>;

    async fn push_tasks(
        &self,
        request: Request<Streaming<TaskBatch>>,
    ) -> Result<Response<Self::PushTasksStream>, Status> {
        let mut inbound = request.into_inner();
        let (results, receiver) = mpsc::unbounded_channel();
        let context = self.context.clone();
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                for cancel in batch.cancel {
                    if let Ok(task_id) = TaskId::from_wire(&cancel.task_id) {
                        context.cancel(task_id, cancel.force);
                    }
                }
                for spec in batch.tasks {
                    let args = resolve_args(&context, &spec).await;
                    let execution = Execution {
                        spec,
                        args,
                        results: results.clone(),
                    };
                    if context.executions.send(execution).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(receiver))))
    }
}

/// Inline values as they are; references fetched from their owners.
async fn resolve_args(context: &WorkerContext, spec: &TaskSpec) -> Result<Vec<Bytes>, TaskError> {
    let mut args = Vec::with_capacity(spec.args.len());
    for (index, arg) in spec.args.iter().enumerate() {
        match &arg.kind {
            Some(task_arg::Kind::Value(bytes)) => args.push(bytes.clone()),
            Some(task_arg::Kind::ObjectRef(object)) => {
                let id = ObjectId::from_wire(&object.object_id).map_err(|e| argument_error(spec, index, e))?;
                let raw = RawRef {
                    id,
                    owner: object.owner_address.as_str().into(),
                };
                let outcome = context.core.wait_outcome(&AnyObjectRef::borrowed(raw), None).await;
                match outcome {
                    Ok(Some(Ok(value))) => args.push(value.data),
                    Ok(Some(Err(upstream))) => return Err(upstream),
                    Ok(None) => unreachable!("waiting without a deadline"),
                    Err(error) => return Err(argument_error(spec, index, error)),
                }
            }
            None => return Err(argument_error(spec, index, "the argument is empty")),
        }
    }
    Ok(args)
}

fn argument_error(spec: &TaskSpec, index: usize, error: impl std::fmt::Display) -> TaskError {
    TaskError::new(
        TaskErrorKind::Argument,
        &spec.function,
        format!("argument {index}: {error}"),
    )
}
