//! A deterministic harness for the node manager's worker pool, after
//! DataFusion Ballista's `VirtualTaskLauncher`: a lease manager whose
//! workers a virtual launcher "starts", and which the test then has fail to
//! start, register, never register, or exit, on a single-threaded runtime
//! whose clock is paused and moves only when every task is idle. No process
//! is started and no socket is opened.

use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use nix::sys::signal::Signal;
use raylet_common::worker_env::WorkerBootstrap;
use raylet_proto::Amount;
use raylet_proto::peer_stream::{PeerStream, peer_stream};
use raylet_proto::resources::CPU;
use raylet_proto::v1::lease_session_event::Kind as LeaseEvent;
use raylet_proto::v1::{LeaseSessionEvent, WorkerBinary};
use raylet_proto::{ResourceSet, Scheduling, WorkerId};
use tokio::sync::oneshot;

use super::super::NodeManagerError;
use super::super::leasing::{LeaseManager, PendingLease, WorkerContext};
use super::super::worker_launcher::{LaunchError, LaunchedWorker, WorkerLauncher};
use super::super::worker_process::{WorkerEnd, describe_exit};

/// How long a lease that outlives its session waits to be adopted.
pub(crate) const ADOPTION_GRACE: Duration = Duration::from_secs(60);
/// How far the clock moves each time the test lets the pool run.
const SETTLE_STEP: Duration = Duration::from_millis(1);
/// The virtual launcher's first pid.
const FIRST_PID: u32 = 1000;

/// A worker the virtual launcher started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launched {
    pub(crate) worker: WorkerId,
    pub(crate) pid: u32,
}

#[derive(Default)]
struct Launches {
    /// Started since the test last asked.
    started: Vec<Launched>,
    /// Killed since the test last asked, by pid.
    killed: Vec<u32>,
    /// Ends the exit future of each worker not gone yet, by pid.
    running: HashMap<u32, oneshot::Sender<WorkerEnd>>,
    /// Launches that succeed before every later one fails as the kind says.
    refusal: Option<(usize, io::ErrorKind)>,
    next_pid: u32,
}

/// Workers that exist only as records and exit futures the test resolves.
#[derive(Default)]
struct VirtualLauncher {
    launches: Mutex<Launches>,
}

impl VirtualLauncher {
    fn launches(&self) -> MutexGuard<'_, Launches> {
        self.launches.lock().unwrap()
    }

    /// The worker with `pid` ends as `end` says, if it has not yet.
    fn end(&self, pid: u32, end: WorkerEnd) {
        if let Some(ended) = self.launches().running.remove(&pid) {
            let _ = ended.send(end);
        }
    }
}

impl WorkerLauncher for VirtualLauncher {
    fn launch(&self, binary: &Path, bootstrap: &WorkerBootstrap) -> Result<LaunchedWorker, LaunchError> {
        let mut launches = self.launches();
        match &mut launches.refusal {
            Some((0, kind)) => {
                return Err(LaunchError {
                    binary: binary.to_path_buf(),
                    source: io::Error::from(*kind),
                });
            }
            Some((allowed, _)) => *allowed -= 1,
            None => {}
        }
        let pid = FIRST_PID + launches.next_pid;
        launches.next_pid += 1;
        let worker = bootstrap.worker_id.parse().expect("the bootstrap names the worker");
        launches.started.push(Launched { worker, pid });
        let (ended, exited) = oneshot::channel();
        launches.running.insert(pid, ended);
        let exited = Box::pin(async move {
            match exited.await {
                Ok(end) => end,
                Err(_) => std::future::pending().await,
            }
        });
        Ok(LaunchedWorker { pid, exited })
    }

    /// Like a real process, a killed worker dies of SIGKILL.
    fn kill(&self, pid: u32) {
        self.launches().killed.push(pid);
        self.end(pid, describe_exit(ExitStatus::from_raw(Signal::SIGKILL as i32)));
    }
}

/// An owner's lease session with the pool.
pub(crate) struct OwnerSession {
    pub(crate) id: u64,
    events: PeerStream<LeaseSessionEvent>,
}

impl OwnerSession {
    /// The lease events sent to the owner since last asked.
    pub(crate) fn events(&mut self) -> Vec<LeaseEvent> {
        std::iter::from_fn(|| self.events.next().now_or_never().flatten())
            .filter_map(|event| event.expect("the pool sends no errors").kind)
            .collect()
    }

    /// A request for one CPU, neither retriable nor outliving the session.
    pub(crate) fn lease_request(&self, request_id: u64) -> PendingLease {
        PendingLease {
            session: self.id,
            request_id,
            demand: cpus(1),
            scheduling: Scheduling::default(),
            allow_spillback: false,
            retriable: false,
            outlives_session: false,
            view: 0,
        }
    }
}

/// A node's worker pool with a virtual launcher.
pub(crate) struct WorkerPoolTest {
    pub(crate) leases: Arc<LeaseManager>,
    launcher: Arc<VirtualLauncher>,
    /// The file the sessions' binary is, hashed as they open.
    binary: tempfile::NamedTempFile,
}

impl WorkerPoolTest {
    /// A pool on a node with `total` CPUs, on the current (paused) runtime.
    pub(crate) fn start(total: u64) -> Self {
        let launcher = Arc::new(VirtualLauncher::default());
        let leases = LeaseManager::new(
            WorkerContext::for_tests(),
            cpus(total),
            ADOPTION_GRACE,
            launcher.clone(),
        );
        let binary = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(binary.path(), b"a worker build").expect("the binary is written");
        WorkerPoolTest {
            leases,
            launcher,
            binary,
        }
    }

    pub(crate) fn binary(&self) -> &Path {
        self.binary.path()
    }

    /// Opens a lease session whose workers run the test's binary.
    pub(crate) fn open_session(&self) -> Result<OwnerSession, NodeManagerError> {
        let binary = WorkerBinary {
            path: self.binary().to_string_lossy().into_owned(),
            hash: raylet_common::binary_hash::hash_file(self.binary())?,
            namespace: String::new(),
        };
        let (sender, events) = peer_stream("lease session events", "a test owner");
        let id = self.leases.open_session(binary, sender)?;
        Ok(OwnerSession { id, events })
    }

    /// Opens a session whose pre-started workers never register.
    pub(crate) fn open_session_with_unregistered_workers(&self) -> OwnerSession {
        let session = self.open_session().expect("the session opens");
        self.launched();
        session
    }

    /// Opens a session whose pre-started workers have registered and wait idle.
    pub(crate) async fn open_session_with_idle_workers(&self) -> OwnerSession {
        let session = self.open_session().expect("the session opens");
        for worker in self.launched() {
            self.register(worker).expect("a started worker registers");
        }
        self.settle().await;
        session
    }

    /// The workers started since last asked.
    pub(crate) fn launched(&self) -> Vec<Launched> {
        std::mem::take(&mut self.launcher.launches().started)
    }

    /// The pids of the workers killed since last asked.
    pub(crate) fn killed(&self) -> Vec<u32> {
        std::mem::take(&mut self.launcher.launches().killed)
    }

    /// The launches after the next `allowed` fail as `kind` says.
    pub(crate) fn refuse_launches_after(&self, allowed: usize, kind: io::ErrorKind) {
        self.launcher.launches().refusal = Some((allowed, kind));
    }

    /// `worker` registers, as its worker session's first message does.
    pub(crate) fn register(&self, worker: Launched) -> Result<(), NodeManagerError> {
        self.leases.register_worker(
            worker.worker,
            worker_address(worker.worker),
            format!("owner-{}:9001", worker.worker),
        )
    }

    /// `worker`'s process ends as `end` says.
    pub(crate) fn exit(&self, worker: Launched, end: WorkerEnd) {
        self.launcher.end(worker.pid, end);
    }

    /// How the pool says `worker` ended, if it knows.
    pub(crate) async fn exit_of(&self, worker: Launched) -> Option<WorkerEnd> {
        self.leases.worker_exit(worker.worker, Duration::ZERO).await
    }

    /// Lets every task run until all wait, moving the clock by a millisecond.
    pub(crate) async fn settle(&self) {
        tokio::time::sleep(SETTLE_STEP).await;
    }

    /// Moves the clock by `duration`, letting everything due run.
    pub(crate) async fn advance(&self, duration: Duration) {
        tokio::time::sleep(duration.saturating_sub(SETTLE_STEP)).await;
        self.settle().await;
    }
}

pub(crate) fn cpus(n: u64) -> ResourceSet {
    ResourceSet::new().with(CPU, Amount::whole(n))
}

pub(crate) fn worker_address(worker: WorkerId) -> String {
    format!("worker-{worker}:9000")
}
