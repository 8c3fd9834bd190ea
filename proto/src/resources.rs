//! Resource sets: CPU, GPU, memory, object store memory and custom resources,
//! stored as fixed-point amounts so that adding and subtracting never drifts.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Add, Sub};

use crate::{Error, Result};

/// Number of CPU cores.
pub const CPU: &str = "CPU";
/// Number of GPUs; fractions such as 0.25 share one.
pub const GPU: &str = "GPU";
/// Bytes of memory for tasks and actors.
pub const MEMORY: &str = "memory";
/// Bytes of shared-memory object store.
pub const OBJECT_STORE_MEMORY: &str = "object_store_memory";

const BUILT_IN: [&str; 4] = [CPU, GPU, MEMORY, OBJECT_STORE_MEMORY];
/// Long enough for a custom name inside a placement group bundle's name.
const MAX_NAME_LEN: usize = 128;
/// The largest amount of bytes a node may declare (about 91 TiB).
const MAX_BYTES: f64 = 1e14;
/// The largest count of any other resource a node may declare.
const MAX_COUNT: f64 = 1e9;

/// A non-negative resource amount in fixed-point units of 1/10000.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i64);

impl Amount {
    /// Fixed-point units per whole resource.
    pub const SCALE: i64 = 10_000;
    pub const ZERO: Amount = Amount(0);

    /// Converts a user-given amount, rounding to 1/10000 and checking that it
    /// is finite, non-negative and below the limit for `name`.
    pub fn parse(name: &str, value: f64) -> Result<Self> {
        let limit = if is_bytes(name) { MAX_BYTES } else { MAX_COUNT };
        if !value.is_finite() || value < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "resource '{name}' must be a finite amount >= 0, got {value}"
            )));
        }
        if value > limit {
            return Err(Error::InvalidArgument(format!(
                "resource '{name}' amount {value} is larger than the limit {limit:e}"
            )));
        }
        Ok(Amount((value * Self::SCALE as f64).round() as i64))
    }

    /// A whole number of units, e.g. bytes of memory.
    pub fn whole(units: u64) -> Self {
        Amount((units as i64).saturating_mul(Self::SCALE))
    }

    /// The raw fixed-point value, as sent on the wire.
    pub fn raw(self) -> i64 {
        self.0
    }

    /// Reads the wire form; negative values are rejected.
    pub fn from_raw(raw: i64) -> Result<Self> {
        if raw < 0 {
            return Err(Error::InvalidArgument(format!(
                "resource amounts must be >= 0, got raw value {raw}"
            )));
        }
        Ok(Amount(raw))
    }

    pub fn as_f64(self) -> f64 {
        self.0 as f64 / Self::SCALE as f64
    }
}

impl Add for Amount {
    type Output = Amount;
    fn add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }
}

impl Sub for Amount {
    type Output = Amount;
    /// Saturates at zero: an amount is never negative.
    fn sub(self, other: Amount) -> Amount {
        Amount((self.0 - other.0).max(0))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / Self::SCALE;
        let fraction = self.0 % Self::SCALE;
        if fraction == 0 {
            write!(f, "{whole}.0")
        } else {
            let digits = format!("{fraction:04}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// Whether the resource `name` counts bytes.
pub fn is_bytes(name: &str) -> bool {
    name == MEMORY || name == OBJECT_STORE_MEMORY
}

/// Serializes as a map of name to amount, e.g. `{"CPU": 2.0, "GPU": 0.25}`.
impl serde::Serialize for ResourceSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter().map(|(name, amount)| (name, amount.as_f64())))
    }
}

/// A set of named resource amounts. Absent names count as zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceSet(BTreeMap<String, Amount>);

impl ResourceSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `amount`, builder style.
    pub fn with(mut self, name: &str, amount: Amount) -> Self {
        self.set(name, amount);
        self
    }

    /// Sets `name` to `amount`; a zero amount removes the name.
    pub fn set(&mut self, name: &str, amount: Amount) {
        if amount == Amount::ZERO {
            self.0.remove(name);
        } else {
            self.0.insert(name.to_string(), amount);
        }
    }

    pub fn get(&self, name: &str) -> Amount {
        self.0.get(name).copied().unwrap_or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.0.iter().map(|(name, amount)| (name.as_str(), *amount))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds every amount of `other` to this set.
    pub fn add(&mut self, other: &ResourceSet) {
        for (name, amount) in other.iter() {
            self.set(name, self.get(name) + amount);
        }
    }

    /// Takes every amount of `other` from this set, down to zero at most.
    pub fn subtract(&mut self, other: &ResourceSet) {
        for (name, amount) in other.iter() {
            self.set(name, self.get(name) - amount);
        }
    }

    /// Whether every amount of `demand` fits in this set.
    pub fn fits(&self, demand: &ResourceSet) -> bool {
        demand.iter().all(|(name, amount)| self.get(name) >= amount)
    }

    /// Subtracts `demand` if it fits, and says whether it did.
    pub fn try_subtract(&mut self, demand: &ResourceSet) -> bool {
        if !self.fits(demand) {
            return false;
        }
        for (name, amount) in demand.iter() {
            self.set(name, self.get(name) - amount);
        }
        true
    }

    /// Parses custom resources from JSON such as `{"TPU": 4, "accel_a100": 0.5}`.
    /// Built-in names are refused: they have flags of their own.
    pub fn parse_custom_json(json: &str) -> Result<Self> {
        let values: BTreeMap<String, serde_json::Value> = serde_json::from_str(json).map_err(|e| {
            Error::InvalidArgument(format!(
                "--resources must be a JSON object of name to number, such as '{{\"TPU\": 4}}': {e}"
            ))
        })?;
        let mut set = ResourceSet::new();
        for (name, value) in values {
            check_custom_name(&name)?;
            let number = value
                .as_f64()
                .ok_or_else(|| Error::InvalidArgument(format!("resource '{name}' must be a number, got {value}")))?;
            set.set(&name, Amount::parse(&name, number)?);
        }
        Ok(set)
    }

    /// Reads the wire form, rejecting bad names and negative amounts.
    pub fn from_proto(map: &crate::v1::ResourceMap) -> Result<Self> {
        let mut set = ResourceSet::new();
        for (name, raw) in &map.amounts {
            check_name(name)?;
            set.set(name, Amount::from_raw(*raw)?);
        }
        Ok(set)
    }

    pub fn to_proto(&self) -> crate::v1::ResourceMap {
        let amounts = self.iter().map(|(name, a)| (name.to_string(), a.raw())).collect();
        crate::v1::ResourceMap { amounts }
    }
}

fn check_name(name: &str) -> Result<()> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !valid_chars {
        return Err(Error::InvalidArgument(format!(
            "resource name '{name}' must be 1 to {MAX_NAME_LEN} characters of letters, digits, '_', '-', '.', ':' or '/'"
        )));
    }
    Ok(())
}

fn check_custom_name(name: &str) -> Result<()> {
    check_name(name)?;
    if BUILT_IN.contains(&name) {
        let flag = match name {
            CPU => "--num-cpus",
            GPU => "--num-gpus",
            MEMORY => "--memory",
            _ => "--object-store-memory",
        };
        return Err(Error::InvalidArgument(format!(
            "'{name}' is a built-in resource: set it with {flag}, not in --resources"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(value: f64) -> Amount {
        Amount::parse("X", value).unwrap()
    }

    #[test]
    fn fractional_amounts_add_and_subtract_without_drift() {
        let mut pool = ResourceSet::new().with(GPU, amount(1.0));
        let quarter = ResourceSet::new().with(GPU, amount(0.1));
        for _ in 0..10 {
            assert!(pool.try_subtract(&quarter));
        }
        assert_eq!(pool.get(GPU), Amount::ZERO);
        assert!(!pool.try_subtract(&quarter));
        for _ in 0..10 {
            pool.add(&quarter);
        }
        assert_eq!(pool.get(GPU), amount(1.0));
    }

    #[test]
    fn amounts_display_without_float_noise() {
        assert_eq!(amount(0.25).to_string(), "0.25");
        assert_eq!(amount(3.0).to_string(), "3.0");
        assert_eq!(amount(0.1 + 0.2).to_string(), "0.3");
    }

    #[test]
    fn bad_amounts_are_rejected_with_the_resource_named() {
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e12] {
            let error = Amount::parse(CPU, bad).unwrap_err().to_string();
            assert!(error.contains("'CPU'"), "{error}");
        }
        assert!(Amount::parse(MEMORY, 64e9).is_ok());
        assert!(Amount::parse(MEMORY, 1e15).is_err());
        assert!(Amount::from_raw(-5).is_err());
    }

    #[test]
    fn custom_resources_parse_from_json() {
        let set = ResourceSet::parse_custom_json(r#"{"TPU": 4, "accel:a100": 0.5}"#).unwrap();
        assert_eq!(set.get("TPU"), amount(4.0));
        assert_eq!(set.get("accel:a100"), amount(0.5));
    }

    #[test]
    fn malformed_custom_resources_say_what_is_wrong() {
        let cases = [
            (r#"{"TPU": 4"#, "JSON object"),
            (r#"[1, 2]"#, "JSON object"),
            (r#"{"TPU": "four"}"#, "must be a number"),
            (r#"{"TPU": -4}"#, ">= 0"),
            (r#"{"CPU": 4}"#, "--num-cpus"),
            (r#"{"": 1}"#, "resource name"),
            (r#"{"a b": 1}"#, "resource name"),
        ];
        for (json, expected) in cases {
            let error = ResourceSet::parse_custom_json(json).unwrap_err().to_string();
            assert!(error.contains(expected), "{json}: {error}");
        }
    }

    #[test]
    fn wire_form_round_trips_and_rejects_garbage() {
        let set = ResourceSet::new().with(CPU, amount(2.5)).with("TPU", amount(1.0));
        assert_eq!(ResourceSet::from_proto(&set.to_proto()).unwrap(), set);
        let mut bad = set.to_proto();
        bad.amounts.insert("CPU".into(), -1);
        assert!(ResourceSet::from_proto(&bad).is_err());
    }
}
