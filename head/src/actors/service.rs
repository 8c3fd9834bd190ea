//! The gRPC face of the head's actors: decode and validate, call the actor
//! table, start each new actor's life, encode.

use std::pin::Pin;
use std::sync::Arc;

use raylet_proto::peer_stream::{peer_of, peer_stream};
use raylet_proto::v1::actor_service_server::ActorService;
use raylet_proto::v1::{
    ActorDeathKind, ActorRecord, ActorState, ActorWatchEvent, CreateActorReply, CreateActorRequest,
    GetNamedActorRequest, KillActorReply, KillActorRequest, ListActorsReply, ListActorsRequest, OwnerSessionEvent,
    OwnerSessionMessage, WatchActorRequest,
};
use raylet_proto::{ActorId, IdSet};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::error::ActorError;
use super::lifecycle::{ActorRuntime, run_actor};
use super::table::{ActorSpec, KillOrder};
use crate::wire::bounded_text;

/// Records a watch stream holds for a caller that reads slower than the
/// actors change; past it, the actors' forwarders wait (each keeps only
/// its actor's latest record meanwhile).
const WATCH_EVENTS_BOUND: usize = 1024;

/// How long `KillActor` waits for the actor's process to be gone.
const KILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves [`ActorService`] over the head's actor runtime.
pub(crate) struct ActorServiceImpl {
    pub(crate) runtime: Arc<ActorRuntime>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<ActorWatchEvent, Status>> + Send>>;
type OwnerStream = Pin<Box<dyn Stream<Item = Result<OwnerSessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ActorService for ActorServiceImpl {
    type WatchActorsStream = WatchStream;
    type OwnerSessionStream = OwnerStream;

    /// Answers once the actor's record is on disk, and starts its life only
    /// then: a head restarted at any time after the answer knows the actor,
    /// and no worker runs an actor the head does not know. A creation asked
    /// for again is answered once the first one is on disk.
    async fn create_actor(&self, request: Request<CreateActorRequest>) -> Result<Response<CreateActorReply>, Status> {
        let spec = ActorSpec::from_request(request.into_inner())?;
        if self.runtime.table().contains(spec.id) {
            let flushed = self.runtime.table().flushed();
            flushed.await?;
            return Ok(Response::new(CreateActorReply {}));
        }
        let (spec, kill, stored) = {
            let mut table = self.runtime.table();
            let (spec, kill) = table.create(spec)?;
            (spec, kill, table.flushed())
        };
        if let Err(error) = stored.await {
            let cause = format!("its record could not be written: {error}");
            self.runtime
                .table()
                .dead(spec.id, ActorDeathKind::CreationFailed, &cause);
            return Err(error.into());
        }
        tokio::spawn(run_actor(self.runtime.clone(), spec, kill, None));
        Ok(Response::new(CreateActorReply {}))
    }

    async fn watch_actors(
        &self,
        request: Request<Streaming<WatchActorRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let follows = request.into_inner();
        let (events, receiver) = mpsc::channel(WATCH_EVENTS_BOUND);
        tokio::spawn(follow_requested(self.runtime.clone(), follows, events));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn get_named_actor(&self, request: Request<GetNamedActorRequest>) -> Result<Response<ActorRecord>, Status> {
        let request = request.into_inner();
        Ok(Response::new(
            self.runtime.table().named(&request.namespace, &request.name)?,
        ))
    }

    async fn kill_actor(&self, request: Request<KillActorRequest>) -> Result<Response<KillActorReply>, Status> {
        let request = request.into_inner();
        let id = ActorId::from_wire(&request.actor_id)?;
        let order = KillOrder {
            no_restart: request.no_restart,
            kind: ActorDeathKind::Killed,
            cause: "it was killed through cluster.kill".to_string(),
        };
        let mut watcher = self.runtime.table().watch(id)?;
        let pid = watcher.borrow_and_update().pid;
        self.runtime.table().kill(id, order)?;
        let gone = watcher.wait_for(|record| {
            matches!(record.state(), ActorState::Dead | ActorState::Restarting) || record.pid != pid
        });
        let _ = tokio::time::timeout(KILL_PATIENCE, gone).await;
        let flushed = self.runtime.table().flushed();
        flushed.await?;
        Ok(Response::new(KillActorReply {}))
    }

    async fn list_actors(&self, _request: Request<ListActorsRequest>) -> Result<Response<ListActorsReply>, Status> {
        Ok(Response::new(ListActorsReply {
            actors: self.runtime.table().list(),
        }))
    }

    async fn owner_session(
        &self,
        request: Request<Streaming<OwnerSessionMessage>>,
    ) -> Result<Response<OwnerStream>, Status> {
        let (events, receiver) = peer_stream("owner session events", peer_of(&request));
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or(ActorError::NoOwnerAddress)?;
        let owner = bounded_text("owner_address", first.owner_address)?;
        self.runtime.table().owner_joined(&owner);
        let runtime = self.runtime.clone();
        tokio::spawn(async move {
            let ended = async { while let Ok(Some(_)) = inbound.message().await {} };
            tokio::select! {
                () = ended => runtime.table().owner_left(&owner),
                () = runtime.stopped() => {}
            }
            drop(events);
        });
        Ok(Response::new(Box::pin(receiver)))
    }
}

type WatchEvents = mpsc::Sender<Result<ActorWatchEvent, Status>>;

/// Starts following each actor the caller names (once per stream), until
/// the caller stops asking or reading, or the head stops.
async fn follow_requested(runtime: Arc<ActorRuntime>, mut follows: Streaming<WatchActorRequest>, events: WatchEvents) {
    let mut followed = IdSet::default();
    loop {
        let request = tokio::select! {
            request = follows.message() => request,
            () = events.closed() => return,
            () = runtime.stopped() => return,
        };
        let Ok(Some(request)) = request else {
            return;
        };
        let id = ActorId::from_wire(&request.actor_id).map_err(ActorError::from);
        let watched = id.and_then(|id| match followed.insert(id) {
            true => runtime.table().watch(id).map(Some),
            false => Ok(None),
        });
        match watched {
            Ok(Some(watcher)) => {
                tokio::spawn(forward_records(runtime.clone(), watcher, events.clone()));
            }
            Ok(None) => {}
            Err(error) => {
                let event = ActorWatchEvent {
                    actor_id: request.actor_id,
                    record: None,
                    error: raylet_proto::Error::from(error).to_string(),
                };
                if !send_event(&runtime, &events, event).await {
                    return;
                }
            }
        }
    }
}

/// Sends one actor's record now and after every change, until it is dead.
async fn forward_records(runtime: Arc<ActorRuntime>, mut watcher: watch::Receiver<ActorRecord>, events: WatchEvents) {
    loop {
        let record = watcher.borrow_and_update().clone();
        let (actor_id, dead) = (record.actor_id.clone(), record.state() == ActorState::Dead);
        let event = ActorWatchEvent {
            actor_id: actor_id.clone(),
            record: Some(record),
            error: String::new(),
        };
        if !send_event(&runtime, &events, event).await || dead {
            return;
        }
        tokio::select! {
            changed = watcher.changed() => if changed.is_err() {
                let event = ActorWatchEvent {
                    actor_id,
                    record: None,
                    error: "the head no longer keeps the actor's record".into(),
                };
                send_event(&runtime, &events, event).await;
                return;
            },
            () = events.closed() => return,
            () = runtime.stopped() => return,
        }
    }
}

/// Sends `event` to the caller, waiting while its stream is full; false
/// once the caller or the head is gone.
async fn send_event(runtime: &ActorRuntime, events: &WatchEvents, event: ActorWatchEvent) -> bool {
    tokio::select! {
        sent = events.send(Ok(event)) => sent.is_ok(),
        () = runtime.stopped() => false,
    }
}
