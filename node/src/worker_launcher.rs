//! The process edge of the worker pool: the lease manager starts and kills
//! workers only through a [`WorkerLauncher`]. A running node launches
//! processes ([`ProcessLauncher`](super::worker_process::ProcessLauncher));
//! unit tests plug in a virtual launcher whose workers fail to start,
//! register, hang or exit as the test says.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use raylet_common::worker_env::WorkerBootstrap;

use super::worker_process::WorkerEnd;

/// Resolves with how a worker ended, once it is gone (reaped).
pub(crate) type WorkerExited = Pin<Box<dyn Future<Output = WorkerEnd> + Send>>;

/// A worker that was started: its pid, and how it will end.
pub(crate) struct LaunchedWorker {
    pub(crate) pid: u32,
    pub(crate) exited: WorkerExited,
}

/// A worker could not be started at all.
#[derive(Debug, thiserror::Error)]
#[error("starting a worker from {}: {source}", binary.display())]
pub(crate) struct LaunchError {
    pub(crate) binary: PathBuf,
    pub(crate) source: io::Error,
}

/// Starts and kills the node's workers.
pub(crate) trait WorkerLauncher: Send + Sync {
    /// Starts a worker from `binary` that finds the node and learns who it
    /// is from `bootstrap`, seeing only the GPUs `bootstrap` lists.
    fn launch(&self, binary: &Path, bootstrap: &WorkerBootstrap) -> Result<LaunchedWorker, LaunchError>;

    /// Kills a worker that has not been reaped yet; its exit future then
    /// resolves.
    fn kill(&self, pid: u32);
}
