//! Trial schedulers: after each result they decide whether the trial goes
//! on, pauses or stops, and they may stop, resume or re-seed other trials.
//! FIFO lets every trial run; ASHA, HyperBand and median stopping end poor
//! trials early; PBT copies good trials into poor ones and perturbs them.

mod asha;
mod fifo;
mod hyperband;
mod median_stopping;
mod pbt;

pub use asha::Asha;
pub use fifo::Fifo;
pub use hyperband::HyperBand;
pub use median_stopping::MedianStopping;
pub use pbt::PopulationBasedTraining;

use raylet_train::Metrics;

use crate::{Mode, TrialConfig, TrialStatus, TrialView, TuneError};

/// What happens to a trial after its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Decision {
    Continue,
    /// Stop it for now, keeping its latest checkpoint; a scheduler resumes it.
    Pause,
    /// Stop it for good.
    Stop,
}

/// What a scheduler asks for besides its decision on the reporting trial.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Stop this trial for good.
    Stop(String),
    /// Let this paused trial run again, from its latest checkpoint.
    Resume(String),
    /// Restart `trial` from `donor`'s latest checkpoint with `config` (PBT).
    Exploit {
        trial: String,
        donor: String,
        config: TrialConfig,
    },
}

/// The trials a scheduler sees, and the actions it asks for.
pub struct SchedulerContext<'a> {
    trials: Vec<&'a TrialView>,
    actions: Vec<Action>,
}

impl<'a> SchedulerContext<'a> {
    pub fn new(trials: impl IntoIterator<Item = &'a TrialView>) -> Self {
        SchedulerContext {
            trials: trials.into_iter().collect(),
            actions: Vec::new(),
        }
    }

    /// Every trial, in the order they were made.
    pub fn trials(&self) -> &[&'a TrialView] {
        &self.trials
    }

    pub fn trial(&self, id: &str) -> Option<&'a TrialView> {
        self.trials.iter().find(|trial| trial.id == id).copied()
    }

    pub fn stop(&mut self, trial: &str) {
        self.actions.push(Action::Stop(trial.to_string()));
    }

    pub fn resume(&mut self, trial: &str) {
        self.actions.push(Action::Resume(trial.to_string()));
    }

    pub fn exploit(&mut self, trial: &str, donor: &str, config: TrialConfig) {
        self.actions.push(Action::Exploit {
            trial: trial.to_string(),
            donor: donor.to_string(),
            config,
        });
    }

    /// The actions asked for, in order.
    pub fn into_actions(self) -> Vec<Action> {
        self.actions
    }
}

/// Decides, after each result, what happens to trials.
pub trait TrialScheduler: Send {
    /// Takes the experiment's metric and mode (a scheduler given its own
    /// keeps those); fails when it has no metric and needs one.
    fn setup(&mut self, metric: Option<&str>, mode: Mode) -> Result<(), TuneError>;

    /// A trial was made.
    fn on_trial_add(&mut self, _context: &mut SchedulerContext<'_>, _trial: &str) {}

    /// A running trial reported `result`.
    fn on_trial_result(&mut self, context: &mut SchedulerContext<'_>, trial: &str, result: &Metrics) -> Decision;

    /// A result `trial` reported before the experiment was interrupted,
    /// replayed on a restore in the order it came: record it as
    /// `on_trial_result` would, without deciding anything.
    fn restore_result(&mut self, _trial: &str, _result: &Metrics) {}

    /// A trial ended for good (finished, stopped or failed), with its last
    /// result if it has one.
    fn on_trial_complete(&mut self, _context: &mut SchedulerContext<'_>, _trial: &str, _result: Option<&Metrics>) {}

    /// Which waiting trial starts next in a free slot: by default the
    /// oldest pending one.
    fn choose_trial_to_run(&mut self, context: &SchedulerContext<'_>) -> Option<String> {
        context
            .trials()
            .iter()
            .find(|trial| trial.status == TrialStatus::Pending)
            .map(|trial| trial.id.clone())
    }
}

/// The metric and mode a scheduler ranks by: its own, else the experiment's.
#[derive(Clone, Debug, Default)]
pub(crate) struct Objective {
    metric: Option<String>,
    mode: Option<Mode>,
}

impl Objective {
    pub(crate) fn new(metric: Option<String>, mode: Option<Mode>) -> Self {
        Objective { metric, mode }
    }

    /// Fills what the scheduler was not given from the experiment.
    pub(crate) fn setup(&mut self, scheduler: &str, metric: Option<&str>, mode: Mode) -> Result<(), TuneError> {
        if self.metric.is_none() {
            self.metric = metric.map(str::to_string);
        }
        self.mode.get_or_insert(mode);
        match self.metric {
            Some(_) => Ok(()),
            None => Err(TuneError::InvalidConfig(format!(
                "{scheduler} needs a metric: set TuneConfig::metric or give the scheduler one"
            ))),
        }
    }

    /// The result's metric, higher always better.
    pub(crate) fn score(&self, result: &Metrics) -> Option<f64> {
        let value = result.get(self.metric.as_deref()?)?;
        match self.mode.unwrap_or_default() {
            Mode::Max => Some(value),
            Mode::Min => Some(-value),
        }
    }
}

/// The `q`-th quantile (0..=1) of `values`, interpolated as numpy's
/// `percentile` does.
pub(crate) fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let position = q * (sorted.len() - 1) as f64;
    let (below, above) = (position.floor() as usize, position.ceil() as usize);
    Some(sorted[below] + (sorted[above] - sorted[below]) * (position - below as f64))
}

/// The result's value of `time_attr`.
pub(crate) fn time_of(result: &Metrics, time_attr: &str) -> f64 {
    result.get(time_attr).unwrap_or(0.0)
}

#[cfg(test)]
pub(crate) mod scripted {
    //! Scripted trials for scheduler tests: results are fed in by hand.

    use super::*;

    /// Trials `t0`, `t1`, ... with an empty config, all running.
    pub(crate) fn running_trials(count: usize) -> Vec<TrialView> {
        (0..count)
            .map(|i| {
                let mut trial = TrialView::pending(format!("t{i}"), TrialConfig::new());
                trial.status = TrialStatus::Running;
                trial
            })
            .collect()
    }

    pub(crate) fn result(iteration: u64, value: f64) -> Metrics {
        Metrics::new()
            .with("training_iteration", iteration as f64)
            .with("score", value)
    }

    /// Feeds one result; returns the decision and the actions.
    pub(crate) fn feed(
        scheduler: &mut dyn TrialScheduler,
        trials: &[TrialView],
        trial: &str,
        result: &Metrics,
    ) -> (Decision, Vec<Action>) {
        let mut context = SchedulerContext::new(trials);
        let decision = scheduler.on_trial_result(&mut context, trial, result);
        (decision, context.into_actions())
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.75), Some(3.25));
        assert_eq!(quantile(&[5.0], 0.75), Some(5.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
