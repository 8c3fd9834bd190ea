//! Gets of an owner's finished objects by processes on its machine: a
//! Unix socket beside the owner's gRPC port (see [`crate::local_socket`];
//! none with TLS), opened with the task stream's token hello, then
//! length-prefixed `GetObjectRequest` and `GetObjectReply` frames, one
//! request at a time per connection. The owner answers on a thread of its
//! own from what it has at hand and never waits for an object, so a
//! getter's thread writes its request and reads the answer itself without
//! waking the runtime on either side; an object not finished yet, or any
//! failure, sends the getter to the owner's gRPC service, which waits.
//! Both threads poll for [`crate::task_stream::SPIN`] before sleeping, as
//! the task streams do: a get over gRPC took about 200 us here, most of it
//! wake-ups.

pub use self::client::LocalGets;
pub use self::server::{Lookup, OwnerGetServer};

mod client;
mod server;
