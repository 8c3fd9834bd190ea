//! The caller side of actors. For each actor this process calls, one
//! client follows the actor's record at the head (through the process's
//! one watch stream, `watch.rs`), keeps one task stream to
//! the worker that hosts it, and sends calls in submission order. A call
//! made while none is in flight is written to the stream by the calling
//! thread itself; calls made behind others wait for a task that sends them
//! together. When the actor's process dies, calls in flight are sent again
//! to its next incarnation if their retries allow, and fail with
//! `ActorDied` otherwise; once the actor is dead every call fails, saying
//! why: those in flight with `ActorDied`, those never sent (queued, or made
//! after the death) with `ActorDiedBeforeSend`, so a caller knows which it
//! may send to another actor without running anything twice.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use raylet_proto::v1::actor_service_client::ActorServiceClient;
use raylet_proto::v1::{
    ActorDeathKind, ActorRecord, ActorState, OwnerSessionEvent, OwnerSessionMessage, TaskBatch, TaskKind, TaskSpec,
    WorkerEvents,
};
use raylet_proto::{ActorId, IdMap, NodeId, ObjectId, TaskId};
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::watch::ActorWatch;
use crate::context::Context;
use crate::links::head_retry::retrying;
use crate::links::{EventHandler, TaskOutlet};
use crate::objects::lent_objects::lend_contained;
use crate::objects::object_ref::handle::AnyObjectRef;
use crate::objects::owner::Owner;
use crate::observability::task_events::{Ending, Placement, TaskIdentity};
use crate::submitter::pending_gate::PendingPermit;
use crate::submitter::task::Arg;
use crate::submitter::{complete_values, print_log_lines, resolve_arg};
use crate::task_error::{TaskError, TaskErrorKind};
use crate::{Error, Result};

/// One call of an actor method, as its caller made it.
pub(crate) struct ActorCall {
    pub(crate) task_id: TaskId,
    pub(crate) method: &'static str,
    pub(crate) function: String,
    pub(crate) args: Vec<Arg>,
    /// Its place among the process's pending tasks, until it is done.
    pub(crate) permit: PendingPermit,
    pub(crate) num_returns: u32,
    /// Whether the method is a generator: its items stream back.
    pub(crate) generator: bool,
}

/// The actors this process calls, and its owner session with the head.
pub(crate) struct ActorClients {
    /// The objects the calls pass and return, with the process's context.
    pub(super) owner: Arc<Owner>,
    clients: Mutex<IdMap<ActorId, Arc<ActorClient>>>,
    owner_session: tokio::sync::Mutex<Option<OwnerSession>>,
    /// Set once the process ends its use of the cluster: the tasks that
    /// follow the head then stop, instead of waiting for a head that an
    /// embedded cluster's shutdown stops on purpose.
    closing: watch::Sender<bool>,
    /// The stream that follows the actors' records at the head.
    pub(super) watch: ActorWatch,
}

/// This process's owner session with the head, kept open (opened again
/// after a restart of the head) until `ended` is set.
struct OwnerSession {
    ended: Arc<AtomicBool>,
}

/// One open owner session: the head ends its actors when `messages` closes.
struct OpenOwnerSession {
    _messages: mpsc::UnboundedSender<OwnerSessionMessage>,
    events: tonic::Streaming<OwnerSessionEvent>,
}

impl ActorClients {
    pub(crate) fn new(owner: Arc<Owner>) -> Self {
        ActorClients {
            owner,
            clients: Mutex::default(),
            owner_session: tokio::sync::Mutex::default(),
            closing: watch::Sender::new(false),
            watch: ActorWatch::default(),
        }
    }

    /// Submits a call through the actor's client, starting it on first use.
    pub(crate) fn call(self: &Arc<Self>, actor: ActorId, max_task_retries: u32, call: ActorCall) {
        let client = self
            .clients()
            .entry(actor)
            .or_insert_with(|| ActorClient::start(self, actor, max_task_retries, Vec::new()))
            .clone();
        client.call(call);
    }

    /// Starts following an actor this process just created, holding
    /// `pinned` until the actor is dead.
    pub(crate) fn created(self: &Arc<Self>, actor: ActorId, max_task_retries: u32, pinned: Vec<AnyObjectRef>) {
        let client = ActorClient::start(self, actor, max_task_retries, pinned);
        self.clients().insert(actor, client);
    }

    fn clients(&self) -> MutexGuard<'_, IdMap<ActorId, Arc<ActorClient>>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops following the head: the actors' records and the owner
    /// session. Called when the process ends its use of the cluster, before
    /// an embedded head stops, so that its going away is not reported as an
    /// outage of the head.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Runs `work` on the process's runtime until it ends or the clients close.
    pub(super) fn spawn_until_closed(&self, work: impl Future<Output = ()> + Send + 'static) {
        let mut closing = self.closing.subscribe();
        self.owner.ctx.runtime.spawn(async move {
            tokio::select! {
                () = work => {}
                _ = closing.wait_for(|closed| *closed) => {}
            }
        });
    }

    /// Opens this process's owner session with the head, unless one is
    /// open: when it ends, with the process, the actors it owns that are
    /// not detached die. A session that a head restart broke is opened anew
    /// at once, so that the restarted head knows the owner lives; one that
    /// could not be opened again in time is opened here.
    pub(crate) async fn ensure_owner_session(self: &Arc<Self>) -> Result<()> {
        let mut session = self.owner_session.lock().await;
        if session.as_ref().is_some_and(|open| !open.ended.load(Ordering::Acquire)) {
            return Ok(());
        }
        let open = open_owner_session(&self.owner.ctx).await?;
        let ended = Arc::new(AtomicBool::new(false));
        self.spawn_until_closed(keep_owner_session(Arc::downgrade(self), open, ended.clone()));
        *session = Some(OwnerSession { ended });
        Ok(())
    }
}

async fn open_owner_session(ctx: &Context) -> Result<OpenOwnerSession> {
    let channel = ctx.channel(&ctx.head_address).await?;
    // Only the opening message is ever sent: the head ends the owner's
    // actors when this stream closes.
    let (messages, outbound) = mpsc::unbounded_channel();
    let _ = messages.send(OwnerSessionMessage {
        owner_address: ctx.address.to_string(),
    });
    let reply = ActorServiceClient::new(channel)
        .owner_session(UnboundedReceiverStream::new(outbound))
        .await;
    let events = reply.map_err(raylet_proto::Error::from)?.into_inner();
    Ok(OpenOwnerSession {
        _messages: messages,
        events,
    })
}

/// Holds the owner session open while the process lives, opening it again
/// when the head goes away and comes back; sets `ended` when the head
/// stayed away too long.
async fn keep_owner_session(clients: Weak<ActorClients>, mut open: OpenOwnerSession, ended: Arc<AtomicBool>) {
    loop {
        while let Ok(Some(_)) = open.events.message().await {}
        let Some(clients) = clients.upgrade() else {
            break;
        };
        match retrying(|| open_owner_session(&clients.owner.ctx)).await {
            Ok(reopened) => open = reopened,
            Err(error) => {
                tracing::warn!(%error, "the owner session with the head could not be opened again");
                break;
            }
        }
    }
    ended.store(true, Ordering::Release);
}

/// A call that has not finished.
struct PendingCall {
    task_id: TaskId,
    method: &'static str,
    function: String,
    /// Kept until the call is done: the objects they refer to stay alive.
    args: Vec<Arg>,
    /// Built once the arguments are resolved.
    spec: Option<TaskSpec>,
    attempts: u32,
    num_returns: u32,
    generator: bool,
    _permit: PendingPermit,
}

/// The objects a call of `task_id` returns.
fn return_ids(task_id: TaskId, num_returns: u32) -> impl Iterator<Item = ObjectId> {
    (0..u64::from(num_returns)).map(move |index| task_id.object_at(index))
}

impl PendingCall {
    fn return_ids(&self) -> impl Iterator<Item = ObjectId> + use<> {
        return_ids(self.task_id, self.num_returns)
    }

    fn identity(&self, actor: ActorId) -> TaskIdentity<'_> {
        TaskIdentity {
            task_id: self.task_id,
            attempt: self.attempts,
            function: &self.function,
            kind: TaskKind::ActorTask,
            actor_id: Some(actor),
        }
    }

    /// Reports that this attempt failed without a result from the actor.
    fn record_failure(&self, owner: &Owner, reason: &str) {
        owner
            .task_events
            .ended(self.task_id, self.attempts, Ending::failed(reason));
    }
}

/// The stream to the worker of one incarnation of the actor.
struct Connection {
    id: u64,
    record_version: u64,
    /// `None` while the stream opens.
    tasks: Option<Arc<dyn TaskOutlet>>,
    /// The incarnation's process.
    place: Placement,
}

/// The caller side of one actor.
pub(crate) struct ActorClient {
    owner: Arc<Owner>,
    actor: ActorId,
    max_task_retries: u32,
    state: Mutex<ClientState>,
    /// Wakes the task that sends calls queued behind others.
    send_queued: Arc<Notify>,
}

#[derive(Default)]
struct ClientState {
    connection: Option<Connection>,
    next_connection: u64,
    /// Calls not sent yet, in submission order.
    queue: VecDeque<PendingCall>,
    /// Calls sent to the current incarnation, in the order sent.
    in_flight: VecDeque<PendingCall>,
    /// Why every call fails, once the actor is dead for good.
    dead: Option<TaskError>,
    /// The constructor's arguments, kept while the actor may restart.
    creation_pins: Vec<AnyObjectRef>,
}

impl ActorClient {
    fn start(
        clients: &Arc<ActorClients>,
        actor: ActorId,
        max_task_retries: u32,
        pinned: Vec<AnyObjectRef>,
    ) -> Arc<Self> {
        let send_queued = Arc::new(Notify::new());
        let client = Arc::new(ActorClient {
            owner: clients.owner.clone(),
            actor,
            max_task_retries,
            state: Mutex::new(ClientState {
                creation_pins: pinned,
                ..ClientState::default()
            }),
            send_queued: send_queued.clone(),
        });
        clients.watch.follow(clients, client.clone());
        clients
            .owner
            .ctx
            .runtime
            .spawn(send_when_told(Arc::downgrade(&client), send_queued));
        client
    }

    fn state(&self) -> MutexGuard<'_, ClientState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn call(self: &Arc<Self>, call: ActorCall) {
        let mut state = self.state();
        if let Some(error) = &state.dead {
            let error = TaskError {
                function: call.function.clone(),
                ..error.clone()
            };
            self.owner.fail_all(return_ids(call.task_id, call.num_returns), error);
            return;
        }
        let call = PendingCall {
            task_id: call.task_id,
            method: call.method,
            function: call.function,
            args: call.args,
            spec: None,
            attempts: 0,
            num_returns: call.num_returns,
            generator: call.generator,
            _permit: call.permit,
        };
        self.owner.task_events.submitted(call.identity(self.actor), false);
        state.queue.push_back(call);
        let index = state.queue.len() - 1;
        self.build_spec(&mut state, index);
        match state.in_flight.is_empty() {
            true => self.send_ready(&mut state),
            false => self.send_queued.notify_one(),
        }
    }

    /// Builds the spec of a queued call if its arguments are ready, or
    /// waits for the pending objects they refer to.
    fn build_spec(self: &Arc<Self>, state: &mut ClientState, index: usize) {
        let call = &mut state.queue[index];
        let mut args = Vec::with_capacity(call.args.len());
        let mut waiting = Vec::new();
        for arg in &call.args {
            match resolve_arg(&self.owner, arg) {
                Ok(Some(resolved)) => args.push(resolved),
                Ok(None) => waiting.extend(match arg {
                    Arg::Ref(object) => Some(object.id()),
                    Arg::Value { .. } => None,
                }),
                Err(error) => {
                    let failed = state.queue.remove(index).expect("the call is queued");
                    failed.record_failure(&self.owner, &error.to_string());
                    self.owner.fail_all(failed.return_ids(), error);
                    return;
                }
            }
        }
        if !waiting.is_empty() {
            let (client, task_id) = (self.clone(), call.task_id);
            self.owner.ctx.runtime.spawn(async move {
                for id in waiting {
                    let _ = client.owner.store.wait(id, None).await;
                }
                client.args_ready(task_id);
            });
            return;
        }
        call.spec = Some(TaskSpec {
            task_id: call.task_id.as_bytes().to_vec(),
            function: call.function.clone(),
            binary_hash: self.owner.ctx.binary.hash.clone(),
            args,
            attempt: 0,
            owner_address: self.owner.ctx.address.to_string(),
            actor_id: self.actor.as_bytes().to_vec(),
            actor_creation: None,
            method: call.method.to_string(),
            job_id: self.owner.task_events.job().as_bytes().to_vec(),
            timeline: crate::observability::timeline::is_on(),
            lent: lend_contained(&self.owner, &call.args),
            num_returns: call.num_returns,
            generator: None,
        });
    }

    /// The pending objects a call's arguments refer to are ready.
    fn args_ready(self: &Arc<Self>, task_id: TaskId) {
        let mut state = self.state();
        if let Some(index) = state.queue.iter().position(|call| call.task_id == task_id) {
            self.build_spec(&mut state, index);
            self.send_ready(&mut state);
        }
    }

    /// Sends the calls at the front of the queue whose arguments are ready,
    /// in one frame, while the actor is alive and its stream open.
    fn send_ready(&self, state: &mut ClientState) {
        let Some(connection) = state.connection.as_ref() else {
            return;
        };
        let Some(tasks) = connection.tasks.as_ref() else {
            return;
        };
        let mut batch = TaskBatch::default();
        while state.queue.front().is_some_and(|call| call.spec.is_some()) {
            let mut call = state.queue.pop_front().expect("the front call exists");
            let retryable = call.attempts < self.max_task_retries;
            let spec = call.spec.as_mut().expect("checked above");
            spec.attempt = call.attempts;
            if call.generator {
                let Some(generator) = self.owner.generators.call_for(call.task_id) else {
                    self.stream_dropped(&call);
                    continue;
                };
                spec.generator = Some(generator);
                let outlet = tasks.clone();
                let sink = Arc::new(move |batch| drop(outlet.send(&batch)));
                self.owner.generators.dispatched(call.task_id, sink);
            }
            self.owner
                .task_events
                .dispatched(call.task_id, call.attempts, &connection.place);
            batch.tasks.push(match retryable {
                true => spec.clone(),
                false => call.spec.take().expect("checked above"),
            });
            state.in_flight.push_back(call);
        }
        if !batch.tasks.is_empty() {
            let _ = tasks.send(&batch);
            raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerWrote);
        }
    }

    /// A generator call whose caller dropped or cancelled its stream before
    /// it was sent is not sent: it ends cancelled.
    fn stream_dropped(&self, call: &PendingCall) {
        let message = "its caller dropped or cancelled the stream before the call was sent";
        let error = TaskError::new(TaskErrorKind::Cancelled, &call.function, message);
        call.record_failure(&self.owner, message);
        self.owner.fail_all(call.return_ids(), error);
    }

    pub(super) fn actor(&self) -> ActorId {
        self.actor
    }

    pub(super) fn on_record(self: &Arc<Self>, record: ActorRecord) {
        let mut state = self.state();
        match record.state() {
            ActorState::Alive
                if state
                    .connection
                    .as_ref()
                    .is_none_or(|c| c.record_version != record.version) =>
            {
                self.incarnation_ended(&mut state, &record.death_cause);
                self.connect(&mut state, &record);
            }
            ActorState::Restarting => {
                state.connection = None;
                self.incarnation_ended(&mut state, &record.death_cause);
            }
            ActorState::Dead => {
                let kind = match record.death_kind() {
                    ActorDeathKind::CreationFailed => TaskErrorKind::ActorCreationFailed,
                    _ => TaskErrorKind::ActorDied,
                };
                self.die(&mut state, kind, record.death_cause);
            }
            _ => {}
        }
    }

    /// The incarnation the calls in flight went to is gone: each is sent
    /// again if its retries allow, and fails otherwise.
    fn incarnation_ended(&self, state: &mut ClientState, cause: &str) {
        let mut retried = VecDeque::new();
        for mut call in state.in_flight.drain(..) {
            call.record_failure(&self.owner, &format!("the actor's process died: {cause}"));
            if call.attempts < self.max_task_retries {
                call.attempts += 1;
                self.owner.task_events.submitted(call.identity(self.actor), false);
                retried.push_back(call);
                continue;
            }
            let message = format!("the actor's process died while this call ran: {cause}");
            let error = TaskError::new(TaskErrorKind::ActorDied, &call.function, message);
            self.owner.fail_all(call.return_ids(), error);
        }
        while let Some(call) = retried.pop_back() {
            state.queue.push_front(call);
        }
    }

    /// The actor is dead for good: every call fails with `kind` and
    /// `cause`; a call never sent with `ActorDiedBeforeSend` instead (unless
    /// the constructor failed, which every call reports).
    fn die(&self, state: &mut ClientState, kind: TaskErrorKind, cause: String) {
        state.connection = None;
        let sent = TaskError::new(kind, "", cause);
        let unsent = match kind {
            TaskErrorKind::ActorCreationFailed => sent.clone(),
            _ => TaskError {
                kind: TaskErrorKind::ActorDiedBeforeSend,
                ..sent.clone()
            },
        };
        let in_flight = state.in_flight.drain(..).map(|call| (call, &sent));
        for (call, error) in in_flight.chain(state.queue.drain(..).map(|call| (call, &unsent))) {
            let error = TaskError {
                function: call.function.clone(),
                ..error.clone()
            };
            call.record_failure(&self.owner, &error.to_string());
            self.owner.fail_all(call.return_ids(), error);
        }
        state.dead = Some(unsent);
        state.creation_pins.clear();
    }

    /// Opens the task stream to the worker of the incarnation in `record`;
    /// calls wait in the queue until it is open.
    fn connect(self: &Arc<Self>, state: &mut ClientState, record: &ActorRecord) {
        let id = state.next_connection;
        state.next_connection += 1;
        let (address, pid) = (record.address.clone(), record.pid);
        let node_id = NodeId::from_wire(&record.node_id).ok();
        state.connection = Some(Connection {
            id,
            record_version: record.version,
            tasks: None,
            place: Placement {
                node_id,
                worker_id: None,
                pid,
            },
        });
        let client = self.clone();
        let reader = self.clone();
        let handler: EventHandler = Box::new(move |batch| match batch {
            Ok(Some(batch)) => {
                raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerRead);
                if reader.owner.ctx.log_to_driver {
                    print_log_lines(pid, node_id, &batch.logs);
                }
                reader.on_results(id, batch);
            }
            ended => reader.stream_ended(id, ended.err().map(Error::from)),
        });
        self.owner.ctx.runtime.spawn(async move {
            match client.owner.ctx.links.workers.task_stream(address, handler).await {
                Ok(tasks) => client.stream_opened(id, tasks),
                Err(error) => client.stream_ended(id, Some(error)),
            }
        });
    }

    /// The stream of connection `connection` ended, or did not open: the
    /// actor's record says what comes next.
    fn stream_ended(&self, connection: u64, error: Option<Error>) {
        if let Some(error) = error {
            tracing::debug!(actor = %self.actor, %error, "an actor's task stream ended");
        }
        let mut state = self.state();
        if state.connection.as_ref().is_some_and(|c| c.id == connection) {
            state.connection = None;
        }
    }

    fn stream_opened(&self, connection: u64, tasks: Box<dyn TaskOutlet>) {
        let mut state = self.state();
        if let Some(current) = state.connection.as_mut().filter(|c| c.id == connection) {
            current.tasks = Some(Arc::from(tasks));
            self.send_ready(&mut state);
        }
    }

    fn on_results(&self, connection: u64, events: WorkerEvents) {
        let mut state = self.state();
        if state.connection.as_ref().is_none_or(|c| c.id != connection) {
            return;
        }
        self.owner.absorb_items(events.items);
        let finished = complete_values(&self.owner, events.results);
        raylet_common::hop_probe::mark(raylet_common::hop_probe::Hop::CallerStored);
        for finished in finished {
            let Some(index) = state.in_flight.iter().position(|call| call.task_id == finished.task_id) else {
                continue;
            };
            let call = state.in_flight.remove(index).expect("the index is in range");
            if let Err(error) = finished.outcome {
                self.owner.fail_all(call.return_ids(), error);
            }
        }
        self.send_ready(&mut state);
    }

    /// The head stopped answering about the actor.
    pub(super) fn records_ended(&self, why: String) {
        let mut state = self.state();
        if state.dead.is_none() {
            self.die(
                &mut state,
                TaskErrorKind::ActorDied,
                format!("the actor's state is unknown: {why}"),
            );
        }
    }
}

/// Sends the calls queued behind others each time a caller asks, until the
/// client is gone.
async fn send_when_told(client: Weak<ActorClient>, told: Arc<Notify>) {
    loop {
        told.notified().await;
        let Some(client) = client.upgrade() else {
            return;
        };
        client.send_ready(&mut client.state());
    }
}
