//! raylet's control plane: the head, which keeps the cluster's node table,
//! its actors and placement groups; the node manager, which runs on every
//! machine and reports to the head; the placement engine both use; the
//! autoscaler's decision of which nodes to launch and remove; and the
//! scale simulations that measure them.

pub mod autoscaler;
pub mod head;
pub mod node_manager;
pub mod placement;
pub mod sandbox;
pub mod simulation;
pub mod status;

pub use raylet_proto::{Error, Result};
