//! The trial actor: it runs one trial at a time on a thread of its own and
//! is reused for the next. `start` begins a trial; `step` hands the
//! scheduler's decision on the last report to the trainable and returns
//! the trial's next events.

use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use raylet::ObjectRef;
use raylet_train::{Checkpoint, Metrics, RunDirectory};
use serde::{Deserialize, Serialize};

use crate::checkpoint_transfer::PackedCheckpoint;
use crate::schedulers::Decision;
use crate::trainable::{self, TrainableFn};
use crate::trial_event::TrialEvent;
use crate::{TrialConfig, TrialContext, TuneError};

/// Where a trial starts: from scratch, its own checkpoint, or a donor's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StartFrom {
    Scratch,
    /// Its own checkpoint, made at `iteration`.
    Checkpoint {
        checkpoint: Checkpoint,
        iteration: u64,
    },
    /// Another trial's checkpoint made at `iteration`, sent through the object store.
    Donor {
        packed: ObjectRef<PackedCheckpoint>,
        iteration: u64,
        metrics: Metrics,
    },
}

/// What the actor needs to run a trial.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrialSetup {
    pub trainable: String,
    pub trial_id: String,
    /// The config as JSON (the object codec cannot carry free-form values).
    pub config_json: String,
    /// The trial's directory (mirrored to object storage for an experiment kept there).
    pub directory: RunDirectory,
    pub start_from: StartFrom,
    /// The trial's `time_total_s` before this run.
    pub time_before: f64,
}

/// A running trial's channels.
struct RunningTrial {
    events: Receiver<TrialEvent>,
    decisions: Sender<Decision>,
}

/// Why a trial actor cannot start its trial or report on it.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("this trial actor already runs a trial")]
    AlreadyRunning,
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    #[error("starting the trial's thread: {0}")]
    NoThread(std::io::Error),
    #[error("no trial runs on this actor")]
    NotStarted,
}

/// Runs trials, one at a time.
#[raylet::actor]
#[derive(Default)]
pub struct TrialRunner {
    running: Option<Mutex<RunningTrial>>,
}

#[raylet::actor]
impl TrialRunner {
    pub fn new() -> Self {
        TrialRunner::default()
    }

    /// Starts a trial; returns this actor's pid.
    pub fn start(&mut self, setup: TrialSetup) -> Result<u32, RunnerError> {
        if self.running.is_some() {
            return Err(RunnerError::AlreadyRunning);
        }
        let registered = trainable::find(&setup.trainable)?;
        let (events, event_receiver) = mpsc::channel();
        let (decisions, decision_receiver) = mpsc::channel();
        self.running = Some(Mutex::new(RunningTrial {
            events: event_receiver,
            decisions,
        }));
        std::thread::Builder::new()
            .name(format!("trial-{}", setup.trial_id))
            .spawn(move || run_to_end(setup, registered.run, events, decision_receiver))
            .map_err(RunnerError::NoThread)?;
        Ok(std::process::id())
    }

    /// Hands `decision` (on the last report) to the trial, then returns its
    /// events, waiting up to `wait_ms` for the first.
    pub fn step(&mut self, decision: Option<Decision>, wait_ms: u64) -> Result<Vec<TrialEvent>, RunnerError> {
        let running = self.running.as_ref().ok_or(RunnerError::NotStarted)?;
        let running = running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(decision) = decision {
            let _ = running.decisions.send(decision);
        }
        let mut events = match running.events.recv_timeout(Duration::from_millis(wait_ms)) {
            Ok(event) => vec![event],
            Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
            Err(RecvTimeoutError::Disconnected) => vec![TrialEvent::Failed("the trial's thread is gone".into())],
        };
        events.extend(running.events.try_iter());
        let ended = events.iter().any(TrialEvent::ends_the_run);
        drop(running);
        if ended {
            self.running = None;
        }
        Ok(events)
    }
}

/// The trial's thread: runs the trainable and says how it ended.
fn run_to_end(setup: TrialSetup, run: TrainableFn, events: Sender<TrialEvent>, decisions: Receiver<Decision>) {
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut context = context(setup, events.clone(), decisions)?;
        let config = context.config.clone();
        let returned = run(&config, &mut context);
        Ok::<_, TuneError>((returned, context.stopped))
    }));
    let event = match ended {
        Ok(Ok((_, true))) => TrialEvent::Stopped,
        Ok(Ok((Ok(()), false))) => TrialEvent::Finished,
        Ok(Ok((Err(error), false))) => TrialEvent::Failed(error.to_string()),
        Ok(Err(error)) => TrialEvent::Failed(error.to_string()),
        Err(panic) => TrialEvent::Failed(format!(
            "the trainable panicked: {}",
            raylet::error::panic_message(panic.as_ref())
        )),
    };
    let _ = events.send(event);
}

/// The trial's context, with its starting checkpoint in place.
fn context(
    setup: TrialSetup,
    events: Sender<TrialEvent>,
    decisions: Receiver<Decision>,
) -> Result<TrialContext, TuneError> {
    let config: TrialConfig = serde_json::from_str(&setup.config_json)
        .map_err(|e| TuneError::InvalidConfig(format!("the trial's config does not decode: {e}")))?;
    let directory = setup.directory;
    directory.prepare()?;
    let (resume_from, iteration) = match setup.start_from {
        StartFrom::Scratch => (None, 0),
        StartFrom::Checkpoint { checkpoint, iteration } => (Some(checkpoint), iteration),
        StartFrom::Donor {
            packed,
            iteration,
            metrics,
        } => (Some(packed.get()?.unpack(&directory, iteration, &metrics)?), iteration),
    };
    let now = Instant::now();
    Ok(TrialContext {
        trial_id: setup.trial_id,
        config,
        directory,
        resume_from,
        iteration,
        time_before: setup.time_before,
        started: now,
        last_report: now,
        events,
        decisions,
        stopped: false,
    })
}
