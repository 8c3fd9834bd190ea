//! What a trainable sees: its trial's id and config, where to resume from,
//! and `report`, which sends a result (and a checkpoint) to the driver and
//! waits for the scheduler's decision; `fit_train_run` makes a
//! data-parallel Train run the trial.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use raylet_storage::StorageOptions;
use raylet_train::{Checkpoint, Metrics, RunConfig, RunDirectory, TrainError, TrainLoop, TrainResult, Trainer};

use crate::schedulers::Decision;
use crate::trial_event::TrialEvent;
use crate::{TrialConfig, TuneError};

/// The context of one run of a trial on its actor.
pub struct TrialContext {
    pub(crate) trial_id: String,
    pub(crate) config: TrialConfig,
    pub(crate) directory: RunDirectory,
    pub(crate) resume_from: Option<Checkpoint>,
    pub(crate) iteration: u64,
    pub(crate) time_before: f64,
    pub(crate) started: Instant,
    pub(crate) last_report: Instant,
    pub(crate) events: Sender<TrialEvent>,
    pub(crate) decisions: Receiver<Decision>,
    pub(crate) stopped: bool,
}

impl TrialContext {
    /// `trial_00042`.
    pub fn trial_id(&self) -> &str {
        &self.trial_id
    }

    pub fn config(&self) -> &TrialConfig {
        &self.config
    }

    /// How many results the trial reported, counting those before a pause
    /// or restart that it resumes from.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// The checkpoint to resume from: the trial's latest after a pause or a
    /// failure, or its donor's after a PBT exploit.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.resume_from.as_ref()
    }

    /// The trial's directory (results and checkpoints). Of an experiment in
    /// object storage, this is this node's copy, and only what Tune writes
    /// (results, committed checkpoints) is mirrored.
    pub fn trial_dir(&self) -> &Path {
        self.directory.root()
    }

    /// Where the trial is kept: its folder in object storage
    /// (`s3://bucket/prefix/experiment/trial_00000`) for an experiment
    /// there, else its directory. A Train run the trial starts can be kept
    /// under it (with [`TrialContext::storage_options`]).
    pub fn storage_path(&self) -> PathBuf {
        self.directory.location()
    }

    /// The options that open [`TrialContext::storage_path`] in object storage.
    pub fn storage_options(&self) -> StorageOptions {
        self.directory.storage_options()
    }

    /// An empty checkpoint directory to write into, then pass to
    /// [`TrialContext::report`].
    pub fn new_checkpoint(&self) -> Result<Checkpoint, TuneError> {
        Ok(self.directory.stage(0)?)
    }

    /// Runs `trainer` as this trial: the Train run is kept in the trial's
    /// directory (as `train`, in object storage too for an experiment
    /// there), rank 0's reports become the trial's, and a scheduler's stop
    /// ends the run; a resumed trial's run goes on from its latest
    /// checkpoint.
    pub fn fit_train_run<L: TrainLoop>(&mut self, trainer: Trainer<L>) -> Result<TrainResult, TrainError> {
        let run_config = RunConfig {
            name: "train".into(),
            storage_path: self.storage_path(),
            verbose: false,
            ..RunConfig::default()
        };
        trainer
            .run_config(run_config)
            .storage_options(self.storage_options())
            .fit_with_reports(|report| match self.report(report.metrics.clone(), None) {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            })
    }

    /// Sends `metrics` (with `training_iteration`, `time_total_s` and
    /// `time_this_iter_s` added) and a checkpoint written since
    /// [`TrialContext::new_checkpoint`] to the driver, then waits for the
    /// scheduler. Returns [`TuneError::TrialStopped`] once the trial is
    /// stopped or paused: return it (`?`) to end the trial.
    pub fn report(&mut self, mut metrics: Metrics, checkpoint: Option<Checkpoint>) -> Result<(), TuneError> {
        if self.stopped {
            discard(checkpoint)?;
            return Err(TuneError::TrialStopped);
        }
        self.iteration += 1;
        let now = Instant::now();
        metrics.insert("training_iteration", self.iteration as f64);
        metrics.insert("time_this_iter_s", (now - self.last_report).as_secs_f64());
        metrics.insert("time_total_s", self.time_before + (now - self.started).as_secs_f64());
        self.last_report = now;
        let checkpoint = match checkpoint {
            Some(staged) => Some(self.directory.commit(&staged, self.iteration, &metrics)?),
            None => None,
        };
        self.events
            .send(TrialEvent::Report { metrics, checkpoint })
            .map_err(|_| TuneError::TrialStopped)?;
        match self.decisions.recv() {
            Ok(Decision::Continue) => Ok(()),
            Ok(Decision::Pause | Decision::Stop) | Err(_) => {
                self.stopped = true;
                Err(TuneError::TrialStopped)
            }
        }
    }
}

fn discard(checkpoint: Option<Checkpoint>) -> Result<(), TuneError> {
    if let Some(staged) = checkpoint {
        std::fs::remove_dir_all(staged.path())
            .map_err(|e| TuneError::io(format!("removing {}", staged.path().display()), e))?;
    }
    Ok(())
}
