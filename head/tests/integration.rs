//! The head's integration tests, one binary: its placement on real node
//! ledgers (`placement_harness`), and in-process clusters of a head and node
//! managers (`sandbox`) answering over real gRPC.

mod placement_group_calls;
mod placement_harness;
mod sandbox;
mod sandbox_cluster;
