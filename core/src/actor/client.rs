//! The caller side of actors. For each actor this process calls, one task
//! follows the actor's record at the head, keeps one call stream to the
//! worker that hosts it, and sends calls in submission order. When the
//! actor's process dies, calls in flight are sent again to its next
//! incarnation if their retries allow, and fail with `ActorDied` otherwise;
//! once the actor is dead every call fails, saying why.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use raylet_proto::v1::actor_service_client::ActorServiceClient;
use raylet_proto::v1::{
    ActorDeathKind, ActorRecord, ActorState, OwnerSessionMessage, TaskBatch, TaskSpec, WatchActorRequest, WorkerEvents,
};
use raylet_proto::{ActorId, IdMap, NodeId, ObjectId, TaskId};
use tokio::sync::{OnceCell, mpsc};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::core_worker::CoreWorker;
use crate::object_ref::AnyObjectRef;
use crate::submitter::{complete_values, open_task_stream, print_log_lines, resolve_arg};
use crate::task::{Arg, TaskError, TaskErrorKind};
use crate::{Error, Result};

/// One call of an actor method, as its caller made it.
pub(crate) struct ActorCall {
    pub(crate) task_id: TaskId,
    pub(crate) method: &'static str,
    pub(crate) function: String,
    pub(crate) args: Vec<Arg>,
}

/// The actors this process calls, and its owner session with the head.
#[derive(Default)]
pub(crate) struct ActorClients {
    clients: Mutex<IdMap<ActorId, mpsc::UnboundedSender<ClientEvent>>>,
    owner_session: OnceCell<mpsc::UnboundedSender<OwnerSessionMessage>>,
}

impl ActorClients {
    /// Sends a call to the actor's client task, starting it on first use.
    pub(crate) fn call(&self, core: &Arc<CoreWorker>, actor: ActorId, max_task_retries: u32, call: ActorCall) {
        let event = ClientEvent::Call(Box::new(call));
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let client = clients
            .entry(actor)
            .or_insert_with(|| spawn_client(core, actor, max_task_retries, Vec::new()));
        if let Err(mpsc::error::SendError(event)) = client.send(event) {
            let fresh = spawn_client(core, actor, max_task_retries, Vec::new());
            let _ = fresh.send(event);
            *client = fresh;
        }
    }

    /// Starts following an actor this process just created, holding
    /// `pinned` until the actor is dead.
    pub(crate) fn created(
        &self,
        core: &Arc<CoreWorker>,
        actor: ActorId,
        max_task_retries: u32,
        pinned: Vec<AnyObjectRef>,
    ) {
        let client = spawn_client(core, actor, max_task_retries, pinned);
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(actor, client);
    }

    /// Opens this process's owner session with the head once: when it
    /// ends, with the process, the actors it owns that are not detached die.
    pub(crate) async fn ensure_owner_session(&self, core: &CoreWorker) -> Result<()> {
        self.owner_session
            .get_or_try_init(|| async {
                let channel = core.channel(&core.head_address).await?;
                let (messages, outbound) = mpsc::unbounded_channel();
                let _ = messages.send(OwnerSessionMessage {
                    owner_address: core.address.to_string(),
                });
                let reply = ActorServiceClient::new(channel)
                    .owner_session(UnboundedReceiverStream::new(outbound))
                    .await;
                let mut events = reply.map_err(raylet_proto::Error::from)?.into_inner();
                tokio::spawn(async move { while let Ok(Some(_)) = events.message().await {} });
                Ok::<_, Error>(messages)
            })
            .await?;
        Ok(())
    }
}

enum ClientEvent {
    Call(Box<ActorCall>),
    /// The pending objects this call's arguments refer to are ready.
    ArgsReady(TaskId),
    Record(ActorRecord),
    /// The head stopped answering about the actor.
    RecordsEnded(String),
    Results {
        connection: u64,
        events: WorkerEvents,
    },
    ConnectionClosed(u64),
}

/// Events handled at most before the calls they made ready are sent.
const MAX_EVENTS_PER_SEND: usize = 256;

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
}

impl PendingCall {
    fn return_id(&self) -> ObjectId {
        self.task_id.return_object()
    }
}

/// The stream to the worker of one incarnation of the actor.
struct Connection {
    id: u64,
    record_version: u64,
    tasks: mpsc::UnboundedSender<TaskBatch>,
}

struct ActorClient {
    core: Arc<CoreWorker>,
    actor: ActorId,
    max_task_retries: u32,
    events: mpsc::UnboundedSender<ClientEvent>,
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

fn spawn_client(
    core: &Arc<CoreWorker>,
    actor: ActorId,
    max_task_retries: u32,
    pinned: Vec<AnyObjectRef>,
) -> mpsc::UnboundedSender<ClientEvent> {
    let (events, inbound) = mpsc::unbounded_channel();
    let client = ActorClient {
        core: core.clone(),
        actor,
        max_task_retries,
        events: events.clone(),
        connection: None,
        next_connection: 1,
        queue: VecDeque::new(),
        in_flight: VecDeque::new(),
        dead: None,
        creation_pins: pinned,
    };
    core.runtime.spawn(follow_records(core.clone(), actor, events.clone()));
    core.runtime.spawn(client.run(inbound));
    events
}

/// Streams the actor's records from the head into the client.
async fn follow_records(core: Arc<CoreWorker>, actor: ActorId, events: mpsc::UnboundedSender<ClientEvent>) {
    let followed = async {
        let channel = core.channel(&core.head_address).await?;
        let request = WatchActorRequest {
            actor_id: actor.as_bytes().to_vec(),
        };
        let reply = ActorServiceClient::new(channel).watch_actor(request).await;
        let mut records = reply.map_err(raylet_proto::Error::from)?.into_inner();
        while let Some(record) = records.message().await.map_err(raylet_proto::Error::from)? {
            let dead = record.state() == ActorState::Dead;
            if events.send(ClientEvent::Record(record)).is_err() || dead {
                return Ok(());
            }
        }
        Ok::<_, Error>(())
    };
    let ended = match followed.await {
        Ok(()) => "the head stopped reporting on it".to_string(),
        Err(error) => format!("the head cannot report on it ({error})"),
    };
    let _ = events.send(ClientEvent::RecordsEnded(ended));
}

impl ActorClient {
    /// Handles events as they come; the calls they make ready go out
    /// together, once no more events wait (or after a bounded number).
    async fn run(mut self, mut inbound: mpsc::UnboundedReceiver<ClientEvent>) {
        while let Some(event) = inbound.recv().await {
            self.handle(event);
            for _ in 1..MAX_EVENTS_PER_SEND {
                let Ok(event) = inbound.try_recv() else {
                    break;
                };
                self.handle(event);
            }
            self.send_ready();
        }
    }

    fn handle(&mut self, event: ClientEvent) {
        match event {
            ClientEvent::Call(call) => self.submit(*call),
            ClientEvent::ArgsReady(task_id) => self.resolve(task_id),
            ClientEvent::Record(record) => self.on_record(record),
            ClientEvent::RecordsEnded(why) => {
                if self.dead.is_none() {
                    self.die(TaskErrorKind::ActorDied, format!("the actor's state is unknown: {why}"));
                }
            }
            ClientEvent::Results { connection, events } => self.on_results(connection, events),
            ClientEvent::ConnectionClosed(connection) => {
                if self.connection.as_ref().is_some_and(|c| c.id == connection) {
                    self.connection = None;
                }
            }
        }
    }

    fn submit(&mut self, call: ActorCall) {
        if let Some(error) = &self.dead {
            let error = TaskError {
                function: call.function.clone(),
                ..error.clone()
            };
            self.core.store.complete(call.task_id.return_object(), Err(error));
            return;
        }
        let pending = PendingCall {
            task_id: call.task_id,
            method: call.method,
            function: call.function,
            args: call.args,
            spec: None,
            attempts: 0,
        };
        self.queue.push_back(pending);
        self.build_spec(self.queue.len() - 1);
    }

    /// Builds the spec of a queued call if its arguments are ready, or
    /// waits for the pending objects they refer to.
    fn build_spec(&mut self, index: usize) {
        let core = self.core.clone();
        let call = &mut self.queue[index];
        let mut args = Vec::with_capacity(call.args.len());
        let mut waiting = Vec::new();
        for arg in &call.args {
            match resolve_arg(&core, arg) {
                Ok(Some(resolved)) => args.push(resolved),
                Ok(None) => waiting.extend(match arg {
                    Arg::Ref(object) => Some(object.id()),
                    Arg::Value { .. } => None,
                }),
                Err(error) => {
                    let failed = self.queue.remove(index).expect("the call is queued");
                    self.core.store.complete(failed.return_id(), Err(error));
                    return;
                }
            }
        }
        if !waiting.is_empty() {
            let (store, events, task_id) = (core.store.clone(), self.events.clone(), call.task_id);
            tokio::spawn(async move {
                for id in waiting {
                    let _ = store.wait(id, None).await;
                }
                let _ = events.send(ClientEvent::ArgsReady(task_id));
            });
            return;
        }
        call.spec = Some(TaskSpec {
            task_id: call.task_id.as_bytes().to_vec(),
            function: call.function.clone(),
            binary_hash: core.binary.hash.clone(),
            args,
            attempt: 0,
            owner_address: core.address.to_string(),
            actor_id: self.actor.as_bytes().to_vec(),
            actor_creation: None,
            method: call.method.to_string(),
        });
    }

    fn resolve(&mut self, task_id: TaskId) {
        if let Some(index) = self.queue.iter().position(|call| call.task_id == task_id) {
            self.build_spec(index);
        }
    }

    /// Sends the calls at the front of the queue whose arguments are ready,
    /// while the actor is alive and connected.
    fn send_ready(&mut self) {
        let Some(connection) = &self.connection else {
            return;
        };
        let mut batch = TaskBatch::default();
        while self.queue.front().is_some_and(|call| call.spec.is_some()) {
            let mut call = self.queue.pop_front().expect("the front call exists");
            let retryable = call.attempts < self.max_task_retries;
            let spec = call.spec.as_mut().expect("checked above");
            spec.attempt = call.attempts;
            batch.tasks.push(match retryable {
                true => spec.clone(),
                false => call.spec.take().expect("checked above"),
            });
            self.in_flight.push_back(call);
        }
        if !batch.tasks.is_empty() {
            let _ = connection.tasks.send(batch);
        }
    }

    fn on_record(&mut self, record: ActorRecord) {
        match record.state() {
            ActorState::Alive
                if self
                    .connection
                    .as_ref()
                    .is_none_or(|c| c.record_version != record.version) =>
            {
                self.incarnation_ended(&record.death_cause);
                self.connect(&record);
            }
            ActorState::Restarting => {
                self.connection = None;
                self.incarnation_ended(&record.death_cause);
            }
            ActorState::Dead => {
                let kind = match record.death_kind() {
                    ActorDeathKind::CreationFailed => TaskErrorKind::ActorCreationFailed,
                    _ => TaskErrorKind::ActorDied,
                };
                self.die(kind, record.death_cause);
            }
            _ => {}
        }
    }

    /// The incarnation the calls in flight went to is gone: each is sent
    /// again if its retries allow, and fails otherwise.
    fn incarnation_ended(&mut self, cause: &str) {
        let mut retried = VecDeque::new();
        for mut call in self.in_flight.drain(..) {
            if call.attempts < self.max_task_retries {
                call.attempts += 1;
                retried.push_back(call);
                continue;
            }
            let message = format!("the actor's process died while this call ran: {cause}");
            let error = TaskError::new(TaskErrorKind::ActorDied, &call.function, message);
            self.core.store.complete(call.return_id(), Err(error));
        }
        while let Some(call) = retried.pop_back() {
            self.queue.push_front(call);
        }
    }

    /// The actor is dead for good: every call fails with `kind` and `cause`.
    fn die(&mut self, kind: TaskErrorKind, cause: String) {
        self.connection = None;
        let error = TaskError::new(kind, "", cause);
        for call in self.in_flight.drain(..).chain(self.queue.drain(..)) {
            let error = TaskError {
                function: call.function.clone(),
                ..error.clone()
            };
            self.core.store.complete(call.return_id(), Err(error));
        }
        self.dead = Some(error);
        self.creation_pins.clear();
    }

    /// Opens the call stream to the worker of the incarnation in `record`.
    fn connect(&mut self, record: &ActorRecord) {
        let id = self.next_connection;
        self.next_connection += 1;
        let (tasks, outbound) = mpsc::unbounded_channel();
        self.connection = Some(Connection {
            id,
            record_version: record.version,
            tasks,
        });
        let (address, pid) = (record.address.clone(), record.pid);
        let node_id = NodeId::from_wire(&record.node_id).ok();
        let (core, events) = (self.core.clone(), self.events.clone());
        let log_to_driver = core.log_to_driver;
        tokio::spawn(async move {
            let streamed = async {
                let mut inbound = open_task_stream(&core, &address, outbound).await?;
                while let Some(batch) = inbound.message().await? {
                    if log_to_driver {
                        print_log_lines(pid, node_id, &batch.logs);
                    }
                    if events
                        .send(ClientEvent::Results {
                            connection: id,
                            events: batch,
                        })
                        .is_err()
                    {
                        break;
                    }
                }
                Ok::<_, Error>(())
            };
            if let Err(error) = streamed.await {
                tracing::debug!(%address, %error, "an actor's call stream ended");
            }
            let _ = events.send(ClientEvent::ConnectionClosed(id));
        });
    }

    fn on_results(&mut self, connection: u64, events: WorkerEvents) {
        if self.connection.as_ref().is_none_or(|c| c.id != connection) {
            return;
        }
        for finished in complete_values(&self.core, events.results) {
            let Some(index) = self.in_flight.iter().position(|call| call.task_id == finished.task_id) else {
                continue;
            };
            let call = self.in_flight.remove(index).expect("the index is in range");
            if let Err(error) = finished.outcome {
                self.core.store.complete(call.return_id(), Err(error));
            }
        }
    }
}
