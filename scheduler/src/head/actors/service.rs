//! The gRPC face of the head's actors: decode and validate, call the actor
//! table, start each new actor's life, encode.

use std::pin::Pin;
use std::sync::Arc;

use raylet_proto::v1::actor_service_server::ActorService;
use raylet_proto::v1::{
    ActorDeathKind, ActorRecord, ActorState, CreateActorReply, CreateActorRequest, GetNamedActorRequest,
    KillActorReply, KillActorRequest, ListActorsReply, ListActorsRequest, OwnerSessionEvent, OwnerSessionMessage,
    WatchActorRequest,
};
use raylet_proto::{ActorId, Error};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::lifecycle::{ActorRuntime, run_actor};
use super::table::{ActorSpec, KillOrder};
use crate::head::service::bounded_text;

/// How long `KillActor` waits for the actor's process to be gone.
const KILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves [`ActorService`] over the head's actor runtime.
pub(crate) struct ActorServiceImpl {
    pub(crate) runtime: Arc<ActorRuntime>,
}

type RecordStream = Pin<Box<dyn Stream<Item = Result<ActorRecord, Status>> + Send>>;
type OwnerStream = Pin<Box<dyn Stream<Item = Result<OwnerSessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ActorService for ActorServiceImpl {
    type WatchActorStream = RecordStream;
    type OwnerSessionStream = OwnerStream;

    async fn create_actor(&self, request: Request<CreateActorRequest>) -> Result<Response<CreateActorReply>, Status> {
        let spec = ActorSpec::from_request(request.into_inner())?;
        if !self.runtime.table().contains(spec.id) {
            let (spec, kill) = self.runtime.table().create(spec)?;
            tokio::spawn(run_actor(self.runtime.clone(), spec, kill, None));
        }
        let flushed = self.runtime.table().flushed();
        flushed.await;
        Ok(Response::new(CreateActorReply {}))
    }

    async fn watch_actor(&self, request: Request<WatchActorRequest>) -> Result<Response<RecordStream>, Status> {
        let id = ActorId::from_wire(&request.into_inner().actor_id)?;
        let mut watcher = self.runtime.table().watch(id)?;
        let (records, receiver) = mpsc::unbounded_channel();
        let runtime = self.runtime.clone();
        tokio::spawn(async move {
            loop {
                let record = watcher.borrow_and_update().clone();
                let dead = record.state() == ActorState::Dead;
                if records.send(Ok(record)).is_err() || dead {
                    return;
                }
                tokio::select! {
                    changed = watcher.changed() => if changed.is_err() { return },
                    () = records.closed() => return,
                    () = runtime.stopped() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(receiver))))
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
        flushed.await;
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
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Error::InvalidArgument("an owner session must start with the owner's address".into()))?;
        let owner = bounded_text("owner_address", first.owner_address)?;
        self.runtime.table().owner_joined(&owner);
        let runtime = self.runtime.clone();
        let (events, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let ended = async { while let Ok(Some(_)) = inbound.message().await {} };
            tokio::select! {
                () = ended => runtime.table().owner_left(&owner),
                () = runtime.stopped() => {}
            }
            drop(events);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(receiver))))
    }
}
