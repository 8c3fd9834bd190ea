//! Stack dumps of this node's workers for `raylet stack`: the node manager
//! sends a worker the stack request signal, and the worker, running on,
//! writes every thread's backtrace to `worker-<id>-<pid>.stack` in the log
//! directory (see the worker's `stacks` module), which is read here and
//! removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use raylet_proto::WorkerId;
use raylet_proto::v1::{WorkerStack, WorkerStacks};
use raylet_proto::worker_logs::{stack_file_name, stack_request_signal};

use crate::NodeManagerError;

/// How long a worker has to write its dump.
const DUMP_PATIENCE: Duration = Duration::from_secs(5);
/// How often the dump's file is looked for.
const POLL: Duration = Duration::from_millis(20);

/// The dumps of `workers` in `log_dir`, or of the one whose pid is `pid`
/// (0: all); `node` names this node in the error for a pid that is not a
/// worker's.
pub(crate) async fn dump(
    log_dir: &Path,
    workers: Vec<(WorkerId, u32)>,
    pid: u32,
    node: &str,
) -> Result<WorkerStacks, NodeManagerError> {
    let chosen: Vec<(WorkerId, u32)> = workers
        .into_iter()
        .filter(|(_, worker_pid)| pid == 0 || *worker_pid == pid)
        .collect();
    if pid != 0 && chosen.is_empty() {
        return Err(NodeManagerError::NotAWorker {
            pid,
            node: node.to_string(),
        });
    }
    let dumps = chosen
        .into_iter()
        .map(|(worker_id, pid)| dump_one(log_dir.join(stack_file_name(worker_id, pid)), worker_id, pid));
    Ok(WorkerStacks {
        workers: futures_util::future::join_all(dumps).await,
    })
}

/// Asks one worker for its dump and waits for the file.
async fn dump_one(path: PathBuf, worker_id: WorkerId, pid: u32) -> WorkerStack {
    let mut stack = WorkerStack {
        worker_id: worker_id.as_bytes().to_vec(),
        pid,
        ..WorkerStack::default()
    };
    let _ = std::fs::remove_file(&path);
    // SAFETY: kill(2) with the signal the worker handles; it does not end it.
    if unsafe { nix::libc::kill(pid as i32, stack_request_signal()) } != 0 {
        stack.error = format!("cannot signal the worker: {}", std::io::Error::last_os_error());
        return stack;
    }
    let deadline = Instant::now() + DUMP_PATIENCE;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let _ = std::fs::remove_file(&path);
                stack.text = text;
                return stack;
            }
            Err(_) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            Err(_) => {
                stack.error = format!("the worker wrote no dump within {DUMP_PATIENCE:?}");
                return stack;
            }
        }
    }
}
