//! First in, first out: every trial runs to its end, in the order made.

use raylet_train::Metrics;

use super::{Decision, SchedulerContext, TrialScheduler};
use crate::{Mode, TuneError};

/// Runs every trial to its end.
#[derive(Clone, Debug, Default)]
pub struct Fifo;

impl TrialScheduler for Fifo {
    fn setup(&mut self, _metric: Option<&str>, _mode: Mode) -> Result<(), TuneError> {
        Ok(())
    }

    fn on_trial_result(&mut self, _context: &mut SchedulerContext<'_>, _trial: &str, _result: &Metrics) -> Decision {
        Decision::Continue
    }
}
