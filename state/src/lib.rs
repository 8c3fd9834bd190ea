//! The cluster's state as the CLI's read-only commands and the dashboard
//! show it, read from the head and the node managers of a running
//! cluster: the tasks the head recorded (`tasks.rs`: `raylet list tasks`,
//! `raylet summary tasks`), the timeline as a Chrome trace
//! (`chrome_trace.rs`: `raylet timeline`), workers' output (`logs.rs`:
//! `raylet logs`) and their threads' stacks (`stacks.rs`: `raylet stack`). Like Ray's state API, it is a client of the cluster
//! and not part of the user's crate: a program that runs tasks links none
//! of it.

mod chrome_trace;
mod error;
mod logs;
mod stacks;
mod tasks;

pub use chrome_trace::{ChromeTrace, chrome_trace};
pub use error::StateError;
pub use logs::{FollowedText, LogFollower, LogSource, WorkerLogText, read_worker_log};
pub use stacks::{WorkerStackDump, dump_worker_stacks};
pub use tasks::{FunctionSummary, TaskInfo, TaskListing, list_tasks, summarize_tasks};
