//! raylet-train: data-parallel training on a raylet cluster. Its
//! [`collective`] group is how the workers of a training job exchange
//! gradients and parameters: ranks meet through the cluster's key-value
//! store, then talk over direct TCP.

pub mod collective;
