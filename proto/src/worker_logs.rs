//! The layout of a worker's log files, which three parts share: the worker
//! writes them (raylet's log capture), its node manager serves their ends,
//! and `raylet logs` (raylet-state) picks a task's lines out of them; and
//! the stack dumps that `raylet stack` asks workers for.

use std::fmt::Display;

/// The line in a worker's log files before a task's output:
/// `:task_start: TASK_ID FUNCTION`.
pub const TASK_START: &str = ":task_start:";
/// The line in a worker's log files after a task's output:
/// `:task_end: TASK_ID`.
pub const TASK_END: &str = ":task_end:";

/// The name of worker `worker`'s log files without their extension
/// (`.out`, `.err`), `worker-<id>-<pid>`.
pub fn file_stem(worker: impl Display, pid: u32) -> String {
    format!("{}{pid}", file_prefix(worker))
}

/// The file a worker writes a dump of its threads' stacks to, for `raylet
/// stack`: `worker-<id>-<pid>.stack`.
pub fn stack_file_name(worker: impl Display, pid: u32) -> String {
    format!("{}.stack", file_stem(worker, pid))
}

/// The signal that asks a worker for a dump of its threads' stacks (a
/// real-time one, which nothing else in raylet takes; the next one is the
/// worker's own, to interrupt each thread).
pub fn stack_request_signal() -> i32 {
    libc::SIGRTMIN() + 4
}

/// What the names of worker `worker`'s log files start with, whatever its
/// pid.
pub fn file_prefix(worker: impl Display) -> String {
    format!("worker-{worker}-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_files_are_named_by_its_id_then_its_pid() {
        assert_eq!(file_stem("ab12", 4242), "worker-ab12-4242");
        assert!(file_stem("ab12", 4242).starts_with(&file_prefix("ab12")));
        assert!(!file_stem("ab123", 4242).starts_with(&file_prefix("ab12")));
    }
}
