//! The owner service of a process: other processes fetch the values of the
//! objects this process owns, and say when they take and drop references;
//! those on its machine also get its finished objects and say so through a
//! socket beside it (see [`raylet_proto::owner_calls`]).

use std::sync::Arc;
use std::time::Duration;

use raylet_common::auth::AuthToken;
use raylet_proto::ObjectId;
use raylet_proto::owner_calls::{OwnerCallServer, OwnerTable};
use raylet_proto::v1::owner_service_server::OwnerService;
use raylet_proto::v1::{
    AddCopiesReply, AddCopiesRequest, DescribeObjectsReply, DescribeObjectsRequest, GetObjectReply, GetObjectRequest,
    ObjectHolders, UpdateBorrowersReply, UpdateBorrowersRequest,
};
use tonic::{Request, Response, Status};

use crate::Error;
use crate::objects::memory_store::MemoryStore;
use crate::objects::owner_error::OwnerError;
use crate::value::outcome_to_proto;

/// The longest a single `GetObject` call waits.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub(crate) struct OwnerServiceImpl {
    /// The objects this process owns.
    store: Arc<MemoryStore>,
}

impl OwnerServiceImpl {
    pub(crate) fn new(store: Arc<MemoryStore>) -> Self {
        OwnerServiceImpl { store }
    }
}

/// Serves same-node calls to the objects in `store` beside the owner
/// service at `address`; `None` when they take gRPC only.
pub(crate) fn serve_owner_calls(address: &str, token: &AuthToken, store: Arc<MemoryStore>) -> Option<OwnerCallServer> {
    OwnerCallServer::start(address.parse().ok()?, token.clone(), OwnedObjects(store))
}

/// The owner's table as its same-node calls read and count it.
struct OwnedObjects(Arc<MemoryStore>);

impl OwnerTable for OwnedObjects {
    fn finished(&self, id: ObjectId) -> Option<raylet_proto::v1::ObjectOutcome> {
        let outcome = self.0.try_get(id).ok()??;
        Some(outcome_to_proto(&outcome, false))
    }

    fn update_borrower(&self, id: ObjectId, borrower: &str, delta: i32) {
        self.0.update_borrower(id, borrower, delta);
    }
}

#[tonic::async_trait]
impl OwnerService for OwnerServiceImpl {
    async fn get_object(&self, request: Request<GetObjectRequest>) -> Result<Response<GetObjectReply>, Status> {
        let request = request.into_inner();
        let id = ObjectId::from_wire(&request.object_id).map_err(OwnerError::from)?;
        let wait = Duration::from_millis(request.timeout_ms).min(MAX_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        match self.store.wait(id, Some(deadline)).await {
            Ok(outcome) => Ok(Response::new(GetObjectReply {
                outcome: outcome.as_ref().map(|outcome| outcome_to_proto(outcome, false)),
            })),
            Err(Error::ObjectLost { object, .. }) => Err(OwnerError::NotOwned(object).into()),
            Err(error) => Err(OwnerError::from(raylet_proto::Error::Internal(error.to_string())).into()),
        }
    }

    async fn update_borrowers(
        &self,
        request: Request<UpdateBorrowersRequest>,
    ) -> Result<Response<UpdateBorrowersReply>, Status> {
        for change in request.into_inner().changes {
            let id = ObjectId::from_wire(&change.object_id)?;
            self.store.update_borrower(id, &change.borrower_address, change.delta);
        }
        Ok(Response::new(UpdateBorrowersReply {}))
    }

    async fn describe_objects(
        &self,
        request: Request<DescribeObjectsRequest>,
    ) -> Result<Response<DescribeObjectsReply>, Status> {
        let mut objects = Vec::new();
        for object_id in request.into_inner().object_ids {
            let id = ObjectId::from_wire(&object_id)?;
            let holders = self.store.holders(id);
            let known = holders.is_some();
            let (owner_handles, borrowers) = holders.unwrap_or_default();
            objects.push(ObjectHolders {
                object_id,
                known,
                owner_handles,
                borrowers,
            });
        }
        Ok(Response::new(DescribeObjectsReply { objects }))
    }

    async fn add_copies(&self, request: Request<AddCopiesRequest>) -> Result<Response<AddCopiesReply>, Status> {
        for copy in request.into_inner().copies {
            let id = ObjectId::from_wire(&copy.object_id)?;
            self.store.add_copy(id, &copy.node_address);
        }
        Ok(Response::new(AddCopiesReply {}))
    }
}
