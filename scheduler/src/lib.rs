//! raylet's node manager, which runs on every machine and reports to the
//! head.

pub mod node_manager;

pub use raylet_proto::{Error, Result};
