//! The worker actor of a run: one per rank, in the run's placement group.
//! `start` runs the train loop on a thread of its own; the driver then
//! calls `poll` for the loop's reports until it finishes or fails.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use raylet::ObjectRef;
use serde::{Deserialize, Serialize};

use crate::checkpoint::RunDirectory;
use crate::collective::{CollectiveGroup, GroupOptions};
use crate::worker_event::WorkerEvent;
use crate::{BatchScaling, Checkpoint, TrainContext, TrainError, train_loop};

/// What a worker needs to run its rank of one try of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSetup {
    pub train_loop: String,
    #[serde(with = "serde_bytes")]
    pub config: Vec<u8>,
    pub rank: usize,
    pub world_size: usize,
    /// The most workers the run may have (`world_size` unless elastic).
    pub max_workers: usize,
    pub batch_scaling: BatchScaling,
    pub attempt: u32,
    pub use_gpu: bool,
    pub group_name: String,
    pub collective_timeout: Duration,
    pub run_directory: RunDirectory,
    pub resume_from: Option<Checkpoint>,
    pub next_report: u64,
    pub shards: BTreeMap<String, ObjectRef<Vec<u8>>>,
}

/// Why a worker cannot start its train loop or report on it.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("this worker already runs a train loop")]
    AlreadyRunning,
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("starting the train loop's thread: {0}")]
    NoThread(std::io::Error),
    #[error("no train loop was started")]
    NotStarted,
    #[error("the train loop's thread is gone")]
    LoopGone,
}

/// One rank of a run.
#[raylet::actor]
#[derive(Default)]
pub struct TrainWorker {
    events: Option<Mutex<Receiver<WorkerEvent>>>,
}

#[raylet::actor]
impl TrainWorker {
    pub fn new() -> Self {
        TrainWorker::default()
    }

    /// Starts the train loop; returns this worker's pid.
    pub fn start(&mut self, setup: WorkerSetup) -> Result<u32, WorkerError> {
        if self.events.is_some() {
            return Err(WorkerError::AlreadyRunning);
        }
        let registered = train_loop::find(&setup.train_loop)?;
        let (events, receiver) = mpsc::channel();
        self.events = Some(Mutex::new(receiver));
        std::thread::Builder::new()
            .name(format!("train-rank-{}", setup.rank))
            .spawn(move || run_to_end(setup, registered.run, events))
            .map_err(WorkerError::NoThread)?;
        Ok(std::process::id())
    }

    /// The train loop's events since the last poll, waiting up to `wait_ms`
    /// for the first.
    pub fn poll(&mut self, wait_ms: u64) -> Result<Vec<WorkerEvent>, WorkerError> {
        let events = self.events.as_ref().ok_or(WorkerError::NotStarted)?;
        let events = events.lock().unwrap_or_else(|p| p.into_inner());
        let mut polled = match events.recv_timeout(Duration::from_millis(wait_ms)) {
            Ok(event) => vec![event],
            Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
            Err(RecvTimeoutError::Disconnected) => return Err(WorkerError::LoopGone),
        };
        polled.extend(events.try_iter());
        Ok(polled)
    }
}

/// The train loop's thread: joins the group, runs the loop, and says how it ended.
fn run_to_end(
    mut setup: WorkerSetup,
    run: fn(&[u8], &mut TrainContext) -> Result<(), TrainError>,
    events: Sender<WorkerEvent>,
) {
    let config = std::mem::take(&mut setup.config);
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut context = join(setup, events.clone())?;
        run(&config, &mut context)
    }));
    let event = match ended {
        Ok(Ok(())) => WorkerEvent::Finished,
        Ok(Err(error)) => WorkerEvent::Failed(error.to_string()),
        Err(panic) => WorkerEvent::Failed(format!(
            "the train loop panicked: {}",
            raylet::error::panic_message(panic.as_ref())
        )),
    };
    let _ = events.send(event);
}

/// This rank's context, once every rank joined the group.
fn join(setup: WorkerSetup, events: Sender<WorkerEvent>) -> Result<TrainContext, TrainError> {
    if cfg!(feature = "cuda") && setup.use_gpu {
        crate::check_cuda_runtime()?;
    }
    let cluster = raylet::current()?;
    let options = GroupOptions {
        timeout: setup.collective_timeout,
        ..GroupOptions::default()
    };
    let group = CollectiveGroup::join(&cluster, &setup.group_name, setup.rank, setup.world_size, options)?;
    Ok(TrainContext {
        rank: setup.rank,
        world_size: setup.world_size,
        max_workers: setup.max_workers,
        batch_scaling: setup.batch_scaling,
        attempt: setup.attempt,
        use_gpu: setup.use_gpu,
        group,
        resume_from: setup.resume_from,
        next_report: setup.next_report,
        shards: setup.shards,
        run_directory: setup.run_directory,
        events,
    })
}
