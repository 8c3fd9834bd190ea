//! The median stopping rule: after a grace period, a trial whose best
//! score so far is below the median of the other trials' running means
//! at the same time is stopped (Google Vizier's rule, as Ray has it).

use std::collections::HashMap;

use raylet_train::Metrics;

use super::{Decision, Objective, SchedulerContext, TrialScheduler, quantile, time_of};
use crate::{Mode, TuneError};

/// The median stopping rule.
#[derive(Clone, Debug)]
pub struct MedianStopping {
    objective: Objective,
    time_attr: String,
    grace_period: f64,
    min_samples_required: usize,
    hard_stop: bool,
    /// Every trial's (time, score) results so far.
    results: HashMap<String, Vec<(f64, f64)>>,
}

impl MedianStopping {
    /// Ray's defaults: time in `time_total_s`, a grace period of 60, at
    /// least 3 other trials to compare with, and poor trials stopped.
    pub fn new() -> Self {
        MedianStopping {
            objective: Objective::default(),
            time_attr: "time_total_s".into(),
            grace_period: 60.0,
            min_samples_required: 3,
            hard_stop: true,
            results: HashMap::new(),
        }
    }

    pub fn objective(mut self, metric: &str, mode: Mode) -> Self {
        self.objective = Objective::new(Some(metric.into()), Some(mode));
        self
    }

    pub fn time_attr(mut self, attr: &str) -> Self {
        self.time_attr = attr.into();
        self
    }

    /// No trial stops before this much time.
    pub fn grace_period(mut self, grace_period: f64) -> Self {
        self.grace_period = grace_period;
        self
    }

    /// How many other trials must have reached the same time to compare.
    pub fn min_samples_required(mut self, samples: usize) -> Self {
        self.min_samples_required = samples;
        self
    }

    /// Pause poor trials instead of stopping them.
    pub fn pause_instead_of_stop(mut self) -> Self {
        self.hard_stop = false;
        self
    }

    /// The mean score of `results` up to `time`.
    fn running_mean(results: &[(f64, f64)], time: f64) -> Option<f64> {
        let scores: Vec<f64> = results.iter().filter(|(t, _)| *t <= time).map(|(_, s)| *s).collect();
        (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64)
    }
}

impl Default for MedianStopping {
    fn default() -> Self {
        Self::new()
    }
}

impl TrialScheduler for MedianStopping {
    fn setup(&mut self, metric: Option<&str>, mode: Mode) -> Result<(), TuneError> {
        self.objective.setup("median stopping", metric, mode)
    }

    fn on_trial_result(&mut self, _context: &mut SchedulerContext<'_>, trial: &str, result: &Metrics) -> Decision {
        let Some((time, _)) = self.record(trial, result) else {
            return Decision::Continue;
        };
        let own = &self.results[trial];
        let best = own.iter().map(|(_, s)| *s).fold(f64::NEG_INFINITY, f64::max);
        if time < self.grace_period {
            return Decision::Continue;
        }
        let others: Vec<f64> = self
            .results
            .iter()
            .filter(|(id, results)| id.as_str() != trial && results.last().is_some_and(|(t, _)| *t >= time))
            .filter_map(|(_, results)| Self::running_mean(results, time))
            .collect();
        if others.len() < self.min_samples_required {
            return Decision::Continue;
        }
        match quantile(&others, 0.5) {
            Some(median) if best < median && self.hard_stop => Decision::Stop,
            Some(median) if best < median => Decision::Pause,
            _ => Decision::Continue,
        }
    }

    fn restore_result(&mut self, trial: &str, result: &Metrics) {
        self.record(trial, result);
    }
}

impl MedianStopping {
    /// Adds `result` to the trial's history: its time and score, if it has a score.
    fn record(&mut self, trial: &str, result: &Metrics) -> Option<(f64, f64)> {
        let score = self.objective.score(result)?;
        let time = time_of(result, &self.time_attr);
        self.results.entry(trial.to_string()).or_default().push((time, score));
        Some((time, score))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::scripted::{feed, result, running_trials};

    #[test]
    fn a_trial_below_the_median_of_the_others_running_means_stops_after_the_grace_period() {
        let mut rule = MedianStopping::new().time_attr("training_iteration").grace_period(2.0);
        rule.setup(Some("score"), Mode::Max).unwrap();
        let trials = running_trials(4);
        for (trial, scores) in [("t0", [1.0, 3.0]), ("t1", [2.0, 4.0]), ("t2", [3.0, 5.0])] {
            for (i, score) in scores.iter().enumerate() {
                assert_eq!(
                    feed(&mut rule, &trials, trial, &result(i as u64 + 1, *score)).0,
                    Decision::Continue
                );
            }
        }
        // Running means at time 2: 2, 3, 4; their median is 3.
        assert_eq!(
            feed(&mut rule, &trials, "t3", &result(1, 2.5)).0,
            Decision::Continue,
            "in the grace period"
        );
        assert_eq!(
            feed(&mut rule, &trials, "t3", &result(2, 2.9)).0,
            Decision::Stop,
            "best 2.9 < median 3"
        );

        let mut lenient = MedianStopping::new().time_attr("training_iteration").grace_period(2.0);
        lenient.setup(Some("score"), Mode::Max).unwrap();
        for (trial, score) in [("t0", 1.0), ("t1", 2.0)] {
            feed(&mut lenient, &trials, trial, &result(2, score));
        }
        assert_eq!(
            feed(&mut lenient, &trials, "t3", &result(2, 0.0)).0,
            Decision::Continue,
            "fewer than 3 others to compare with"
        );
    }

    #[test]
    fn a_restored_rule_compares_with_the_replayed_running_means() {
        let mut rule = MedianStopping::new().time_attr("training_iteration").grace_period(2.0);
        rule.setup(Some("score"), Mode::Max).unwrap();
        for (trial, scores) in [("t0", [1.0, 3.0]), ("t1", [2.0, 4.0]), ("t2", [3.0, 5.0])] {
            for (i, score) in scores.iter().enumerate() {
                rule.restore_result(trial, &result(i as u64 + 1, *score));
            }
        }
        assert_eq!(
            feed(&mut rule, &running_trials(4), "t3", &result(2, 2.9)).0,
            Decision::Stop,
            "best 2.9 < median 3 of the replayed running means"
        );
    }
}
