//! Resources a call, an actor or a bundle asks for, by name, as given.

use raylet_proto::resources::GPU;
use raylet_proto::{Amount, ResourceSet};

use crate::Result;

/// Resources a call or an actor asks for, by name, as given.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resources(Vec<(String, f64)>);

impl Resources {
    /// These resources with `name` set to `amount`.
    pub(crate) fn with(mut self, name: &str, amount: f64) -> Self {
        self.0.retain(|(existing, _)| existing != name);
        self.0.push((name.to_string(), amount));
        self
    }

    pub(crate) fn names(&self, name: &str) -> bool {
        self.0.iter().any(|(existing, _)| existing == name)
    }

    /// The amounts, validated: more than one GPU must be a whole number.
    pub(crate) fn to_set(&self) -> Result<ResourceSet> {
        let mut set = ResourceSet::new();
        for (name, amount) in &self.0 {
            if name == GPU && *amount > 1.0 && amount.fract() != 0.0 {
                let message = format!("num_gpus above 1 must be a whole number, got {amount}");
                return Err(raylet_proto::Error::InvalidArgument(message).into());
            }
            set.set(name, Amount::parse(name, *amount)?);
        }
        Ok(set)
    }
}
