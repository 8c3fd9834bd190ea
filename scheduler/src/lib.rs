//! raylet's control plane: the head, which keeps the cluster's node table and
//! its actors, and the node manager, which runs on every machine and reports to the head.

pub mod head;
pub mod node_manager;
pub mod placement;
pub mod sandbox;
pub mod status;

pub use raylet_proto::{Error, Result};
