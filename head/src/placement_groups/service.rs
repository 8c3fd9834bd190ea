//! The gRPC face of the head's placement groups: decode and validate, call
//! the group manager, encode. Creates and removes come as messages on a
//! process's session stream, each handled in its own task.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use raylet_proto::peer_stream::{PeerSender, peer_of, peer_stream};
use raylet_proto::placement_group::check_bundles;
use raylet_proto::v1::placement_group_answer::Kind as AnswerKind;
use raylet_proto::v1::placement_group_call::Kind as CallKind;
use raylet_proto::v1::placement_group_service_server::PlacementGroupService;
use raylet_proto::v1::{
    CreatePlacementGroupRequest, ListPlacementGroupsReply, ListPlacementGroupsRequest, PlacementGroupAnswer,
    PlacementGroupCall, PlacementGroupRecord, WaitPlacementGroupRequest,
};
use raylet_proto::{PlacementGroupId, PlacementStrategy, ResourceSet};
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::error::PlacementGroupError;
use super::manager::GroupManager;
use super::node_calls::NodeManagerBundles;
use super::table::GroupSpec;
use crate::wire::bounded_text;

type Result<T, E = PlacementGroupError> = std::result::Result<T, E>;

/// The longest a `WaitPlacementGroup` call waits.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// The most bundles one group may have.
const MAX_BUNDLES: usize = 10_000;

type AnswerStream = Pin<Box<dyn Stream<Item = Result<PlacementGroupAnswer, Status>> + Send>>;

/// Serves [`PlacementGroupService`] over the head's group manager.
pub(crate) struct PlacementGroupServiceImpl {
    pub(crate) groups: Arc<GroupManager<NodeManagerBundles>>,
    /// Turns true when the head stops: open sessions end then.
    pub(crate) stopping: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl PlacementGroupService for PlacementGroupServiceImpl {
    type PlacementGroupSessionStream = AnswerStream;

    async fn placement_group_session(
        &self,
        request: Request<Streaming<PlacementGroupCall>>,
    ) -> Result<Response<AnswerStream>, Status> {
        let (answers, receiver) = peer_stream("placement group answers", peer_of(&request));
        let mut calls = request.into_inner();
        let groups = self.groups.clone();
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let serve = async {
                while let Ok(Some(call)) = calls.message().await {
                    tokio::spawn(answer_call(groups.clone(), call, answers.clone()));
                }
            };
            tokio::select! {
                () = serve => {}
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
        });
        Ok(Response::new(Box::pin(receiver)))
    }

    async fn wait_placement_group(
        &self,
        request: Request<WaitPlacementGroupRequest>,
    ) -> Result<Response<PlacementGroupRecord>, Status> {
        let request = request.into_inner();
        let id = PlacementGroupId::from_wire(&request.placement_group_id)?;
        let timeout = Duration::from_millis(request.timeout_ms).min(MAX_WAIT);
        let record = self.groups.wait(id, timeout).await?;
        Ok(Response::new(record.to_proto()))
    }

    async fn list_placement_groups(
        &self,
        _request: Request<ListPlacementGroupsRequest>,
    ) -> Result<Response<ListPlacementGroupsReply>, Status> {
        let placement_groups = self.groups.records().iter().map(|record| record.to_proto()).collect();
        Ok(Response::new(ListPlacementGroupsReply { placement_groups }))
    }
}

/// Runs one call of a session and sends its answer.
async fn answer_call(
    groups: Arc<GroupManager<NodeManagerBundles>>,
    call: PlacementGroupCall,
    answers: PeerSender<PlacementGroupAnswer>,
) {
    let outcome = match call.kind {
        Some(CallKind::Create(request)) => create(&groups, request).await,
        Some(CallKind::Remove(request)) => remove(&groups, &request.placement_group_id).await,
        None => Err(PlacementGroupError::NoOperation { call_id: call.call_id }),
    };
    let kind = match outcome {
        Ok(record) => AnswerKind::Record(record),
        Err(error) => AnswerKind::Failure(raylet_proto::Error::from(error).into()),
    };
    let answer = PlacementGroupAnswer {
        call_id: call.call_id,
        kind: Some(kind),
    };
    let _ = answers.send(Ok(answer));
}

async fn create(
    groups: &GroupManager<NodeManagerBundles>,
    request: CreatePlacementGroupRequest,
) -> Result<PlacementGroupRecord> {
    let spec = decode_spec(request)?;
    Ok(groups.create(spec).await?.to_proto())
}

/// Marks the group removed and answers; its bundles are freed right after.
async fn remove(groups: &GroupManager<NodeManagerBundles>, id: &[u8]) -> Result<PlacementGroupRecord> {
    let id = PlacementGroupId::from_wire(id)?;
    let (record, release) = groups.remove(id).await?;
    tokio::spawn(release);
    Ok(record.to_proto())
}

fn decode_spec(request: CreatePlacementGroupRequest) -> Result<GroupSpec> {
    if request.bundles.len() > MAX_BUNDLES {
        return Err(PlacementGroupError::TooManyBundles {
            count: request.bundles.len(),
            limit: MAX_BUNDLES,
        });
    }
    let bundles = request
        .bundles
        .iter()
        .map(ResourceSet::from_proto)
        .collect::<raylet_proto::Result<Vec<_>>>()?;
    check_bundles(&bundles)?;
    let strategy = PlacementStrategy::from_proto(request.strategy());
    Ok(GroupSpec {
        id: PlacementGroupId::from_wire(&request.placement_group_id)?,
        name: bounded_text("name", request.name)?,
        bundles,
        strategy,
    })
}
