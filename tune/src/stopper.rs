//! Stoppers: rules outside the scheduler that end a trial (after enough
//! iterations, on a plateau, past a threshold) or the whole experiment
//! (after a timeout).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use raylet_train::Metrics;

use crate::Mode;

/// Decides, after each result, whether a trial or the experiment is done.
pub trait Stopper: Send {
    /// Whether `trial`, which just reported `result`, is done.
    fn should_stop_trial(&mut self, trial: &str, result: &Metrics) -> bool;

    /// Whether the whole experiment is done: its running trials stop and
    /// no new ones start.
    fn should_stop_experiment(&mut self) -> bool {
        false
    }
}

/// Stops each trial after `max` iterations.
#[derive(Clone, Debug)]
pub struct MaxIterations(pub u64);

impl Stopper for MaxIterations {
    fn should_stop_trial(&mut self, _trial: &str, result: &Metrics) -> bool {
        result.get("training_iteration").unwrap_or(0.0) >= self.0 as f64
    }
}

/// Stops a trial once `metric` reaches `threshold` (at or above it in
/// `Max` mode, at or below it in `Min` mode).
#[derive(Clone, Debug)]
pub struct MetricThreshold {
    pub metric: String,
    pub threshold: f64,
    pub mode: Mode,
}

impl Stopper for MetricThreshold {
    fn should_stop_trial(&mut self, _trial: &str, result: &Metrics) -> bool {
        match (result.get(&self.metric), self.mode) {
            (Some(value), Mode::Max) => value >= self.threshold,
            (Some(value), Mode::Min) => value <= self.threshold,
            (None, _) => false,
        }
    }
}

/// Stops a trial whose `metric` has plateaued: after `grace_period`
/// results, when the standard deviation of its last `num_results` is
/// below `std`.
#[derive(Clone, Debug)]
pub struct TrialPlateau {
    metric: String,
    std: f64,
    num_results: usize,
    grace_period: usize,
    history: HashMap<String, Vec<f64>>,
}

impl TrialPlateau {
    /// Ray's defaults: a standard deviation below 0.01 over the last 4
    /// results, after at least 4.
    pub fn new(metric: &str) -> Self {
        TrialPlateau {
            metric: metric.to_string(),
            std: 0.01,
            num_results: 4,
            grace_period: 4,
            history: HashMap::new(),
        }
    }

    pub fn std(mut self, std: f64) -> Self {
        self.std = std;
        self
    }

    pub fn num_results(mut self, results: usize) -> Self {
        self.num_results = results.max(1);
        self
    }

    pub fn grace_period(mut self, results: usize) -> Self {
        self.grace_period = results;
        self
    }
}

impl Stopper for TrialPlateau {
    fn should_stop_trial(&mut self, trial: &str, result: &Metrics) -> bool {
        let Some(value) = result.get(&self.metric) else {
            return false;
        };
        let history = self.history.entry(trial.to_string()).or_default();
        history.push(value);
        if history.len() < self.grace_period.max(self.num_results) {
            return false;
        }
        let last = &history[history.len() - self.num_results..];
        let mean = last.iter().sum::<f64>() / last.len() as f64;
        let variance = last.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / last.len() as f64;
        variance.sqrt() < self.std
    }
}

/// Ends the experiment once `limit` has passed since it started.
#[derive(Clone, Debug)]
pub struct Timeout {
    limit: Duration,
    started: Option<Instant>,
}

impl Timeout {
    pub fn new(limit: Duration) -> Self {
        Timeout { limit, started: None }
    }
}

impl Stopper for Timeout {
    fn should_stop_trial(&mut self, _trial: &str, _result: &Metrics) -> bool {
        false
    }

    /// The experiment asks first as it starts: the clock starts then.
    fn should_stop_experiment(&mut self) -> bool {
        self.started.get_or_insert_with(Instant::now).elapsed() >= self.limit
    }
}

/// Every stopper of a list: a trial or the experiment stops when any says so.
#[derive(Default)]
pub struct AnyOf(pub Vec<Box<dyn Stopper>>);

impl Stopper for AnyOf {
    fn should_stop_trial(&mut self, trial: &str, result: &Metrics) -> bool {
        let mut stop = false;
        for stopper in &mut self.0 {
            stop |= stopper.should_stop_trial(trial, result);
        }
        stop
    }

    fn should_stop_experiment(&mut self) -> bool {
        self.0.iter_mut().any(|stopper| stopper.should_stop_experiment())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(iteration: u64, loss: f64) -> Metrics {
        Metrics::new()
            .with("training_iteration", iteration as f64)
            .with("loss", loss)
    }

    #[test]
    fn max_iterations_and_thresholds_stop_a_trial() {
        assert!(!MaxIterations(3).should_stop_trial("t", &at(2, 1.0)));
        assert!(MaxIterations(3).should_stop_trial("t", &at(3, 1.0)));
        let mut threshold = MetricThreshold {
            metric: "loss".into(),
            threshold: 0.1,
            mode: Mode::Min,
        };
        assert!(!threshold.should_stop_trial("t", &at(1, 0.2)));
        assert!(threshold.should_stop_trial("t", &at(2, 0.1)));
    }

    #[test]
    fn a_plateau_stops_a_trial_after_its_grace_period() {
        let mut plateau = TrialPlateau::new("loss").num_results(3).grace_period(3).std(0.01);
        let losses = [1.0, 0.5, 0.3, 0.301, 0.302, 0.3];
        let stops: Vec<bool> = losses
            .iter()
            .enumerate()
            .map(|(i, loss)| plateau.should_stop_trial("t", &at(i as u64 + 1, *loss)))
            .collect();
        assert_eq!(stops, [false, false, false, false, true, true]);
        assert!(
            !plateau.should_stop_trial("other", &at(1, 0.3)),
            "each trial has its own history"
        );
    }

    #[test]
    fn a_timeout_ends_the_experiment() {
        let mut timeout = Timeout::new(Duration::from_millis(20));
        assert!(
            !timeout.should_stop_experiment(),
            "the clock starts at the first question"
        );
        std::thread::sleep(Duration::from_millis(30));
        let mut any = AnyOf(vec![Box::new(MaxIterations(100)), Box::new(timeout)]);
        assert!(any.should_stop_experiment());
    }
}
