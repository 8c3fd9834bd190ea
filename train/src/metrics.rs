//! The named numbers a train loop reports: loss, accuracy, epoch, ...

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Named values of one report, kept in name order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics(BTreeMap<String, f64>);

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// These metrics with `name` set to `value`.
    pub fn with(mut self, name: &str, value: impl Into<f64>) -> Self {
        self.insert(name, value);
        self
    }

    pub fn insert(&mut self, name: &str, value: impl Into<f64>) {
        self.0.insert(name.to_string(), value.into());
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(name, value)| (name.as_str(), *value))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `accuracy=0.9512 epoch=3 loss=0.1234 samples_per_second=8123.4`: whole
/// numbers without decimals, large ones with one.
impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, (name, value)) in self.iter().enumerate() {
            if index > 0 {
                f.write_str(" ")?;
            }
            match value.abs() {
                whole if value.fract() == 0.0 && whole < 1e15 => write!(f, "{name}={value:.0}")?,
                large if large >= 100.0 => write!(f, "{name}={value:.1}")?,
                _ => write!(f, "{name}={value:.4}")?,
            }
        }
        Ok(())
    }
}
