//! Actors: stateful workers made with `#[raylet::actor]`. The head places,
//! restarts and lists them; callers hold typed handles whose calls go
//! straight to the actor's worker, in submission order.

pub(crate) mod client;
mod handle;
mod info;
pub(crate) mod instance;
#[cfg(test)]
mod tests;
mod watch;

use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::actor_service_client::ActorServiceClient;
use raylet_proto::v1::{CreateActorRequest, GetNamedActorRequest, KillActorRequest, ListActorsRequest, TaskArg};
use raylet_proto::{ActorId, TaskId};

pub(crate) use client::ActorCall;
pub(crate) use handle::CallShape;
pub use handle::{Actor, ActorBuilder, ActorHandle, ActorOptions};
pub use info::{ActorInfo, ActorState};

use crate::context::Context;
use crate::links::head_retry::retrying;
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::objects::owner::Owner;
use crate::submitter::task::Arg;
use crate::submitter::{pinned_by, resolve_arg};
use crate::task_error::TaskError;
use crate::{Cluster, Error, Result};

/// How long a constructor argument that a task still makes is waited for.
const ARGUMENT_PATIENCE: Duration = Duration::from_secs(600);
/// How long the head may take to answer a connection.
const HEAD_PATIENCE: Duration = Duration::from_secs(5);

impl Cluster {
    /// Creates an actor; `ActorBuilder::spawn` calls this.
    pub fn create_actor(&self, options: ActorOptions, args: Vec<Arg>) -> Result<ActorHandle> {
        let core = self.core().clone();
        let (placement, running) = options.demands()?;
        let scheduling = options.scheduling.to_scheduling()?;
        let id = ActorId::random();
        let handle = ActorHandle::new(id, options.class, options.max_task_retries);
        let creating = core.clone();
        core.block_on(async move {
            let core = creating;
            let request = CreateActorRequest {
                actor_id: id.as_bytes().to_vec(),
                class_name: options.class.to_string(),
                args: resolve_constructor_args(&core.owner, &args).await?,
                binary: Some(core.ctx().binary.clone()),
                placement: Some(placement.to_proto()),
                running: Some(running.to_proto()),
                name: options.name,
                namespace: options.namespace.unwrap_or_else(|| core.ctx().binary.namespace.clone()),
                detached: options.detached,
                max_restarts: options.max_restarts,
                max_concurrency: options.max_concurrency,
                owner_address: core.ctx().address.to_string(),
                max_task_retries: options.max_task_retries,
                strategy: Some(scheduling.to_proto()),
            };
            retrying(|| async {
                core.actors.ensure_owner_session().await?;
                let reply = actor_service(core.ctx()).await?.create_actor(request.clone()).await;
                reply.map_err(raylet_proto::Error::from)?;
                Ok(())
            })
            .await?;
            core.actors.created(id, options.max_task_retries, pinned_by(args));
            Ok::<_, Error>(())
        })?;
        Ok(handle)
    }

    /// Submits a call of an actor's method; see [`ActorHandle::call`].
    /// Returns references to the objects it returns: its values, or a
    /// generator's outcome, whose stream is open before the call is sent.
    pub(crate) fn call_actor(
        &self,
        handle: &ActorHandle,
        (method, function): (&'static str, String),
        args: Result<Vec<Arg>, TaskError>,
        shape: CallShape,
    ) -> (TaskId, Vec<AnyObjectRef>) {
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerSubmits);
        let core = self.core();
        let task_id = TaskId::random();
        let permit = self.admit_pending();
        let returns = self.pending_returns(task_id, shape.num_returns);
        if let Some(backpressure) = shape.generator {
            core.owner.generators.open(task_id, backpressure);
        }
        match args {
            Ok(args) => {
                let call = ActorCall {
                    task_id,
                    method,
                    function,
                    args,
                    permit,
                    num_returns: shape.num_returns,
                    generator: shape.generator.is_some(),
                };
                core.actors.call(handle.id(), handle.max_task_retries(), call);
            }
            Err(error) => core.owner.fail_all(returns.iter().map(AnyObjectRef::id), error),
        }
        (task_id, returns)
    }

    /// The live actor named `name` in this program's namespace, as a handle of
    /// type `A`. Fails when no live actor has that name, or when it is of
    /// another type.
    pub fn get_actor<A: Actor>(&self, name: &str) -> Result<A::Handle> {
        let namespace = self.core().ctx().binary.namespace.clone();
        self.get_actor_in::<A>(&namespace, name)
    }

    /// [`Cluster::get_actor`] in `namespace`.
    pub fn get_actor_in<A: Actor>(&self, namespace: &str, name: &str) -> Result<A::Handle> {
        let core = self.core().clone();
        let request = GetNamedActorRequest {
            name: name.to_string(),
            namespace: namespace.to_string(),
        };
        let record = core.clone().block_on(async move {
            let named = || async {
                let reply = actor_service(core.ctx()).await?.get_named_actor(request.clone()).await;
                Ok(reply.map_err(raylet_proto::Error::from)?.into_inner())
            };
            retrying(named).await
        })?;
        if record.class_name != A::CLASS {
            return Err(Error::WrongActorType {
                name: name.to_string(),
                expected: A::CLASS.to_string(),
                actual: record.class_name,
            });
        }
        let id = ActorId::from_wire(&record.actor_id)?;
        Ok(A::Handle::from(ActorHandle::new(id, A::CLASS, record.max_task_retries)))
    }

    /// Ends an actor's process and returns once it is gone. Unless
    /// `no_restart`, it restarts if its `max_restarts` allow; otherwise it is
    /// dead, and its calls fail with `ActorDied`.
    pub fn kill(&self, handle: impl AsRef<ActorHandle>, no_restart: bool) -> Result<()> {
        let core = self.core().clone();
        let request = KillActorRequest {
            actor_id: handle.as_ref().id().as_bytes().to_vec(),
            no_restart,
        };
        core.clone().block_on(async move {
            let kill = || async {
                let reply = actor_service(core.ctx()).await?.kill_actor(request.clone()).await;
                reply.map_err(raylet_proto::Error::from)?;
                Ok(())
            };
            retrying(kill).await
        })
    }

    /// Every actor of the cluster, dead ones included, oldest first.
    pub fn list_actors(&self) -> Result<Vec<ActorInfo>> {
        let core = self.core().clone();
        core.clone()
            .block_on(async move { list_actors(&core.ctx().head_address, &core.ctx().token).await })
    }
}

/// The head's actor service, on this process's channel to the head.
async fn actor_service(ctx: &Context) -> Result<ActorServiceClient<AuthedChannel>> {
    Ok(ActorServiceClient::new(ctx.channel(&ctx.head_address).await?))
}

/// Every actor of the cluster whose head is at `head`, dead ones included,
/// oldest first, as `raylet list actors` shows them.
pub async fn list_actors(head: &str, token: &AuthToken) -> Result<Vec<ActorInfo>> {
    let channel = raylet_proto::channel::connect(head, token, HEAD_PATIENCE).await?;
    let reply = ActorServiceClient::new(channel).list_actors(ListActorsRequest {}).await;
    let records = reply.map_err(raylet_proto::Error::from)?.into_inner().actors;
    records.into_iter().map(ActorInfo::from_record).collect()
}

impl AsRef<ActorHandle> for ActorHandle {
    fn as_ref(&self) -> &ActorHandle {
        self
    }
}

/// The constructor's arguments as the head passes them on; objects that a
/// task still makes are waited for first.
async fn resolve_constructor_args(owner: &Owner, args: &[Arg]) -> Result<Vec<TaskArg>> {
    let mut resolved = Vec::with_capacity(args.len());
    for arg in args {
        if let Arg::Ref(object) = arg
            && owner.owns(object)
        {
            let deadline = tokio::time::Instant::now() + ARGUMENT_PATIENCE;
            owner.store.wait(object.id(), Some(deadline)).await?;
        }
        match resolve_arg(owner, arg) {
            Ok(Some(arg)) => resolved.push(arg),
            Ok(None) => {
                let object = match arg {
                    Arg::Ref(object) => object.id().to_string(),
                    Arg::Value { .. } => "a value".to_string(),
                };
                return Err(Error::Cluster(raylet_proto::Error::DeadlineExceeded(format!(
                    "the constructor's argument {object} was not ready within {ARGUMENT_PATIENCE:?}"
                ))));
            }
            Err(error) => return Err(Error::Task(error)),
        }
    }
    Ok(resolved)
}
