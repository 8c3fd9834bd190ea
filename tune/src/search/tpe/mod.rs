//! The Tree-structured Parzen Estimator searcher, with Optuna 5.0's
//! defaults: 10 startup trials (spread as a Latin hypercube, where Optuna
//! draws them at random), then 24 candidates drawn from the density of the
//! best trials, keeping the one that most favours them over the rest. The density is multivariate (one kernel per trial over all
//! hyperparameters at once) unless `multivariate(false)` asks for one per
//! hyperparameter. Running trials count among the rest (constant liar), so
//! parallel trials spread out.

mod parzen;

use rand::SeedableRng;
use rand::rngs::StdRng;
use raylet_train::Metrics;
use serde_json::Value;

use self::parzen::{Axis, CategoricalEstimator, Coordinate, JointEstimator, NumericalEstimator, Range};
use super::{Domain, SearchSetup, SearchSpace, Searcher, Suggestion, latin_hypercube};
use crate::{Mode, TrialConfig, TuneError};

/// The TPE searcher.
pub struct Tpe {
    rng: StdRng,
    n_startup_trials: usize,
    n_ei_candidates: usize,
    multivariate: bool,
    space: SearchSpace,
    dimensions: Vec<(String, Dimension)>,
    metric: String,
    mode: Mode,
    total: usize,
    made: usize,
    /// Finished trials with a result: their config and loss (lower is better), in order.
    finished: Vec<(TrialConfig, f64)>,
    /// Trials suggested and not finished, in order.
    running: Vec<(String, TrialConfig)>,
    /// The startup trials' values, a Latin hypercube over the space.
    startup_design: Vec<TrialConfig>,
}

/// A hyperparameter TPE models.
#[derive(Clone, Debug)]
enum Dimension {
    Numerical { range: Range, log: bool, integer: bool },
    Categorical(Vec<Value>),
}

impl Tpe {
    /// TPE from an unpredictable seed.
    pub fn new() -> Self {
        Self::seeded(rand::random())
    }

    /// TPE that suggests the same trials for the same results.
    pub fn seeded(seed: u64) -> Self {
        Tpe {
            rng: StdRng::seed_from_u64(seed),
            n_startup_trials: 10,
            n_ei_candidates: 24,
            multivariate: true,
            space: SearchSpace::new(),
            dimensions: Vec::new(),
            metric: String::new(),
            mode: Mode::Max,
            total: 0,
            made: 0,
            finished: Vec::new(),
            running: Vec::new(),
            startup_design: Vec::new(),
        }
    }

    /// How many trials are drawn at random before TPE models the results.
    pub fn n_startup_trials(mut self, trials: usize) -> Self {
        self.n_startup_trials = trials;
        self
    }

    /// How many candidates TPE weighs for each hyperparameter.
    pub fn n_ei_candidates(mut self, candidates: usize) -> Self {
        self.n_ei_candidates = candidates.max(1);
        self
    }

    /// Models each hyperparameter on its own (Optuna's default before 5.0)
    /// instead of all of them jointly.
    pub fn multivariate(mut self, multivariate: bool) -> Self {
        self.multivariate = multivariate;
        self
    }

    /// The next configuration: random during startup, else TPE's pick for
    /// the modelled hyperparameters and a draw for the others.
    fn next_config(&mut self) -> TrialConfig {
        let seen = self.finished.len() + self.running.len();
        if seen < self.n_startup_trials || self.finished.is_empty() {
            let design = self.startup_design.get(self.made - 1).cloned().unwrap_or_default();
            return self.space.sample_with(&design, &mut self.rng);
        }
        let (below, above) = self.split();
        let picks = match self.multivariate {
            true => self.pick_jointly(&below, &above),
            false => {
                let mut picks = TrialConfig::new();
                for (path, dimension) in self.dimensions.clone() {
                    let value = self.pick(&path, &dimension, &below, &above);
                    picks.set(&path, value);
                }
                picks
            }
        };
        self.space.sample_with(&picks, &mut self.rng)
    }

    /// The candidate point with the highest l(x)/g(x) over all modelled
    /// hyperparameters at once.
    fn pick_jointly(&mut self, below: &[TrialConfig], above: &[TrialConfig]) -> TrialConfig {
        let axes: Vec<Axis> = self.dimensions.iter().map(|(_, dimension)| dimension.axis()).collect();
        let (good_points, bad_points) = (self.points(below), self.points(above));
        let good = JointEstimator::new(&axes, &good_points, &default_weights(good_points.len()));
        let bad = JointEstimator::new(&axes, &bad_points, &default_weights(bad_points.len()));
        let best = self.best_candidate(|rng| good.sample(rng), |p| good.log_pdf(p) - bad.log_pdf(p));
        let mut picks = TrialConfig::new();
        for ((path, dimension), coordinate) in self.dimensions.iter().zip(best) {
            picks.set(path, dimension.value(coordinate));
        }
        picks
    }

    /// The configs as points over the modelled hyperparameters (those
    /// missing one are left out).
    fn points(&self, configs: &[TrialConfig]) -> Vec<Vec<Coordinate>> {
        configs
            .iter()
            .filter_map(|config| {
                let coordinates = self.dimensions.iter();
                coordinates
                    .map(|(path, dimension)| dimension.coordinate(config.value(path)?))
                    .collect::<Option<Vec<_>>>()
            })
            .collect()
    }

    /// The best finished trials (`below`: gamma of the finished ones, as
    /// Optuna 5.0), and the other finished and the running ones (`above`),
    /// each in the order they were made.
    fn split(&self) -> (Vec<TrialConfig>, Vec<TrialConfig>) {
        let mut ranked: Vec<usize> = (0..self.finished.len()).collect();
        ranked.sort_by(|a, b| self.finished[*a].1.total_cmp(&self.finished[*b].1));
        let n_below = gamma(self.finished.len());
        let mut is_below = vec![false; self.finished.len()];
        for index in &ranked[..n_below] {
            is_below[*index] = true;
        }
        let mut below = Vec::new();
        let mut above = Vec::new();
        for ((config, _), below_it) in self.finished.iter().zip(is_below) {
            match below_it {
                true => below.push(config.clone()),
                false => above.push(config.clone()),
            }
        }
        above.extend(self.running.iter().map(|(_, config)| config.clone()));
        (below, above)
    }

    /// The candidate with the highest l(x)/g(x), of those drawn from l.
    fn pick(&mut self, path: &str, dimension: &Dimension, below: &[TrialConfig], above: &[TrialConfig]) -> Value {
        let (below, above) = (dimension.coordinates(below, path), dimension.coordinates(above, path));
        let best = match dimension.axis() {
            Axis::Numeric(range) => {
                let below: Vec<f64> = below.iter().filter_map(Coordinate::numeric).collect();
                let above: Vec<f64> = above.iter().filter_map(Coordinate::numeric).collect();
                let good = NumericalEstimator::new(range, &below, &default_weights(below.len()));
                let bad = NumericalEstimator::new(range, &above, &default_weights(above.len()));
                Coordinate::Numeric(self.best_candidate(|rng| good.sample(rng), |x| good.log_pdf(*x) - bad.log_pdf(*x)))
            }
            Axis::Categorical(choices) => {
                let below: Vec<usize> = below.iter().filter_map(Coordinate::choice).collect();
                let above: Vec<usize> = above.iter().filter_map(Coordinate::choice).collect();
                let good = CategoricalEstimator::new(choices, &below, &default_weights(below.len()));
                let bad = CategoricalEstimator::new(choices, &above, &default_weights(above.len()));
                Coordinate::Choice(self.best_candidate(|rng| good.sample(rng), |c| good.log_pdf(*c) - bad.log_pdf(*c)))
            }
        };
        dimension.value(best)
    }

    fn best_candidate<T>(&mut self, mut draw: impl FnMut(&mut StdRng) -> T, score: impl Fn(&T) -> f64) -> T {
        let candidates: Vec<T> = (0..self.n_ei_candidates).map(|_| draw(&mut self.rng)).collect();
        let scores: Vec<f64> = candidates.iter().map(score).collect();
        let best = (0..candidates.len())
            .max_by(|a, b| scores[*a].total_cmp(&scores[*b]))
            .expect("at least one candidate");
        candidates.into_iter().nth(best).expect("an index of the candidates")
    }

    fn loss(&self, result: &Metrics) -> Option<f64> {
        let value = result.get(&self.metric).filter(|v| v.is_finite())?;
        Some(match self.mode {
            Mode::Max => -value,
            Mode::Min => value,
        })
    }
}

impl Default for Tpe {
    fn default() -> Self {
        Self::new()
    }
}

impl Searcher for Tpe {
    fn setup(&mut self, setup: &SearchSetup<'_>) -> Result<(), TuneError> {
        setup.space.check()?;
        let metric = setup
            .metric
            .ok_or_else(|| TuneError::InvalidConfig("TPE needs a metric to optimize: set TuneConfig::metric".into()))?;
        self.dimensions = dimensions(setup.space)?;
        self.space = setup.space.clone();
        self.metric = metric.to_string();
        self.mode = setup.mode;
        self.total = setup.num_samples;
        self.startup_design = latin_hypercube(&self.space, self.n_startup_trials, &mut self.rng);
        Ok(())
    }

    fn suggest(&mut self, trial_id: &str) -> Suggestion {
        if self.made >= self.total {
            return Suggestion::Finished;
        }
        self.made += 1;
        let config = self.next_config();
        self.running.push((trial_id.to_string(), config.clone()));
        Suggestion::Config(config)
    }

    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&Metrics>) {
        let Some(position) = self.running.iter().position(|(id, _)| id == trial_id) else {
            return;
        };
        let (_, config) = self.running.remove(position);
        if let Some(loss) = result.and_then(|r| self.loss(r)) {
            self.finished.push((config, loss));
        }
    }

    fn restore_trial(&mut self, trial_id: &str, config: &TrialConfig, result: Option<&Metrics>) {
        self.made += 1;
        self.running.push((trial_id.to_string(), config.clone()));
        if result.is_some() {
            self.on_trial_complete(trial_id, result);
        }
    }
}

impl Dimension {
    fn axis(&self) -> Axis {
        match self {
            Dimension::Numerical { range, .. } => Axis::Numeric(*range),
            Dimension::Categorical(choices) => Axis::Categorical(choices.len()),
        }
    }

    /// Where `value` sits on this dimension's axis.
    fn coordinate(&self, value: &Value) -> Option<Coordinate> {
        match self {
            Dimension::Numerical { log, .. } => {
                let x = value.as_f64()?;
                Some(Coordinate::Numeric(if *log { x.ln() } else { x }))
            }
            Dimension::Categorical(choices) => choices.iter().position(|c| c == value).map(Coordinate::Choice),
        }
    }

    /// The coordinates of the configs that have a value at `path`.
    fn coordinates(&self, configs: &[TrialConfig], path: &str) -> Vec<Coordinate> {
        configs
            .iter()
            .filter_map(|config| self.coordinate(config.value(path)?))
            .collect()
    }

    /// The value at `coordinate`.
    fn value(&self, coordinate: Coordinate) -> Value {
        match (self, coordinate) {
            (Dimension::Numerical { log, integer, .. }, Coordinate::Numeric(x)) => numeric_value(x, *log, *integer),
            (Dimension::Categorical(choices), Coordinate::Choice(index)) => choices[index].clone(),
            _ => unreachable!("coordinates come from their dimension's axis"),
        }
    }
}

/// The hyperparameters TPE models; grids are refused, as they are for
/// every searcher but the basic variant.
fn dimensions(space: &SearchSpace) -> Result<Vec<(String, Dimension)>, TuneError> {
    let mut dimensions = Vec::new();
    for (path, domain) in space.entries() {
        let dimension = match *domain {
            Domain::Grid(_) => {
                return Err(TuneError::InvalidSearchSpace(format!(
                    "`{path}` is a grid, which only the basic variant searcher walks; use choice(..) with TPE"
                )));
            }
            Domain::Choice(ref values) => Dimension::Categorical(values.clone()),
            Domain::Float { low, high, log, q } => Dimension::Numerical {
                range: match log {
                    true => Range {
                        low: low.ln(),
                        high: high.ln(),
                        step: None,
                    },
                    false => Range { low, high, step: q },
                },
                log,
                integer: false,
            },
            Domain::Int { low, high, log, q } => {
                let last = if q.is_some() { high } else { high - 1 };
                Dimension::Numerical {
                    range: match log {
                        true => Range {
                            low: (low as f64 - 0.5).max(0.5).ln(),
                            high: (last as f64 + 0.5).ln(),
                            step: None,
                        },
                        false => Range {
                            low: low as f64,
                            high: last as f64,
                            step: Some(q.unwrap_or(1) as f64),
                        },
                    },
                    log,
                    integer: true,
                }
            }
            Domain::Constant(_) | Domain::Normal { .. } | Domain::Function(_) => continue,
        };
        dimensions.push((path.clone(), dimension));
    }
    Ok(dimensions)
}

/// Optuna's split: the best tenth of the trials, at most 25.
fn gamma(trials: usize) -> usize {
    trials.div_ceil(10).min(25)
}

/// Optuna's observation weights: equal for 25 or fewer, else the oldest
/// fade in linearly and the newest 25 weigh 1.
fn default_weights(n: usize) -> Vec<f64> {
    if n < 25 {
        return vec![1.0; n];
    }
    let ramp = n - 25;
    let start = 1.0 / n as f64;
    let mut weights: Vec<f64> = (0..ramp)
        .map(|i| match ramp {
            1 => start,
            _ => start + (1.0 - start) * i as f64 / (ramp - 1) as f64,
        })
        .collect();
    weights.extend(std::iter::repeat_n(1.0, 25));
    weights
}

fn numeric_value(x: f64, log: bool, integer: bool) -> Value {
    let value = if log { x.exp() } else { x };
    match integer {
        true => Value::from(value.round() as i64),
        false => Value::from(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::{BasicVariant, choice, loguniform, randint, uniform};

    /// Branin's function: three minima of 0.397887.
    fn branin(config: &TrialConfig) -> f64 {
        let x1: f64 = config.get("x1").unwrap();
        let x2: f64 = config.get("x2").unwrap();
        let pi = std::f64::consts::PI;
        let (b, c, t) = (5.1 / (4.0 * pi * pi), 5.0 / pi, 1.0 / (8.0 * pi));
        (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
    }

    fn branin_space() -> SearchSpace {
        SearchSpace::new()
            .with("x1", uniform(-5.0, 10.0))
            .with("x2", uniform(0.0, 15.0))
    }

    /// The best Branin value `searcher` finds in `budget` trials, one at a time.
    fn best_branin(searcher: &mut dyn Searcher, budget: usize) -> f64 {
        let space = branin_space();
        let setup = SearchSetup {
            space: &space,
            metric: Some("loss"),
            mode: Mode::Min,
            num_samples: budget,
        };
        searcher.setup(&setup).unwrap();
        let mut best = f64::INFINITY;
        for trial in 0..budget {
            let id = format!("trial_{trial}");
            let Suggestion::Config(config) = searcher.suggest(&id) else {
                panic!("the searcher stopped before its budget");
            };
            let loss = branin(&config);
            best = best.min(loss);
            searcher.on_trial_complete(&id, Some(&Metrics::new().with("loss", loss)));
        }
        best
    }

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }

    #[test]
    fn on_branin_tpe_beats_random_search_over_fixed_seeds() {
        let budget = 60;
        let univariate: Vec<f64> = (0..10)
            .map(|seed| best_branin(&mut Tpe::seeded(seed).multivariate(false), budget))
            .collect();
        let tpe: Vec<f64> = (0..10)
            .map(|seed| best_branin(&mut Tpe::seeded(seed), budget))
            .collect();
        let random: Vec<f64> = (0..10)
            .map(|seed| best_branin(&mut BasicVariant::seeded(seed), budget))
            .collect();
        let (tpe_median, random_median) = (median(tpe.clone()), median(random.clone()));
        let univariate_median = median(univariate.clone());
        println!(
            "Branin, {budget} trials, median best of 10 seeds: TPE {tpe_median:.4}, univariate TPE {univariate_median:.4}, random {random_median:.4}"
        );
        assert!(tpe_median < random_median, "TPE {tpe:?} vs random {random:?}");
        assert!(
            univariate_median < random_median,
            "univariate TPE {univariate:?} vs random {random:?}"
        );
    }

    #[test]
    fn the_startup_trials_cover_each_tenth_of_a_range_once() {
        let space = SearchSpace::new().with("x", uniform(0.0, 1.0));
        let mut tpe = Tpe::seeded(3);
        let setup = SearchSetup {
            space: &space,
            metric: Some("loss"),
            mode: Mode::Min,
            num_samples: 10,
        };
        tpe.setup(&setup).unwrap();
        let mut tenths: Vec<usize> = (0..10)
            .map(|trial| match tpe.suggest(&trial.to_string()) {
                Suggestion::Config(config) => (config.get::<f64>("x").unwrap() * 10.0) as usize,
                other => panic!("{other:?}"),
            })
            .collect();
        tenths.sort();
        assert_eq!(tenths, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn seeded_tpe_suggests_the_same_trials_for_the_same_results() {
        let run = |seed| {
            let mut tpe = Tpe::seeded(seed);
            best_branin(&mut tpe, 30)
        };
        assert_eq!(run(4).to_bits(), run(4).to_bits());
        assert_ne!(run(4).to_bits(), run(5).to_bits());
    }

    #[test]
    fn suggestions_stay_in_mixed_spaces() {
        let space = SearchSpace::new()
            .with("lr", loguniform(1e-4, 1e-1))
            .with("hidden", choice([16, 32, 64]))
            .with("batch", randint(8, 65))
            .with("epochs", 5);
        let mut tpe = Tpe::seeded(1).n_startup_trials(3);
        let setup = SearchSetup {
            space: &space,
            metric: Some("acc"),
            mode: Mode::Max,
            num_samples: 40,
        };
        tpe.setup(&setup).unwrap();
        for trial in 0..40 {
            let id = trial.to_string();
            let Suggestion::Config(config) = tpe.suggest(&id) else {
                panic!("stopped early");
            };
            let lr: f64 = config.get("lr").unwrap();
            let hidden: i64 = config.get("hidden").unwrap();
            let batch: i64 = config.get("batch").unwrap();
            assert!((1e-4..=1e-1).contains(&lr) && [16, 32, 64].contains(&hidden) && (8..65).contains(&batch));
            assert_eq!(config.get::<i64>("epochs").unwrap(), 5);
            let acc = -(lr.ln() + 5.0).powi(2) + hidden as f64 / 64.0;
            if trial % 3 != 0 {
                tpe.on_trial_complete(&id, Some(&Metrics::new().with("acc", acc)));
            }
        }
        assert_eq!(tpe.suggest("41"), Suggestion::Finished);
    }

    #[test]
    fn grids_and_a_missing_metric_are_refused() {
        let space = SearchSpace::new().with("x", crate::search::grid([1, 2]));
        let setup = SearchSetup {
            space: &space,
            metric: Some("loss"),
            mode: Mode::Min,
            num_samples: 4,
        };
        let error = Tpe::seeded(0).setup(&setup).err().unwrap().to_string();
        assert!(error.contains("`x` is a grid"), "{error}");
        let error = Tpe::seeded(0)
            .setup(&SearchSetup { metric: None, ..setup })
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("TPE needs a metric"), "{error}");
    }

    #[test]
    fn weights_follow_optuna() {
        assert_eq!(default_weights(3), vec![1.0; 3]);
        let weights = default_weights(30);
        assert_eq!(weights.len(), 30);
        assert!((weights[0] - 1.0 / 30.0).abs() < 1e-12 && weights[4] == 1.0 && weights[29] == 1.0);
        assert_eq!((gamma(9), gamma(11), gamma(1000)), (1, 2, 25));
    }
}
