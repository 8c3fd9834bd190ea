//! The caller's end: connections to each owner on this machine, kept for
//! reuse, each used by one thread at a time, which writes its request and
//! reads the answer itself.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use raylet_common::auth::AuthToken;

use crate::ids::ObjectId;
use crate::same_node_calls::CallConnection;
use crate::v1::{
    GetObjectRequest, ObjectOutcome, OwnerCall, OwnerCallReply, UpdateBorrowersRequest, owner_call, owner_call_reply,
};

/// Idle connections kept per owner; more are closed as they come back.
const MAX_IDLE_PER_OWNER: usize = 16;
/// Owners remembered at most: past it the table starts afresh (closing
/// the idle connections), so that a long-lived process that got from many
/// short-lived owners does not keep one entry for each.
const MAX_OWNERS: usize = 4096;

/// The owners this process called, by their gRPC address.
pub struct LocalOwners {
    token: AuthToken,
    owners: Mutex<HashMap<String, OwnerLink>>,
}

/// How this process reaches an owner's calls.
enum OwnerLink {
    /// Not through a same-node socket: none there, or it refused us.
    Remote,
    /// Through these connections, none in use.
    Idle(Vec<CallConnection>),
}

impl LocalOwners {
    pub fn new(token: AuthToken) -> Self {
        LocalOwners {
            token,
            owners: Mutex::default(),
        }
    }

    /// `object`'s outcome from its owner at `owner`, when the owner runs on
    /// this machine and has it finished; `None` means ask the owner over
    /// gRPC (not on this machine, not finished, or the socket failed).
    pub fn finished(&self, owner: &str, object: ObjectId) -> Option<ObjectOutcome> {
        let get = GetObjectRequest {
            object_id: object.as_bytes().to_vec(),
            timeout_ms: 0,
        };
        let call = OwnerCall {
            call: Some(owner_call::Call::Get(get)),
        };
        match self.call(owner, &call)? {
            owner_call_reply::Reply::Got(got) => got.outcome,
            owner_call_reply::Reply::Updated(_) => None,
        }
    }

    /// Delivers `update` to the owner at `owner`; it comes back when it is
    /// to be sent over gRPC (not on this machine, or the socket failed).
    pub fn update_borrowers(&self, owner: &str, update: UpdateBorrowersRequest) -> Result<(), UpdateBorrowersRequest> {
        let call = OwnerCall {
            call: Some(owner_call::Call::UpdateBorrowers(update)),
        };
        match (self.call(owner, &call), call.call) {
            (Some(owner_call_reply::Reply::Updated(_)), _) => Ok(()),
            (_, Some(owner_call::Call::UpdateBorrowers(update))) => Err(update),
            _ => unreachable!("the call holds the update"),
        }
    }

    fn call(&self, owner: &str, call: &OwnerCall) -> Option<owner_call_reply::Reply> {
        let mut connection = self.connection(owner)?;
        match connection.call::<OwnerCallReply>(call) {
            Ok(reply) => {
                self.put_back(owner, connection);
                reply.reply
            }
            Err(error) => {
                tracing::debug!(%owner, %error, "a same-node owner call failed; making it over gRPC");
                None
            }
        }
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<String, OwnerLink>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection to `owner`, or a new one; `None` when the owner
    /// has no same-node socket, which is remembered.
    fn connection(&self, owner: &str) -> Option<CallConnection> {
        match self.owners().get_mut(owner) {
            Some(OwnerLink::Remote) => return None,
            Some(OwnerLink::Idle(idle)) if !idle.is_empty() => return idle.pop(),
            _ => {}
        }
        match CallConnection::open(owner, &self.token) {
            Ok(connection) => Some(connection),
            Err(error) => {
                tracing::debug!(%owner, %error, "calls to this owner take gRPC");
                self.remember(owner, OwnerLink::Remote);
                None
            }
        }
    }

    fn put_back(&self, owner: &str, connection: CallConnection) {
        let mut owners = self.owners();
        match owners.get_mut(owner) {
            Some(OwnerLink::Idle(idle)) if idle.len() < MAX_IDLE_PER_OWNER => idle.push(connection),
            Some(_) => {}
            None => {
                drop(owners);
                self.remember(owner, OwnerLink::Idle(vec![connection]));
            }
        }
    }

    /// Records how `owner` is reached, within [`MAX_OWNERS`].
    fn remember(&self, owner: &str, link: OwnerLink) {
        let mut owners = self.owners();
        if owners.len() >= MAX_OWNERS {
            owners.clear();
        }
        owners.insert(owner.to_string(), link);
    }
}
