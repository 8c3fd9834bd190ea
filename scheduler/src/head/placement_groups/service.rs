//! The gRPC face of the head's placement groups: decode and validate, call
//! the group manager, encode.

use std::sync::Arc;
use std::time::Duration;

use raylet_proto::placement_group::check_bundles;
use raylet_proto::v1::placement_group_service_server::PlacementGroupService;
use raylet_proto::v1::{
    CreatePlacementGroupRequest, ListPlacementGroupsReply, ListPlacementGroupsRequest, PlacementGroupRecord,
    RemovePlacementGroupRequest, WaitPlacementGroupRequest,
};
use raylet_proto::{Error, PlacementGroupId, PlacementStrategy, ResourceSet, Result};
use tonic::{Request, Response, Status};

use super::manager::GroupManager;
use super::node_calls::NodeManagerBundles;
use super::table::GroupSpec;
use crate::head::service::bounded_text;

/// The longest a `WaitPlacementGroup` call waits.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// The most bundles one group may have.
const MAX_BUNDLES: usize = 10_000;

/// Serves [`PlacementGroupService`] over the head's group manager.
pub(crate) struct PlacementGroupServiceImpl {
    pub(crate) groups: Arc<GroupManager<NodeManagerBundles>>,
}

#[tonic::async_trait]
impl PlacementGroupService for PlacementGroupServiceImpl {
    async fn create_placement_group(
        &self,
        request: Request<CreatePlacementGroupRequest>,
    ) -> Result<Response<PlacementGroupRecord>, Status> {
        let spec = decode_spec(request.into_inner())?;
        let record = self.groups.create(spec).await?;
        Ok(Response::new(record.to_proto()))
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

    async fn remove_placement_group(
        &self,
        request: Request<RemovePlacementGroupRequest>,
    ) -> Result<Response<PlacementGroupRecord>, Status> {
        let id = PlacementGroupId::from_wire(&request.into_inner().placement_group_id)?;
        let (record, release) = self.groups.remove(id).await?;
        tokio::spawn(release);
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

fn decode_spec(request: CreatePlacementGroupRequest) -> Result<GroupSpec> {
    if request.bundles.len() > MAX_BUNDLES {
        return Err(Error::InvalidArgument(format!(
            "a placement group may have at most {MAX_BUNDLES} bundles, got {}",
            request.bundles.len()
        )));
    }
    let bundles = request
        .bundles
        .iter()
        .map(ResourceSet::from_proto)
        .collect::<Result<Vec<_>>>()?;
    check_bundles(&bundles)?;
    let strategy = PlacementStrategy::from_proto(request.strategy());
    Ok(GroupSpec {
        id: PlacementGroupId::from_wire(&request.placement_group_id)?,
        name: bounded_text("name", request.name)?,
        bundles,
        strategy,
    })
}
