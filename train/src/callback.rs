//! Hooks into a run's life, as Ray's `RunConfig(callbacks=[...])`: a
//! [`TrainCallback`] given to [`Trainer::callback`](crate::Trainer::callback)
//! is told when the run starts, of each of rank 0's reports and
//! checkpoints as the driver gets them, and how the run ended. Callbacks
//! run on the driver's thread, in the order they were given; one that
//! returns an error ends the run with that error (no restart).

use std::path::Path;

use crate::{Checkpoint, Report, ScalingConfig, TrainError, TrainResult};

/// What a callback is told when a run starts.
#[derive(Clone, Debug)]
pub struct RunStart<'a> {
    /// The run's name.
    pub name: &'a str,
    /// The train loop's fields (the run's configuration), as JSON.
    pub config: serde_json::Value,
    pub scaling: &'a ScalingConfig,
    /// The run's directory (its local copy, for a run in object storage).
    pub directory: &'a Path,
}

/// Something told of a run's progress: a tracker, a logger, a notifier.
/// Every hook does nothing unless implemented.
pub trait TrainCallback: Send {
    /// The run starts (or resumes), before its workers are placed.
    fn on_start(&mut self, _run: &RunStart<'_>) -> Result<(), TrainError> {
        Ok(())
    }

    /// Rank 0 reported.
    fn on_report(&mut self, _report: &Report) -> Result<(), TrainError> {
        Ok(())
    }

    /// Rank 0 reported `checkpoint` with report `index` (after
    /// [`on_report`](TrainCallback::on_report) for that report); it is
    /// committed in the run's directory.
    fn on_checkpoint(&mut self, _index: u64, _checkpoint: &Checkpoint) -> Result<(), TrainError> {
        Ok(())
    }

    /// The run ended: with its result, or with the error `fit` returns.
    fn on_end(&mut self, _outcome: Result<&TrainResult, &TrainError>) -> Result<(), TrainError> {
        Ok(())
    }
}

/// A run's callbacks, called in order; the first error stops the round.
#[derive(Default)]
pub(crate) struct Callbacks(Vec<Box<dyn TrainCallback>>);

impl Callbacks {
    pub(crate) fn push(&mut self, callback: Box<dyn TrainCallback>) {
        self.0.push(callback);
    }

    /// Tells every callback that the run starts; `run` is made only when
    /// there is one to tell.
    pub(crate) fn start<'a>(
        &mut self,
        run: impl FnOnce() -> Result<RunStart<'a>, TrainError>,
    ) -> Result<(), TrainError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let run = run()?;
        self.each(|callback| callback.on_start(&run))
    }

    /// Tells every callback of a report, then of its checkpoint.
    pub(crate) fn report(&mut self, report: &Report) -> Result<(), TrainError> {
        self.each(|callback| {
            callback.on_report(report)?;
            match &report.checkpoint {
                Some(checkpoint) => callback.on_checkpoint(report.index, checkpoint),
                None => Ok(()),
            }
        })
    }

    /// Tells every callback how the run ended; the run's own error comes
    /// first, then a callback's.
    pub(crate) fn end(&mut self, outcome: Result<TrainResult, TrainError>) -> Result<TrainResult, TrainError> {
        let ended = self.each(|callback| callback.on_end(outcome.as_ref()));
        let result = outcome?;
        ended.map(|()| result)
    }

    fn each(
        &mut self,
        mut call: impl FnMut(&mut dyn TrainCallback) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|callback| call(callback.as_mut()))
    }
}
