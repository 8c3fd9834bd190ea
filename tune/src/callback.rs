//! Hooks into an experiment's life, as Ray Tune's `Callback`s given in
//! `RunConfig(callbacks=[...])`: a [`Callback`] given to
//! [`Tuner::callback`](crate::Tuner::callback) is told when the experiment
//! starts, when each trial starts (again after a pause or a failure), of
//! its results and checkpoints, how each trial ended, and when the
//! experiment ends. Callbacks run on the driver's thread, in the order they
//! were given; one that returns an error ends the experiment with it.

use std::path::Path;

use raylet_train::{Checkpoint, Metrics};

use crate::{Mode, TrialView, TuneError};

/// What a callback is told when an experiment starts (or is restored).
#[derive(Clone, Copy, Debug)]
pub struct ExperimentStart<'a> {
    /// The experiment's name.
    pub name: &'a str,
    /// Its directory (of an experiment in object storage: this node's copy).
    pub directory: &'a Path,
    /// The metric searchers and schedulers optimize, and which way.
    pub metric: Option<&'a str>,
    pub mode: Mode,
}

/// Something told of an experiment's progress: a tracker, a logger, a
/// notifier. Every hook does nothing unless implemented.
pub trait Callback: Send {
    fn on_experiment_start(&mut self, _experiment: &ExperimentStart<'_>) -> Result<(), TuneError> {
        Ok(())
    }

    /// A trial's run starts: the first time, or resumed after a pause or a
    /// failure.
    fn on_trial_start(&mut self, _trial: &TrialView) -> Result<(), TuneError> {
        Ok(())
    }

    /// A trial reported `result` (`trial` shows it as its last result).
    fn on_trial_result(&mut self, _trial: &TrialView, _result: &Metrics) -> Result<(), TuneError> {
        Ok(())
    }

    /// A trial reported `checkpoint` with its last result.
    fn on_checkpoint(&mut self, _trial: &TrialView, _checkpoint: &Checkpoint) -> Result<(), TuneError> {
        Ok(())
    }

    /// A trial ended for good: finished, or stopped by a scheduler or stopper.
    fn on_trial_complete(&mut self, _trial: &TrialView) -> Result<(), TuneError> {
        Ok(())
    }

    /// A trial ended for good with `error`, having failed more often than
    /// it may.
    fn on_trial_error(&mut self, _trial: &TrialView, _error: &str) -> Result<(), TuneError> {
        Ok(())
    }

    /// The experiment ended: with every trial as it is now, and the error
    /// the search ends with, if any.
    fn on_experiment_end(&mut self, _trials: &[&TrialView], _error: Option<&TuneError>) -> Result<(), TuneError> {
        Ok(())
    }
}

/// An experiment's callbacks, called in order; the first error stops the
/// round.
#[derive(Default)]
pub(crate) struct Callbacks(Vec<Box<dyn Callback>>);

impl Callbacks {
    pub(crate) fn push(&mut self, callback: Box<dyn Callback>) {
        self.0.push(callback);
    }

    /// Calls `hook` on every callback.
    pub(crate) fn each(
        &mut self,
        mut hook: impl FnMut(&mut dyn Callback) -> Result<(), TuneError>,
    ) -> Result<(), TuneError> {
        self.0.iter_mut().try_for_each(|callback| hook(callback.as_mut()))
    }

    /// Tells every callback of a result and of the checkpoint with it.
    pub(crate) fn result(
        &mut self,
        trial: &TrialView,
        result: &Metrics,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), TuneError> {
        self.each(|callback| {
            callback.on_trial_result(trial, result)?;
            checkpoint.map_or(Ok(()), |checkpoint| callback.on_checkpoint(trial, checkpoint))
        })
    }

    /// Tells every callback that a trial ended for good, by its status.
    pub(crate) fn trial_end(&mut self, trial: &TrialView, error: Option<&str>) -> Result<(), TuneError> {
        self.each(|callback| match error {
            Some(error) => callback.on_trial_error(trial, error),
            None => callback.on_trial_complete(trial),
        })
    }
}
