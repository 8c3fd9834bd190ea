//! What a process records about its work and what the CLI's read-only
//! commands show: metrics (`metrics.rs`), timeline spans (`timeline.rs`)
//! and the task state changes sent to the head (`task_events.rs`); the
//! tasks the head recorded (`task_info.rs`, as `raylet list tasks` and
//! `raylet summary tasks` show them, and `chrome_trace.rs`, `raylet
//! timeline`), the object stores' contents (`memory.rs`, `raylet memory`)
//! and workers' output (`worker_logs.rs`, `raylet logs`).

pub(crate) mod chrome_trace;
pub(crate) mod memory;
pub mod metrics;
pub(crate) mod task_events;
pub(crate) mod task_info;
pub mod timeline;
pub(crate) mod worker_logs;
