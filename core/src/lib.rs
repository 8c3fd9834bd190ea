//! raylet: a Ray-like distributed runtime for ML workloads.
//!
//! This crate is the user-facing API. So far it holds the session directory,
//! where `raylet start` keeps the token, the head's address, process records
//! and logs; the `raylet` CLI binary is built from `src/bin/raylet`.

pub mod error;
pub mod session;

pub use error::{Error, Result};
pub use raylet_proto as proto;
pub use raylet_scheduler as scheduler;
