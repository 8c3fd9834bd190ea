//! The store's same-node calls ([`raylet_proto::same_node_calls`]): a
//! create that needs no spilling, a seal, and a get of an object in
//! memory, which a driver or worker makes on its own thread over a Unix
//! socket instead of a gRPC call through its runtime. Anything else (room
//! to be made on disk, an object to restore, a store busy spilling, any
//! error) is declined, and the caller makes the call over gRPC, which
//! waits and reports errors in full.

pub use self::client::SameNodeStore;

mod client;
mod server;
