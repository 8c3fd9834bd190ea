//! Population based training: every `perturbation_interval`, a trial in
//! the bottom quantile restarts from a top trial's latest checkpoint
//! (exploit) with that trial's hyperparameters perturbed or redrawn
//! (explore).

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raylet_train::Metrics;
use serde_json::Value;

use super::{Decision, Objective, SchedulerContext, TrialScheduler, time_of};
use crate::search::Domain;
use crate::{Mode, TrialConfig, TuneError};

/// The PBT scheduler.
#[derive(Clone, Debug)]
pub struct PopulationBasedTraining {
    objective: Objective,
    time_attr: String,
    perturbation_interval: f64,
    quantile_fraction: f64,
    resample_probability: f64,
    perturbation_factors: (f64, f64),
    mutations: Vec<(String, Domain)>,
    rng: StdRng,
    last_perturbation: HashMap<String, f64>,
    last_score: HashMap<String, f64>,
}

impl PopulationBasedTraining {
    /// Ray's defaults: time in `time_total_s`, a perturbation every 60,
    /// the top and bottom quarter, a 25% chance to redraw a value, and
    /// perturbation factors 1.2 and 0.8.
    pub fn new() -> Self {
        PopulationBasedTraining {
            objective: Objective::default(),
            time_attr: "time_total_s".into(),
            perturbation_interval: 60.0,
            quantile_fraction: 0.25,
            resample_probability: 0.25,
            perturbation_factors: (1.2, 0.8),
            mutations: Vec::new(),
            rng: StdRng::seed_from_u64(rand::random()),
            last_perturbation: HashMap::new(),
            last_score: HashMap::new(),
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

    /// How much time passes between a trial's chances to exploit.
    pub fn perturbation_interval(mut self, interval: f64) -> Self {
        self.perturbation_interval = interval;
        self
    }

    /// The share of trials in the top and the bottom quantile (at most half).
    pub fn quantile_fraction(mut self, fraction: f64) -> Self {
        self.quantile_fraction = fraction;
        self
    }

    /// The chance that explore redraws a value instead of perturbing it.
    pub fn resample_probability(mut self, probability: f64) -> Self {
        self.resample_probability = probability;
        self
    }

    /// What explore multiplies a number by, one of the two at random.
    pub fn perturbation_factors(mut self, up: f64, down: f64) -> Self {
        self.perturbation_factors = (up, down);
        self
    }

    /// Lets explore change `path`: a `choice` moves to a neighbouring value,
    /// a range is multiplied by a perturbation factor (and kept within it),
    /// and either is redrawn with the resample probability.
    pub fn mutate(mut self, path: &str, domain: Domain) -> Self {
        self.mutations.push((path.to_string(), domain));
        self
    }

    /// Seeds the random choices of donors and perturbations.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = StdRng::seed_from_u64(seed);
        self
    }

    /// The bottom and top quantiles of the unfinished trials, by their
    /// score at their last perturbation.
    fn quantiles(&self, context: &SchedulerContext<'_>) -> (Vec<String>, Vec<String>) {
        let mut scored: Vec<(&String, f64)> = self
            .last_score
            .iter()
            .filter(|(id, _)| context.trial(id).is_some_and(|t| !t.status.is_finished()))
            .map(|(id, score)| (id, *score))
            .collect();
        if scored.len() <= 1 {
            return (Vec::new(), Vec::new());
        }
        scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
        let mut count = (scored.len() as f64 * self.quantile_fraction).ceil() as usize;
        if count > scored.len() / 2 {
            count = scored.len() / 2;
        }
        let ids: Vec<String> = scored.into_iter().map(|(id, _)| id.clone()).collect();
        (ids[..count].to_vec(), ids[ids.len() - count..].to_vec())
    }

    /// `config` with every mutable value perturbed or redrawn.
    pub fn explore(&mut self, config: &TrialConfig) -> TrialConfig {
        let mut explored = config.clone();
        for (path, domain) in &self.mutations {
            let current = config.value(path).cloned().unwrap_or(Value::Null);
            let resample = self.rng.random::<f64>() < self.resample_probability;
            let value = match domain {
                Domain::Choice(values) | Domain::Grid(values) => match values.iter().position(|v| *v == current) {
                    Some(index) if !resample => {
                        let shifted = match self.rng.random::<bool>() {
                            true => index + 1,
                            false => index.saturating_sub(1),
                        };
                        values[shifted.min(values.len() - 1)].clone()
                    }
                    _ => domain.sample(&explored, &mut self.rng),
                },
                _ if resample || !current.is_number() => domain.sample(&explored, &mut self.rng),
                _ => {
                    let factor = match self.rng.random::<bool>() {
                        true => self.perturbation_factors.0,
                        false => self.perturbation_factors.1,
                    };
                    perturbed(&current, factor, domain)
                }
            };
            explored.set(path, value);
        }
        explored
    }
}

/// `current` times `factor`, kept an integer if it was one and within the
/// domain's range.
fn perturbed(current: &Value, factor: f64, domain: &Domain) -> Value {
    match (current.as_i64(), domain) {
        (Some(whole), Domain::Int { low, high, q, .. }) => {
            let last = if q.is_some() { *high } else { high - 1 };
            Value::from(((whole as f64 * factor) as i64).clamp(*low, last))
        }
        (Some(whole), _) => Value::from((whole as f64 * factor) as i64),
        (None, Domain::Float { low, high, .. }) => {
            Value::from((current.as_f64().unwrap_or(0.0) * factor).clamp(*low, *high))
        }
        (None, _) => Value::from(current.as_f64().unwrap_or(0.0) * factor),
    }
}

impl Default for PopulationBasedTraining {
    fn default() -> Self {
        Self::new()
    }
}

impl TrialScheduler for PopulationBasedTraining {
    fn setup(&mut self, metric: Option<&str>, mode: Mode) -> Result<(), TuneError> {
        self.objective.setup("PBT", metric, mode)?;
        if self.mutations.is_empty() {
            return Err(TuneError::InvalidConfig(
                "PBT needs at least one hyperparameter to mutate: call .mutate(path, domain)".into(),
            ));
        }
        if !(0.0..=0.5).contains(&self.quantile_fraction) {
            return Err(TuneError::InvalidConfig(format!(
                "PBT's quantile_fraction must be within 0 and 0.5, not {}",
                self.quantile_fraction
            )));
        }
        Ok(())
    }

    fn on_trial_result(&mut self, context: &mut SchedulerContext<'_>, trial: &str, result: &Metrics) -> Decision {
        let time = time_of(result, &self.time_attr);
        let last = self.last_perturbation.get(trial).copied().unwrap_or(0.0);
        let Some(score) = self.objective.score(result) else {
            return Decision::Continue;
        };
        if time - last < self.perturbation_interval {
            return Decision::Continue;
        }
        self.last_perturbation.insert(trial.to_string(), time);
        self.last_score.insert(trial.to_string(), score);
        let (bottom, top) = self.quantiles(context);
        if !bottom.iter().any(|id| id == trial) {
            return Decision::Continue;
        }
        let donor = top[self.rng.random_range(0..top.len())].clone();
        let Some(donor_view) = context.trial(&donor).filter(|d| d.has_checkpoint) else {
            tracing::warn!("PBT: {trial} cannot exploit {donor}, which has no checkpoint yet");
            return Decision::Continue;
        };
        let config = self.explore(&donor_view.config);
        context.exploit(trial, &donor, config);
        Decision::Pause
    }

    fn on_trial_complete(&mut self, _context: &mut SchedulerContext<'_>, trial: &str, _result: Option<&Metrics>) {
        self.last_score.remove(trial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::Action;
    use crate::schedulers::scripted::{feed, result, running_trials};
    use crate::search::{choice, loguniform, randint};

    fn pbt() -> PopulationBasedTraining {
        let mut pbt = PopulationBasedTraining::new()
            .time_attr("training_iteration")
            .perturbation_interval(2.0)
            .resample_probability(0.0)
            .mutate("lr", loguniform(1e-3, 1.0))
            .mutate("batch", choice([16, 32, 64]))
            .mutate("layers", randint(1, 5))
            .seed(9);
        pbt.setup(Some("score"), Mode::Max).unwrap();
        pbt
    }

    #[test]
    fn explore_perturbs_numbers_by_a_factor_and_moves_choices_to_a_neighbour() {
        let mut pbt = pbt();
        let mut config = TrialConfig::new();
        config.set("lr", Value::from(0.1));
        config.set("batch", Value::from(32));
        config.set("layers", Value::from(4));
        for _ in 0..50 {
            let explored = pbt.explore(&config);
            let lr: f64 = explored.get("lr").unwrap();
            assert!((lr - 0.12).abs() < 1e-12 || (lr - 0.08).abs() < 1e-12, "{lr}");
            assert!([16, 64].contains(&explored.get::<i64>("batch").unwrap()));
            assert!(
                [3, 4].contains(&explored.get::<i64>("layers").unwrap()),
                "4 * 1.2 is kept below 5"
            );
        }
    }

    #[test]
    fn a_bottom_trial_exploits_a_top_trial_with_a_checkpoint_at_each_interval() {
        let mut pbt = pbt();
        let mut trials = running_trials(4);
        for (i, trial) in trials.iter_mut().enumerate() {
            trial.has_checkpoint = true;
            trial.config.set("lr", Value::from(0.01 * (i + 1) as f64));
            trial.config.set("batch", Value::from(32));
            trial.config.set("layers", Value::from(2));
        }
        for iteration in [1, 2] {
            for i in 1..4 {
                let (decision, actions) = feed(&mut pbt, &trials, &format!("t{i}"), &result(iteration, i as f64));
                assert_eq!((decision, actions), (Decision::Continue, vec![]));
            }
        }
        assert_eq!(
            feed(&mut pbt, &trials, "t0", &result(1, 0.0)).0,
            Decision::Continue,
            "before its interval"
        );
        let (decision, actions) = feed(&mut pbt, &trials, "t0", &result(2, 0.0));
        assert_eq!(decision, Decision::Pause, "t0 is the worst of 4 at its perturbation");
        let [Action::Exploit { trial, donor, config }] = actions.as_slice() else {
            panic!("one exploit expected: {actions:?}");
        };
        assert_eq!(
            (trial.as_str(), donor.as_str()),
            ("t0", "t3"),
            "the top quarter of 4 is t3"
        );
        let lr: f64 = config.get("lr").unwrap();
        assert!(
            (lr - 0.048).abs() < 1e-12 || (lr - 0.032).abs() < 1e-12,
            "t3's lr 0.04 perturbed: {lr}"
        );

        trials[3].has_checkpoint = false;
        let (decision, actions) = feed(&mut pbt, &trials, "t0", &result(4, 0.0));
        assert_eq!(
            (decision, actions),
            (Decision::Continue, vec![]),
            "no donor checkpoint, no exploit"
        );
    }
}
