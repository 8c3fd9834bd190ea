//! Starting and killing worker processes, the node's real
//! [`WorkerLauncher`]: the owner's binary, re-executed with the bootstrap
//! variable that turns it into a worker; and how a worker's end is told.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_common::worker_env::{WORKER_ENV, WorkerBootstrap};
use raylet_proto::v1::{WorkerExit, WorkerExitKind};

use super::gpu_devices::visible_devices;
use super::worker_launcher::{LaunchError, LaunchedWorker, WorkerLauncher};

/// How a worker process ended: the kind of end, which callers act on (a
/// task whose worker the out-of-memory monitor ended waits before it runs
/// again), and the words for it, which they show.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerEnd {
    pub(crate) kind: WorkerExitKind,
    pub(crate) description: String,
}

impl WorkerEnd {
    pub(crate) fn new(kind: WorkerExitKind, description: impl Into<String>) -> Self {
        WorkerEnd {
            kind,
            description: description.into(),
        }
    }

    /// The end as `GetWorkerExit` answers it.
    pub(crate) fn to_proto(&self) -> WorkerExit {
        WorkerExit {
            exited: true,
            description: self.description.clone(),
            kind: self.kind.into(),
        }
    }
}

/// Workers as processes: the owner's binary, re-executed with the
/// bootstrap variable. What a running node launches.
pub(crate) struct ProcessLauncher;

impl WorkerLauncher for ProcessLauncher {
    fn launch(&self, binary: &Path, bootstrap: &WorkerBootstrap) -> Result<LaunchedWorker, LaunchError> {
        let mut child = tokio::process::Command::new(binary)
            .env(WORKER_ENV, bootstrap.to_env_value())
            .env(
                CUDA_VISIBLE_DEVICES,
                gpu_list(&bootstrap.gpu_ids, visible_devices().as_deref()),
            )
            .envs(raylet_common::tls::child_env())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| LaunchError {
                binary: binary.to_path_buf(),
                source,
            })?;
        let pid = child.id().unwrap_or_default();
        let exited = Box::pin(async move {
            match child.wait().await {
                Ok(status) => describe_exit(status),
                Err(e) => WorkerEnd::new(WorkerExitKind::Unspecified, format!("could not be waited for: {e}")),
            }
        });
        Ok(LaunchedWorker { pid, exited })
    }

    fn kill(&self, pid: u32) {
        if pid > 0 {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The variable that limits which GPUs CUDA programs see.
const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// What CUDA calls the GPUs with node ids `ids`: "0,1", or the entries at
/// those places of the node's own `CUDA_VISIBLE_DEVICES` when it was
/// started with one (`node_visible`); empty for a worker without GPUs,
/// which then sees none.
fn gpu_list(ids: &[u32], node_visible: Option<&[String]>) -> String {
    let name = |id: u32| match node_visible.and_then(|visible| visible.get(id as usize)) {
        Some(name) => name.clone(),
        None => id.to_string(),
    };
    ids.iter().map(|&id| name(id)).collect::<Vec<_>>().join(",")
}

/// "exited with code 3" or "was killed by signal 9 (SIGKILL)".
pub(crate) fn describe_exit(status: ExitStatus) -> WorkerEnd {
    if let Some(code) = status.code() {
        return WorkerEnd::new(WorkerExitKind::Exited, format!("exited with code {code}"));
    }
    match status.signal() {
        Some(number) => {
            let name = Signal::try_from(number).map_or("unknown", |s| s.as_str());
            WorkerEnd::new(
                WorkerExitKind::Signaled,
                format!("was killed by signal {number} ({name})"),
            )
        }
        None => WorkerEnd::new(WorkerExitKind::Unspecified, format!("ended: {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leased_gpus_are_named_as_the_node_was_given_them() {
        assert_eq!(gpu_list(&[0, 1], None), "0,1");
        assert_eq!(gpu_list(&[], None), "");
        let node_visible = ["4".to_string(), "6".to_string()];
        assert_eq!(gpu_list(&[1], Some(&node_visible)), "6");
        assert_eq!(gpu_list(&[0, 1], Some(&node_visible)), "4,6");
    }

    #[test]
    fn exits_are_told_apart_by_code_or_signal_and_described() {
        let described = |raw| {
            let end = describe_exit(ExitStatus::from_raw(raw));
            (end.kind, end.description)
        };
        assert_eq!(described(3 << 8), (WorkerExitKind::Exited, "exited with code 3".into()));
        assert_eq!(
            described(9),
            (WorkerExitKind::Signaled, "was killed by signal 9 (SIGKILL)".into())
        );
        assert_eq!(
            described(11),
            (WorkerExitKind::Signaled, "was killed by signal 11 (SIGSEGV)".into())
        );
    }
}
