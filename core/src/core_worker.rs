//! The owner side of a process (driver or worker): the objects it owns, the
//! task submitter, and fetching objects that other processes own.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raylet_common::auth::AuthToken;
use raylet_proto::owner_calls::LocalOwners;
use raylet_proto::server::MAX_DATA_MESSAGE;
use raylet_proto::service_error::from_status;
use raylet_proto::v1::owner_service_client::OwnerServiceClient;
use raylet_proto::v1::{GetObjectRequest, WorkerBinary};
use raylet_proto::{JobId, ObjectId};
use tokio::sync::mpsc;

use crate::actor::client::ActorClients;
use crate::context::{Addresses, Context};
use crate::generator::table::Generators;
use crate::links::Links;
use crate::objects::borrows::Borrows;
use crate::objects::memory_store::{MemoryStore, OwningHook};
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::objects::owner::Owner;
use crate::objects::owner_error::OwnerError;
use crate::objects::shared_objects::SharedObjects;
use crate::observability::task_events::{Placement, TaskEvents};
use crate::placement_group::session::GroupSession;
use crate::submitter::SubmitterHandle;
use crate::value::{Outcome, outcome_from_proto};
use crate::{Error, Result};

/// A borrowed object is asked for in slices of this length, so a lost
/// owner is noticed.
const FETCH_SLICE: Duration = Duration::from_secs(10);

/// Called with `true` when a task starts waiting for an object and `false`
/// when it resumes, so the node can lend the task's CPUs meanwhile.
pub(crate) type BlockedHook = Box<dyn Fn(bool) + Send + Sync>;

/// Everything a process needs to own objects and submit tasks: the parts
/// of the core, assembled here.
pub(crate) struct CoreWorker {
    /// The objects it owns and borrows, and its tasks' states, with the
    /// process's context.
    pub(crate) owner: Arc<Owner>,
    /// Large values in this node's shared-memory store: written, read and
    /// deleted through it.
    pub(crate) shared_objects: Arc<SharedObjects>,
    pub(crate) submitter: SubmitterHandle,
    pub(crate) blocked_hook: Option<BlockedHook>,
    /// The actors this process calls.
    pub(crate) actors: Arc<ActorClients>,
    /// Placement group creates and removes go to the head through this.
    pub(crate) placement_groups: GroupSession,
    /// Gets from owners on this machine, through their same-node sockets;
    /// none over virtual links.
    local_owners: Option<Arc<LocalOwners>>,
}

/// Where a process's owner service listens and how it reaches its node.
pub(crate) struct CoreSettings {
    pub(crate) address: String,
    pub(crate) token: AuthToken,
    pub(crate) head_address: String,
    pub(crate) node_manager: String,
    pub(crate) binary: WorkerBinary,
    pub(crate) log_to_driver: bool,
    pub(crate) blocked_hook: Option<BlockedHook>,
    pub(crate) owning_hook: Option<OwningHook>,
    pub(crate) store_full_timeout: Duration,
    /// The job this process's tasks are recorded under (a worker's follows
    /// the tasks it runs).
    pub(crate) job: JobId,
    /// Whether task states go to the head.
    pub(crate) task_events: bool,
    /// Where this process runs, for the tasks it reports running.
    pub(crate) place: Placement,
    /// How tasks reach the cluster: over gRPC when `None`.
    pub(crate) links: Option<Links>,
}

impl CoreWorker {
    /// Makes the core and starts its background tasks on `runtime`: the
    /// delivery of borrower changes, the deletion of freed objects and the
    /// watch over borrowers.
    pub(crate) fn start(
        settings: CoreSettings,
        submitter: SubmitterHandle,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let addresses = Addresses {
            address: settings.address,
            head_address: settings.head_address,
            node_manager: settings.node_manager,
        };
        let local_owners = settings
            .links
            .is_none()
            .then(|| Arc::new(LocalOwners::new(settings.token.clone())));
        let ctx = Arc::new(Context::new(
            addresses,
            settings.token,
            settings.binary,
            settings.log_to_driver,
            settings.links,
            runtime.clone(),
        ));
        // Both drained as they come, at most one message per object freed or
        // per reference borrowed or dropped.
        let (freed, freed_objects) = mpsc::unbounded_channel();
        let (changes, borrower_changes) = mpsc::unbounded_channel();
        let store = Arc::new(MemoryStore::new(freed, settings.owning_hook));
        let task_events = Arc::new(TaskEvents::new(settings.job, settings.task_events));
        let owner = Arc::new(Owner {
            ctx: ctx.clone(),
            store: store.clone(),
            borrows: Arc::new(Borrows::new(ctx.address.clone(), changes)),
            task_events: task_events.clone(),
            generators: Generators::new(store, ctx.address.clone(), task_events),
        });
        let shared_objects = Arc::new(SharedObjects::new(
            owner.clone(),
            settings.store_full_timeout,
            submitter.clone(),
        ));
        let core = Arc::new(CoreWorker {
            owner: owner.clone(),
            shared_objects: shared_objects.clone(),
            submitter,
            blocked_hook: settings.blocked_hook,
            actors: Arc::new(ActorClients::new(owner.clone())),
            placement_groups: GroupSession::default(),
            local_owners: local_owners.clone(),
        });
        runtime.spawn(crate::objects::borrows::send_changes(
            ctx.clone(),
            owner.borrows.clone(),
            borrower_changes,
            local_owners,
        ));
        runtime.spawn(crate::objects::shared_objects::delete_freed(
            shared_objects,
            freed_objects,
        ));
        runtime.spawn(crate::objects::borrower_watch::watch_borrowers(
            ctx.clone(),
            owner.store.clone(),
        ));
        runtime.spawn(crate::observability::task_events::keep_flushing(
            ctx,
            owner.task_events.clone(),
            settings.place,
        ));
        core
    }

    /// Where this process listens and how it reaches the cluster.
    pub(crate) fn ctx(&self) -> &Arc<Context> {
        &self.owner.ctx
    }

    /// An authenticated channel to `address`, reused across calls.
    pub(crate) async fn channel(&self, address: &str) -> Result<raylet_proto::channel::AuthedChannel> {
        self.ctx().channel(address).await
    }

    /// Waits for an object, owned or borrowed; `None` when `deadline` passed.
    pub(crate) async fn wait_outcome(
        &self,
        object: &AnyObjectRef,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<Outcome>> {
        if self.owner.owns(object) {
            return self.owner.store.wait(object.id(), deadline).await;
        }
        if let Some(outcome) = self.owner.borrows.lent_outcome(object.id()) {
            return Ok(Some(outcome));
        }
        loop {
            let now = tokio::time::Instant::now();
            let slice = deadline.map_or(FETCH_SLICE, |d| d.saturating_duration_since(now).min(FETCH_SLICE));
            if let Some(outcome) = self.fetch(object, slice).await? {
                return Ok(Some(outcome));
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Asks the object's owner for it. A call that failed on a cached
    /// connection is tried once more on a new one: the cached one may lead
    /// to a process that is gone.
    async fn fetch(&self, object: &AnyObjectRef, wait: Duration) -> Result<Option<Outcome>> {
        let cached = self.ctx().has_channel(object.owner_address());
        match self.fetch_once(object, wait).await {
            Err(Error::Task(_)) if cached => {
                self.ctx().forget_channel(object.owner_address());
                self.fetch_once(object, wait).await
            }
            other => other,
        }
    }

    async fn fetch_once(&self, object: &AnyObjectRef, wait: Duration) -> Result<Option<Outcome>> {
        let owner = object.owner_address();
        let channel = self.channel(owner).await.map_err(|e| owner_unreachable(object, e))?;
        let mut client = OwnerServiceClient::new(channel).max_decoding_message_size(MAX_DATA_MESSAGE);
        let request = GetObjectRequest {
            object_id: object.id().as_bytes().to_vec(),
            timeout_ms: wait.as_millis() as u64,
        };
        let reply = client
            .get_object(request)
            .await
            .map_err(|status| match from_status::<OwnerError>(status) {
                OwnerError::NotOwned(id) => Error::not_owned(id),
                OwnerError::ControlPlane(error) => owner_unreachable(object, error.into()),
            })?;
        Ok(reply.into_inner().outcome.map(|outcome| outcome_from_proto(outcome).0))
    }

    /// Blocks this thread until the object is there or `timeout` passes.
    /// A worker's task that waits lends its CPUs meanwhile.
    pub(crate) fn wait_outcome_blocking(
        self: &Arc<Self>,
        object: &AnyObjectRef,
        timeout: Option<Duration>,
    ) -> Result<Option<Outcome>> {
        let owned = self.owner.owns(object);
        let at_hand = match owned {
            true => self.owner.store.try_get(object.id())?,
            false => self.owner.borrows.lent_outcome(object.id()),
        };
        if let Some(outcome) = at_hand.or_else(|| self.finished_on_this_machine(object, owned)) {
            return Ok(Some(outcome));
        }
        let _blocked = BlockedGuard::new(self.blocked_hook.as_ref());
        if owned {
            let deadline = timeout.map(|t| Instant::now() + t);
            return self.owner.store.wait_blocking(object.id(), deadline);
        }
        let core = Arc::clone(self);
        let object = object.clone();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        self.block_on(async move { core.wait_outcome(&object, deadline).await })
    }

    /// A borrowed object's outcome, when its owner runs on this machine and
    /// has it finished: asked on this thread, without the runtime, and
    /// without telling the node that the task waits (it does not).
    fn finished_on_this_machine(&self, object: &AnyObjectRef, owned: bool) -> Option<Outcome> {
        if owned {
            return None;
        }
        let outcome = self
            .local_owners
            .as_ref()?
            .finished(object.owner_address(), object.id())?;
        Some(outcome_from_proto(outcome).0)
    }

    /// Blocks this thread until one of these owned objects is there; a
    /// worker's task that waits lends its CPUs meanwhile.
    pub(crate) fn wait_for_any(&self, ids: &[ObjectId]) {
        let _blocked = BlockedGuard::new(self.blocked_hook.as_ref());
        self.owner.store.wait_many_blocking(ids, 1, None);
    }

    /// Runs `future` on the cluster's runtime and blocks this thread for its
    /// output; see [`Context::block_on`].
    pub(crate) fn block_on<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        self.ctx().block_on(future)
    }
}

fn owner_unreachable(object: &AnyObjectRef, error: Error) -> Error {
    let message = format!(
        "the owner of object {} at {} is unreachable: {error}",
        object.id(),
        object.owner_address()
    );
    Error::Task(crate::task_error::TaskError::new(
        crate::task_error::TaskErrorKind::OwnerDied,
        "",
        message,
    ))
}

/// Tells the node that a task waits, and that it resumed when dropped.
struct BlockedGuard<'a> {
    hook: Option<&'a BlockedHook>,
}

impl<'a> BlockedGuard<'a> {
    fn new(hook: Option<&'a BlockedHook>) -> Self {
        if let Some(hook) = hook {
            hook(true);
        }
        BlockedGuard { hook }
    }
}

impl Drop for BlockedGuard<'_> {
    fn drop(&mut self) {
        if let Some(hook) = self.hook {
            hook(false);
        }
    }
}
