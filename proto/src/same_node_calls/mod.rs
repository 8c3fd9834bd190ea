//! Calls between processes of one machine that a server answers at once:
//! a Unix socket beside the server's gRPC port (see [`crate::local_socket`];
//! none with TLS), opened with the task stream's token hello, then
//! length-prefixed request and reply frames, one request at a time per
//! connection. The server answers on a thread of its own from what it has
//! at hand and never waits; what it cannot answer at once, and any
//! failure, sends the caller to the gRPC service, which may wait. So a
//! caller's thread writes its request and reads the answer itself without
//! waking a runtime on either side. Both threads poll for
//! [`crate::task_stream::SPIN`] before sleeping, as the task streams do.
//!
//! Owners answer gets of their finished objects and borrower updates this
//! way ([`crate::owner_calls`]), and a node's object store its creates,
//! seals, deletes and gets of objects in memory.

pub use self::client::CallConnection;
pub use self::server::{Answer, CallServer};

mod client;
mod server;
