//! Asynchronous successive halving (ASHA): rungs at `grace_period` times
//! powers of `reduction_factor`; a trial reaching a rung goes on only if
//! its score is in the top 1/`reduction_factor` of those recorded there so
//! far, and every trial stops at `max_t`. Nothing waits for stragglers.

use std::collections::HashMap;

use raylet_train::Metrics;

use super::{Decision, Objective, SchedulerContext, TrialScheduler, quantile, time_of};
use crate::{Mode, TuneError};

/// The ASHA scheduler (one bracket, as Ray's default).
#[derive(Clone, Debug)]
pub struct Asha {
    objective: Objective,
    time_attr: String,
    max_t: f64,
    grace_period: f64,
    reduction_factor: f64,
    /// Milestones, highest first, with each trial's score there.
    rungs: Vec<(f64, HashMap<String, f64>)>,
}

impl Asha {
    /// Ray's defaults: `max_t` 100, `grace_period` 1, `reduction_factor` 4,
    /// time in `training_iteration`.
    pub fn new() -> Self {
        Asha {
            objective: Objective::default(),
            time_attr: "training_iteration".into(),
            max_t: 100.0,
            grace_period: 1.0,
            reduction_factor: 4.0,
            rungs: Vec::new(),
        }
    }

    /// Ranks by `metric` in `mode` instead of the experiment's objective.
    pub fn objective(mut self, metric: &str, mode: Mode) -> Self {
        self.objective = Objective::new(Some(metric.into()), Some(mode));
        self
    }

    /// The result field that measures a trial's progress.
    pub fn time_attr(mut self, attr: &str) -> Self {
        self.time_attr = attr.into();
        self
    }

    /// Every trial stops once it reaches this much time.
    pub fn max_t(mut self, max_t: f64) -> Self {
        self.max_t = max_t;
        self
    }

    /// No trial stops before this much time.
    pub fn grace_period(mut self, grace_period: f64) -> Self {
        self.grace_period = grace_period;
        self
    }

    /// One trial in this many goes on at each rung.
    pub fn reduction_factor(mut self, factor: f64) -> Self {
        self.reduction_factor = factor;
        self
    }

    /// The rung milestones, highest first.
    pub fn milestones(&self) -> Vec<f64> {
        self.rungs.iter().map(|(milestone, _)| *milestone).collect()
    }
}

impl Default for Asha {
    fn default() -> Self {
        Self::new()
    }
}

impl TrialScheduler for Asha {
    fn setup(&mut self, metric: Option<&str>, mode: Mode) -> Result<(), TuneError> {
        self.objective.setup("ASHA", metric, mode)?;
        if !(self.grace_period > 0.0 && self.grace_period <= self.max_t && self.reduction_factor > 1.0) {
            return Err(TuneError::InvalidConfig(format!(
                "ASHA needs 0 < grace_period ({}) <= max_t ({}) and reduction_factor ({}) > 1",
                self.grace_period, self.max_t, self.reduction_factor
            )));
        }
        let rung_count = ((self.max_t / self.grace_period).ln() / self.reduction_factor.ln() + 1.0) as i32;
        self.rungs = (0..rung_count)
            .rev()
            .map(|k| (self.grace_period * self.reduction_factor.powi(k), HashMap::new()))
            .collect();
        Ok(())
    }

    fn on_trial_result(&mut self, _context: &mut SchedulerContext<'_>, trial: &str, result: &Metrics) -> Decision {
        self.record(trial, result)
    }

    fn restore_result(&mut self, trial: &str, result: &Metrics) {
        self.record(trial, result);
    }
}

impl Asha {
    /// Records `result` at the rung it reaches first, and decides whether
    /// the trial goes on.
    fn record(&mut self, trial: &str, result: &Metrics) -> Decision {
        let time = time_of(result, &self.time_attr);
        let Some(score) = self.objective.score(result) else {
            return Decision::Continue;
        };
        let mut decision = Decision::Continue;
        for (milestone, recorded) in &mut self.rungs {
            if time < *milestone || recorded.contains_key(trial) {
                continue;
            }
            let scores: Vec<f64> = recorded.values().copied().collect();
            if let Some(cutoff) = quantile(&scores, 1.0 - 1.0 / self.reduction_factor)
                && score < cutoff
            {
                decision = Decision::Stop;
            }
            recorded.insert(trial.to_string(), score);
            break;
        }
        if time >= self.max_t {
            decision = Decision::Stop;
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::scripted::{feed, result, running_trials};

    fn asha(max_t: f64, grace: f64, factor: f64) -> Asha {
        let mut asha = Asha::new().max_t(max_t).grace_period(grace).reduction_factor(factor);
        asha.setup(Some("score"), Mode::Max).unwrap();
        asha
    }

    #[test]
    fn rungs_sit_at_the_grace_period_times_powers_of_the_factor() {
        assert_eq!(asha(100.0, 1.0, 4.0).milestones(), vec![64.0, 16.0, 4.0, 1.0]);
        assert_eq!(asha(9.0, 1.0, 3.0).milestones(), vec![9.0, 3.0, 1.0]);
    }

    #[test]
    fn a_trial_goes_on_only_in_the_top_part_of_its_rung() {
        let mut asha = asha(9.0, 1.0, 3.0);
        let trials = running_trials(6);
        let decide =
            |asha: &mut Asha, trial: &str, iteration, value| feed(asha, &trials, trial, &result(iteration, value)).0;
        assert_eq!(
            decide(&mut asha, "t0", 1, 0.5),
            Decision::Continue,
            "the first at a rung always goes on"
        );
        assert_eq!(
            decide(&mut asha, "t1", 1, 0.4),
            Decision::Stop,
            "below the top third of [0.5]"
        );
        assert_eq!(decide(&mut asha, "t2", 1, 0.9), Decision::Continue);
        // Rung 1 holds 0.5, 0.4, 0.9: the cutoff is their 2/3 quantile, 0.633.
        assert_eq!(decide(&mut asha, "t3", 1, 0.6), Decision::Stop);
        assert_eq!(decide(&mut asha, "t4", 1, 0.7), Decision::Continue);
        assert_eq!(
            decide(&mut asha, "t0", 2, 0.1),
            Decision::Continue,
            "between rungs nothing is judged"
        );
        assert_eq!(decide(&mut asha, "t0", 3, 0.55), Decision::Continue, "first at rung 3");
        assert_eq!(
            decide(&mut asha, "t2", 3, 0.5),
            Decision::Stop,
            "below t0's 0.55 at rung 3"
        );
        assert_eq!(decide(&mut asha, "t4", 3, 0.8), Decision::Continue);
        assert_eq!(
            decide(&mut asha, "t4", 9, 0.95),
            Decision::Stop,
            "every trial stops at max_t"
        );
    }

    #[test]
    fn a_restored_asha_cuts_at_the_rungs_the_replayed_results_filled() {
        let trials = running_trials(4);
        let mut restored = asha(9.0, 1.0, 3.0);
        for (trial, value) in [("t0", 0.5), ("t1", 0.9), ("t2", 0.7)] {
            restored.restore_result(trial, &result(1, value));
        }
        assert_eq!(
            feed(&mut restored, &trials, "t3", &result(1, 0.75)).0,
            Decision::Stop,
            "below the 2/3 quantile (0.767) of the replayed 0.5, 0.9, 0.7"
        );
        let mut fresh = asha(9.0, 1.0, 3.0);
        assert_eq!(
            feed(&mut fresh, &trials, "t3", &result(1, 0.75)).0,
            Decision::Continue,
            "an empty rung lets it on"
        );
    }

    #[test]
    fn min_mode_keeps_the_lowest() {
        let mut asha = Asha::new().max_t(9.0).reduction_factor(3.0);
        asha.setup(Some("score"), Mode::Min).unwrap();
        let trials = running_trials(2);
        assert_eq!(feed(&mut asha, &trials, "t0", &result(1, 0.5)).0, Decision::Continue);
        assert_eq!(feed(&mut asha, &trials, "t1", &result(1, 0.7)).0, Decision::Stop);
    }

    #[test]
    fn without_a_metric_asha_refuses_to_start() {
        let error = Asha::new().setup(None, Mode::Max).unwrap_err().to_string();
        assert!(error.contains("ASHA needs a metric"), "{error}");
    }
}
