//! The `local` provider: each node is a `raylet start --address HEAD
//! --block` process on this machine, a child of the process that runs the
//! autoscaler, writing its output to `<temp dir>/autoscaler/<instance>.log`.
//! For clusters of one machine and for tests; `terminate` sends SIGTERM and
//! after a grace period SIGKILL.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::provider::{
    Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderCall, ProviderError, TOKEN_ENV,
    start_flags,
};

/// How long a terminated node may take to stop before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How much of a failed node's log its state quotes.
const LOG_TAIL_LINES: usize = 5;

/// Nodes as processes of the `raylet` binary at `binary`.
pub struct LocalProvider {
    binary: PathBuf,
    temp_dir: PathBuf,
    /// Makes instance ids unique within this provider.
    launched: AtomicU64,
    /// Tells this provider's instances from an earlier one's.
    epoch: u128,
    instances: Mutex<BTreeMap<InstanceId, LocalNode>>,
}

/// Why a local node's process could not be ended.
#[derive(Debug, thiserror::Error)]
enum StopError {
    #[error("the node's status cannot be read: {0}")]
    Wait(std::io::Error),
    #[error("SIGTERM to pid {pid}: {source}")]
    Term { pid: Pid, source: nix::Error },
    #[error("SIGKILL to pid {pid}: {source}")]
    Kill { pid: Pid, source: std::io::Error },
}

/// One node process.
struct LocalNode {
    node_type: String,
    child: Child,
    log: PathBuf,
}

impl LocalProvider {
    /// Runs `binary start ...` with `--temp-dir temp_dir` for each node.
    pub fn new(binary: impl Into<PathBuf>, temp_dir: impl Into<PathBuf>) -> Self {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_millis());
        LocalProvider {
            binary: binary.into(),
            temp_dir: temp_dir.into(),
            launched: AtomicU64::new(0),
            epoch,
            instances: Mutex::new(BTreeMap::new()),
        }
    }

    fn next_instance(&self) -> InstanceId {
        let n = self.launched.fetch_add(1, Ordering::Relaxed);
        InstanceId(format!("local-{}-{n}", self.epoch))
    }

    fn log_path(&self, instance: &InstanceId) -> PathBuf {
        self.temp_dir.join("autoscaler").join(format!("{instance}.log"))
    }

    fn spawn(&self, request: &LaunchRequest, instance: &InstanceId, log: &PathBuf) -> std::io::Result<Child> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let output = File::create(log)?;
        Command::new(&self.binary)
            .args(start_flags(request, instance))
            .env(TOKEN_ENV, &request.token)
            .arg("--temp-dir")
            .arg(&self.temp_dir)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .spawn()
    }

    fn start(&self, request: &LaunchRequest) -> Result<InstanceId, ProviderError> {
        let instance = self.next_instance();
        let log = self.log_path(&instance);
        let child = self
            .spawn(request, &instance, &log)
            .map_err(|e| ProviderError::Launch {
                node_type: request.node_type.name.clone(),
                message: format!("running {}: {e}", self.binary.display()),
            })?;
        tracing::info!(%instance, node_type = %request.node_type.name, pid = child.id(), "launched a local node");
        let node = LocalNode {
            node_type: request.node_type.name.clone(),
            child,
            log,
        };
        self.lock().insert(instance.clone(), node);
        Ok(instance)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<InstanceId, LocalNode>> {
        self.instances.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl NodeProvider for LocalProvider {
    fn launch<'a>(&'a self, request: &'a LaunchRequest) -> ProviderCall<'a, InstanceId> {
        Box::pin(async move { self.start(request) })
    }

    fn instances(&self) -> ProviderCall<'_, Vec<Instance>> {
        Box::pin(async move {
            let mut instances = self.lock();
            let listed = instances.iter_mut().map(|(id, node)| Instance {
                id: id.clone(),
                node_type: node.node_type.clone(),
                state: node.state(),
            });
            Ok(listed.collect())
        })
    }

    fn terminate<'a>(&'a self, instance: &'a InstanceId) -> ProviderCall<'a, ()> {
        Box::pin(async move {
            let node = self
                .lock()
                .remove(instance)
                .ok_or_else(|| ProviderError::NoSuchInstance(instance.clone()))?;
            node.stop().await.map_err(|e| ProviderError::Terminate {
                instance: instance.clone(),
                message: e.to_string(),
            })
        })
    }
}

impl LocalNode {
    fn state(&mut self) -> InstanceState {
        match self.child.try_wait() {
            Ok(None) => InstanceState::Running,
            Ok(Some(status)) => InstanceState::Failed(format!("{status}; its log ends: {}", self.log_tail())),
            Err(e) => InstanceState::Failed(format!("its status cannot be read: {e}")),
        }
    }

    /// The last lines of the node's output, on one line.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ")
    }

    /// SIGTERM, then SIGKILL once the grace has passed; reaps the process.
    async fn stop(mut self) -> Result<(), StopError> {
        if self.child.try_wait().map_err(StopError::Wait)?.is_some() {
            return Ok(());
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        kill(pid, Signal::SIGTERM).map_err(|source| StopError::Term { pid, source })?;
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if self.child.try_wait().map_err(StopError::Wait)?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::warn!(%pid, "a local node outlived its grace period: SIGKILL");
        self.child.kill().map_err(|source| StopError::Kill { pid, source })?;
        self.child.wait().map(|_| ()).map_err(StopError::Wait)
    }
}
