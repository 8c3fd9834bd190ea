//! The owner's end: each call answered from the owner's table at once.

use std::net::SocketAddr;

use raylet_common::auth::AuthToken;

use crate::ids::ObjectId;
use crate::same_node_calls::CallServer;
use crate::v1::{
    GetObjectReply, ObjectOutcome, OwnerCall, OwnerCallReply, UpdateBorrowersReply, owner_call, owner_call_reply,
};
use crate::{Error, Result};

/// What an owner answers same-node calls from, on the server's thread: it
/// must not block.
pub trait OwnerTable: Send + 'static {
    /// What the owner has finished for an object, if anything, as it goes
    /// on the wire.
    fn finished(&self, id: ObjectId) -> Option<ObjectOutcome>;

    /// Counts `delta` more (or fewer) references to an object held by the
    /// process at `borrower`.
    fn update_borrower(&self, id: ObjectId, borrower: &str, delta: i32);
}

/// An owner's same-node call service; it stops, and its socket file goes,
/// when dropped.
pub struct OwnerCallServer {
    _calls: CallServer,
}

impl OwnerCallServer {
    /// Serves same-node calls beside the owner's gRPC port `address` from
    /// `table`; `None` (logged) when they take gRPC only: with TLS, or
    /// when the socket or the thread cannot be had.
    pub fn start(address: SocketAddr, token: AuthToken, table: impl OwnerTable) -> Option<Self> {
        let answer = move |call: OwnerCall| answer(&table, call);
        let calls = CallServer::start(address, token, ("owner calls", "raylet-owner-calls"), Box::new(answer))?;
        Some(OwnerCallServer { _calls: calls })
    }
}

fn answer(table: &impl OwnerTable, call: OwnerCall) -> Result<OwnerCallReply> {
    let reply = match call.call {
        Some(owner_call::Call::Get(get)) => {
            let outcome = table.finished(ObjectId::from_wire(&get.object_id)?);
            owner_call_reply::Reply::Got(GetObjectReply { outcome })
        }
        Some(owner_call::Call::UpdateBorrowers(update)) => {
            let mut changes = Vec::with_capacity(update.changes.len());
            for change in &update.changes {
                changes.push((ObjectId::from_wire(&change.object_id)?, change));
            }
            for (id, change) in changes {
                table.update_borrower(id, &change.borrower_address, change.delta);
            }
            owner_call_reply::Reply::Updated(UpdateBorrowersReply {})
        }
        None => return Err(Error::InvalidArgument("an empty owner call".into())),
    };
    Ok(OwnerCallReply { reply: Some(reply) })
}
