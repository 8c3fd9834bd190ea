//! raylet's control plane: the head, which keeps the cluster's node table,
//! its actors and placement groups; the node manager, which runs on every
//! machine and reports to the head; and the scale simulation that measures
//! the head's placement.

pub mod head;
pub mod node_manager;
pub mod sandbox;
pub mod simulation;

pub use raylet_proto::{Error, Result};
