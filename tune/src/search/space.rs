//! Search spaces: what each hyperparameter may be (a grid, a choice, a
//! range, a distribution, or a function of the values drawn before it),
//! and how one configuration is drawn from them.

use std::fmt;
use std::sync::Arc;

use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde_json::Value;

use crate::{TrialConfig, TuneError};

/// A function that draws a value, seeing the values drawn before it.
pub type SampleFn = Arc<dyn Fn(&TrialConfig, &mut StdRng) -> Value + Send + Sync>;

/// The values one hyperparameter may take.
#[derive(Clone)]
pub enum Domain {
    /// Always this value.
    Constant(Value),
    /// Every one of these values, each in its own trials.
    Grid(Vec<Value>),
    /// One of these values, drawn uniformly.
    Choice(Vec<Value>),
    /// A float in `[low, high)`, uniform (or log-uniform), rounded to a
    /// multiple of `q` when given.
    Float {
        low: f64,
        high: f64,
        log: bool,
        q: Option<f64>,
    },
    /// An integer in `[low, high)`, uniform (or log-uniform); with `q`, a
    /// multiple of `q` in `[low, high]`, as Ray's `qrandint`.
    Int {
        low: i64,
        high: i64,
        log: bool,
        q: Option<i64>,
    },
    /// A float from a normal distribution.
    Normal { mean: f64, sd: f64 },
    /// Whatever the function returns.
    Function(SampleFn),
}

/// A float in `[low, high)`.
pub fn uniform(low: f64, high: f64) -> Domain {
    Domain::Float {
        low,
        high,
        log: false,
        q: None,
    }
}

/// A float in `[low, high]`, rounded to a multiple of `q`.
pub fn quniform(low: f64, high: f64, q: f64) -> Domain {
    Domain::Float {
        low,
        high,
        log: false,
        q: Some(q),
    }
}

/// A float in `[low, high)` whose logarithm is uniform.
pub fn loguniform(low: f64, high: f64) -> Domain {
    Domain::Float {
        low,
        high,
        log: true,
        q: None,
    }
}

/// An integer in `[low, high)`.
pub fn randint(low: i64, high: i64) -> Domain {
    Domain::Int {
        low,
        high,
        log: false,
        q: None,
    }
}

/// A multiple of `q` in `[low, high]` (both ends included, as in Ray).
pub fn qrandint(low: i64, high: i64, q: i64) -> Domain {
    Domain::Int {
        low,
        high,
        log: false,
        q: Some(q),
    }
}

/// An integer in `[low, high)` whose logarithm is uniform.
pub fn lograndint(low: i64, high: i64) -> Domain {
    Domain::Int {
        low,
        high,
        log: true,
        q: None,
    }
}

/// A float from the normal distribution with this mean and standard deviation.
pub fn randn(mean: f64, sd: f64) -> Domain {
    Domain::Normal { mean, sd }
}

/// One of `values`, drawn uniformly.
pub fn choice<T: Serialize>(values: impl IntoIterator<Item = T>) -> Domain {
    Domain::Choice(values.into_iter().map(to_value).collect())
}

/// Every one of `values`: the trials are the grid's product, times
/// `num_samples`.
pub fn grid<T: Serialize>(values: impl IntoIterator<Item = T>) -> Domain {
    Domain::Grid(values.into_iter().map(to_value).collect())
}

/// Always `value`.
pub fn constant<T: Serialize>(value: T) -> Domain {
    Domain::Constant(to_value(value))
}

/// A value `sample` computes from the values drawn before it (conditional
/// spaces): `sample_from(|config, _| json!(config.get::<i64>("layers").unwrap() * 32))`.
pub fn sample_from(sample: impl Fn(&TrialConfig, &mut StdRng) -> Value + Send + Sync + 'static) -> Domain {
    Domain::Function(Arc::new(sample))
}

fn to_value<T: Serialize>(value: T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

impl Domain {
    /// Draws one value; `drawn` holds the values drawn before it.
    pub fn sample(&self, drawn: &TrialConfig, rng: &mut StdRng) -> Value {
        match self {
            Domain::Constant(value) => value.clone(),
            Domain::Grid(values) | Domain::Choice(values) => values[rng.random_range(0..values.len())].clone(),
            Domain::Float { low, high, log, q } => {
                Value::from(self.float_from_unit(*low, *high, *log, *q, rng.random()))
            }
            Domain::Int { .. } => Value::from(self.int_from_unit(rng.random())),
            Domain::Normal { mean, sd } => Value::from(mean + sd * standard_normal(rng)),
            Domain::Function(sample) => sample(drawn, rng),
        }
    }

    /// The value at `unit` (in `[0, 1)`) of the range or choices of a
    /// domain drawn uniformly from one; `None` for the other domains.
    pub(crate) fn value_at_unit(&self, unit: f64) -> Option<Value> {
        match self {
            Domain::Choice(values) => {
                let index = ((unit * values.len() as f64) as usize).min(values.len() - 1);
                Some(values[index].clone())
            }
            Domain::Float { low, high, log, q } => Some(Value::from(self.float_from_unit(*low, *high, *log, *q, unit))),
            Domain::Int { .. } => Some(Value::from(self.int_from_unit(unit))),
            Domain::Constant(_) | Domain::Grid(_) | Domain::Normal { .. } | Domain::Function(_) => None,
        }
    }

    fn float_from_unit(&self, low: f64, high: f64, log: bool, q: Option<f64>, unit: f64) -> f64 {
        let value = match log {
            true => (low.ln() + unit * (high.ln() - low.ln())).exp(),
            false => low + unit * (high - low),
        };
        match q {
            Some(q) => ((value / q).round() * q).clamp(low, high),
            None => value.clamp(low, high),
        }
    }

    /// The integer at `unit` (in `[0, 1)`) of an `Int` domain's range.
    fn int_from_unit(&self, unit: f64) -> i64 {
        let Domain::Int { low, high, log, q } = *self else {
            unreachable!("only Int domains draw integers");
        };
        match q {
            Some(q) => {
                let steps = (high - low) / q;
                low + q * ((unit * (steps + 1) as f64) as i64).min(steps)
            }
            None if log => {
                let value = (low as f64).ln() + unit * ((high as f64).ln() - (low as f64).ln());
                (value.exp().floor() as i64).clamp(low, high - 1)
            }
            None => (low + (unit * (high - low) as f64) as i64).min(high - 1),
        }
    }

    /// Why the domain cannot be sampled, if it cannot.
    pub(crate) fn check(&self, path: &str) -> Result<(), TuneError> {
        let invalid = |why: String| Err(TuneError::InvalidSearchSpace(format!("`{path}`: {why}")));
        match self {
            Domain::Grid(values) | Domain::Choice(values) if values.is_empty() => {
                invalid("no values to pick from".into())
            }
            Domain::Float { low, high, log, q } => match () {
                _ if low >= high || low.is_nan() || high.is_nan() => {
                    invalid(format!("low {low} is not below high {high}"))
                }
                _ if *log && *low <= 0.0 => invalid(format!("a log range must be above 0, not from {low}")),
                _ if q.is_some_and(|q| q <= 0.0) => invalid("q must be above 0".into()),
                _ => Ok(()),
            },
            Domain::Int { low, high, log, q } => match () {
                _ if q.is_none() && low >= high => invalid(format!("low {low} is not below high {high}")),
                _ if q.is_some() && low > high => invalid(format!("low {low} is above high {high}")),
                _ if *log && *low <= 0 => invalid(format!("a log range must be above 0, not from {low}")),
                _ if q.is_some_and(|q| q <= 0) => invalid("q must be above 0".into()),
                _ => Ok(()),
            },
            Domain::Normal { sd, .. } if *sd <= 0.0 || sd.is_nan() => invalid(format!("sd {sd} is not above 0")),
            _ => Ok(()),
        }
    }
}

/// One draw from the standard normal distribution (Box-Muller).
pub(crate) fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Domain::Constant(value) => write!(f, "constant({value})"),
            Domain::Grid(values) => write!(f, "grid({values:?})"),
            Domain::Choice(values) => write!(f, "choice({values:?})"),
            Domain::Float { low, high, log, q } => write!(f, "float({low}, {high}, log={log}, q={q:?})"),
            Domain::Int { low, high, log, q } => write!(f, "int({low}, {high}, log={log}, q={q:?})"),
            Domain::Normal { mean, sd } => write!(f, "randn({mean}, {sd})"),
            Domain::Function(_) => f.write_str("sample_from(..)"),
        }
    }
}

macro_rules! constant_domains {
    ($($ty:ty),*) => {$(
        impl From<$ty> for Domain {
            fn from(value: $ty) -> Self {
                Domain::Constant(Value::from(value))
            }
        }
    )*};
}
constant_domains!(f64, f32, i64, i32, u64, u32, usize, bool, &str, String);

/// The hyperparameters of a search and their domains, in the order they
/// are drawn.
#[derive(Clone, Debug, Default)]
pub struct SearchSpace {
    entries: Vec<(String, Domain)>,
}

impl SearchSpace {
    pub fn new() -> Self {
        Self::default()
    }

    /// This space with `path` (dotted for nested values: `"model.hidden"`)
    /// drawn from `domain`, after the entries before it.
    pub fn with(mut self, path: &str, domain: impl Into<Domain>) -> Self {
        self.entries.retain(|(existing, _)| existing != path);
        self.entries.push((path.to_string(), domain.into()));
        self
    }

    /// This space with every entry of `inner` under `prefix`.
    pub fn nested(mut self, prefix: &str, inner: SearchSpace) -> Self {
        for (path, domain) in inner.entries {
            self = self.with(&format!("{prefix}.{path}"), domain);
        }
        self
    }

    /// The entries in the order they are drawn.
    pub fn entries(&self) -> &[(String, Domain)] {
        &self.entries
    }

    /// Whether every domain can be sampled.
    pub fn check(&self) -> Result<(), TuneError> {
        self.entries.iter().try_for_each(|(path, domain)| domain.check(path))
    }

    /// The grid entries: each path and its values.
    pub fn grid_entries(&self) -> Vec<(&str, &[Value])> {
        self.entries
            .iter()
            .filter_map(|(path, domain)| match domain {
                Domain::Grid(values) => Some((path.as_str(), values.as_slice())),
                _ => None,
            })
            .collect()
    }

    /// Draws every entry in order, with `fixed` (grid values, or a
    /// searcher's picks) taken as given.
    pub fn sample_with(&self, fixed: &TrialConfig, rng: &mut StdRng) -> TrialConfig {
        let mut config = TrialConfig::new();
        for (path, domain) in &self.entries {
            let value = match fixed.value(path) {
                Some(value) => value.clone(),
                None => domain.sample(&config, rng),
            };
            config.set(path, value);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn draws(domain: &Domain, n: usize) -> Vec<Value> {
        let mut rng = StdRng::seed_from_u64(7);
        (0..n).map(|_| domain.sample(&TrialConfig::new(), &mut rng)).collect()
    }

    fn floats(domain: &Domain) -> Vec<f64> {
        draws(domain, 5000).iter().map(|v| v.as_f64().unwrap()).collect()
    }

    fn ints(domain: &Domain) -> Vec<i64> {
        draws(domain, 5000).iter().map(|v| v.as_i64().unwrap()).collect()
    }

    #[test]
    fn every_range_stays_within_its_bounds_and_covers_them() {
        let uniform_draws = floats(&uniform(-2.0, 3.0));
        assert!(uniform_draws.iter().all(|x| (-2.0..3.0).contains(x)));
        assert!(uniform_draws.iter().any(|x| *x < -1.9) && uniform_draws.iter().any(|x| *x > 2.9));

        let log_draws = floats(&loguniform(1e-4, 1e-1));
        assert!(log_draws.iter().all(|x| (1e-4..=1e-1).contains(x)));
        let below_1e3 = log_draws.iter().filter(|x| **x < 1e-3).count() as f64 / log_draws.len() as f64;
        assert!(
            (below_1e3 - 1.0 / 3.0).abs() < 0.05,
            "a third of a log range per decade, got {below_1e3}"
        );

        let q_draws = floats(&quniform(0.0, 1.0, 0.25));
        assert!(
            q_draws.iter().all(|x| [0.0, 0.25, 0.5, 0.75, 1.0].contains(x)),
            "{q_draws:?}"
        );

        let int_draws = ints(&randint(3, 7));
        assert!(int_draws.iter().all(|x| (3..7).contains(x)));
        for value in 3..7 {
            assert!(int_draws.contains(&value), "randint(3, 7) never drew {value}");
        }

        let qint_draws = ints(&qrandint(0, 100, 25));
        for value in [0, 25, 50, 75, 100] {
            assert!(qint_draws.contains(&value), "qrandint(0, 100, 25) never drew {value}");
        }
        assert!(qint_draws.iter().all(|x| x % 25 == 0 && (0..=100).contains(x)));

        let logint_draws = ints(&lograndint(1, 1000));
        assert!(logint_draws.iter().all(|x| (1..1000).contains(x)));

        let normal_draws = floats(&randn(5.0, 2.0));
        let mean = normal_draws.iter().sum::<f64>() / normal_draws.len() as f64;
        let sd = (normal_draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / normal_draws.len() as f64).sqrt();
        assert!(
            (mean - 5.0).abs() < 0.1 && (sd - 2.0).abs() < 0.1,
            "mean {mean}, sd {sd}"
        );

        let choices = draws(&choice(["a", "b", "c"]), 300);
        for value in ["a", "b", "c"] {
            assert!(choices.contains(&Value::from(value)));
        }
    }

    #[test]
    fn conditional_values_see_the_values_drawn_before_them() {
        let space = SearchSpace::new()
            .with("layers", randint(1, 4))
            .with(
                "width",
                sample_from(|config, _| Value::from(config.get::<i64>("layers").unwrap() * 32)),
            )
            .nested(
                "optimizer",
                SearchSpace::new()
                    .with("name", "adam")
                    .with("lr", loguniform(1e-4, 1e-2)),
            );
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let config = space.sample_with(&TrialConfig::new(), &mut rng);
            let layers: i64 = config.get("layers").unwrap();
            assert_eq!(config.get::<i64>("width").unwrap(), layers * 32);
            assert_eq!(config.get::<String>("optimizer.name").unwrap(), "adam");
            assert!((1e-4..=1e-2).contains(&config.get::<f64>("optimizer.lr").unwrap()));
        }
    }

    #[test]
    fn bad_ranges_are_refused_by_name() {
        let checks = [
            (uniform(1.0, 1.0), "low 1 is not below high 1"),
            (loguniform(0.0, 1.0), "a log range must be above 0"),
            (randint(5, 5), "low 5 is not below high 5"),
            (choice(Vec::<i32>::new()), "no values"),
            (randn(0.0, -1.0), "sd -1 is not above 0"),
        ];
        for (domain, why) in checks {
            let error = SearchSpace::new().with("x", domain).check().unwrap_err().to_string();
            assert!(error.contains("`x`") && error.contains(why), "{error}");
        }
    }
}
