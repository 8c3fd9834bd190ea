//! What a process records about its work: metrics (`metrics.rs`),
//! timeline spans (`timeline.rs`), the task state changes sent to the head
//! (`task_events.rs`), and the object stores' contents (`memory.rs`, behind
//! `Cluster::memory` and `raylet memory`). What the CLI and the dashboard
//! read back from the head (tasks, the timeline as a Chrome trace, workers'
//! output) is the crate raylet-state's.

pub(crate) mod memory;
pub mod metrics;
pub(crate) mod task_events;
pub mod timeline;
