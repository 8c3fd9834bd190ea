//! A trial's hyperparameters: a nested JSON object, read by dotted path
//! (`"model.hidden"`) into any type serde can make.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::TuneError;

/// The hyperparameters of one trial.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialConfig(Map<String, Value>);

impl TrialConfig {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value at `path` as a `T`: `config.get::<f64>("lr")`.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, TuneError> {
        let value = self
            .value(path)
            .ok_or_else(|| TuneError::InvalidConfig(format!("the trial's config has no `{path}` (it has: {self})")))?;
        T::deserialize(value).map_err(|e| {
            TuneError::InvalidConfig(format!(
                "`{path}` = {value} is not a {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The raw value at `path`, if any.
    pub fn value(&self, path: &str) -> Option<&Value> {
        let mut parts = path.split('.');
        let mut value = self.0.get(parts.next()?)?;
        for part in parts {
            value = value.as_object()?.get(part)?;
        }
        Some(value)
    }

    /// Sets the value at `path`, making the objects on the way.
    pub fn set(&mut self, path: &str, value: Value) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().expect("split yields at least one part");
        let mut object = &mut self.0;
        for part in parts {
            let entry = object
                .entry(part.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            object = entry.as_object_mut().expect("made an object above");
        }
        object.insert(last.to_string(), value);
    }

    /// Every leaf value with its dotted path, in path order.
    pub fn flatten(&self) -> Vec<(String, Value)> {
        let mut leaves = Vec::new();
        flatten_into(&self.0, "", &mut leaves);
        leaves
    }
}

fn flatten_into(object: &Map<String, Value>, prefix: &str, leaves: &mut Vec<(String, Value)>) {
    for (key, value) in object {
        let path = match prefix {
            "" => key.clone(),
            _ => format!("{prefix}.{key}"),
        };
        match value {
            Value::Object(inner) => flatten_into(inner, &path, leaves),
            leaf => leaves.push((path, leaf.clone())),
        }
    }
}

/// `lr=0.01 model.hidden=64`, floats to 4 significant digits.
impl fmt::Display for TrialConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let leaves: Vec<String> = self
            .flatten()
            .into_iter()
            .map(|(path, value)| format!("{path}={}", short_value(&value)))
            .collect();
        f.write_str(&leaves.join(" "))
    }
}

/// A value shown in a line or a table cell: floats to 4 significant digits.
pub(crate) fn short_value(value: &Value) -> String {
    match value {
        Value::Number(number) if number.is_f64() => {
            let float = number.as_f64().unwrap_or(f64::NAN);
            match float.abs() {
                0.0 => "0".to_string(),
                small if !(1e-3..1e5).contains(&small) => format!("{float:.3e}"),
                _ => format!("{}", (float * 1e4).round() / 1e4),
            }
        }
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_paths_are_set_and_read_back_typed() {
        let mut config = TrialConfig::new();
        config.set("lr", Value::from(0.01));
        config.set("model.hidden", Value::from(64));
        config.set("model.act", Value::from("relu"));
        assert_eq!(config.get::<f64>("lr").unwrap(), 0.01);
        assert_eq!(config.get::<usize>("model.hidden").unwrap(), 64);
        assert_eq!(config.get::<String>("model.act").unwrap(), "relu");
        assert_eq!(config.to_string(), "lr=0.01 model.act=relu model.hidden=64");
    }

    #[test]
    fn a_missing_or_mistyped_value_is_a_clear_error() {
        let mut config = TrialConfig::new();
        config.set("lr", Value::from(0.01));
        let missing = config.get::<f64>("momentum").unwrap_err().to_string();
        assert!(
            missing.contains("no `momentum`") && missing.contains("lr=0.01"),
            "{missing}"
        );
        let mistyped = config.get::<u32>("lr").unwrap_err().to_string();
        assert!(mistyped.contains("`lr` = 0.01 is not a u32"), "{mistyped}");
    }
}
