//! Calls to an owner from processes on its machine, as same-node calls
//! ([`crate::same_node_calls`]) beside the owner's gRPC port: gets of its
//! finished objects, and the borrower updates that count references held
//! elsewhere. An object not finished yet, or any failure, sends the caller
//! to the owner's gRPC service, which waits. A call over gRPC took about
//! 200 us here, most of it wake-ups.

pub use self::client::LocalOwners;
pub use self::server::{OwnerCallServer, OwnerTable};

mod client;
mod server;
