//! The gRPC face of the node manager.

use std::sync::Arc;

use raylet_proto::v1::node_manager_service_server::NodeManagerService;
use raylet_proto::v1::{GetNodeInfoRequest, NodeInfo};
use tonic::{Request, Response, Status};

use super::NodeShared;

/// Serves [`NodeManagerService`] from the node's shared state.
pub(crate) struct NodeManagerServiceImpl {
    pub(crate) shared: Arc<NodeShared>,
}

#[tonic::async_trait]
impl NodeManagerService for NodeManagerServiceImpl {
    async fn get_node_info(
        &self,
        _request: Request<GetNodeInfoRequest>,
    ) -> Result<Response<NodeInfo>, Status> {
        let shared = &self.shared;
        Ok(Response::new(NodeInfo {
            node_id: shared.config.node_id.as_bytes().to_vec(),
            incarnation: shared.incarnation(),
            head_address: shared.config.head_address.clone(),
            total: Some(shared.config.resources.to_proto()),
            available: Some(shared.available().to_proto()),
            stats: Some(shared.stats().to_proto()),
        }))
    }
}
