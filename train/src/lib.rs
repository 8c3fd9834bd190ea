//! raylet-train: data-parallel training on a raylet cluster. Its
//! [`collective`] group is how the workers of a training job exchange
//! gradients and parameters: ranks meet through the cluster's key-value
//! store, then talk over direct TCP. [`model_sync`] keeps burn model
//! replicas in step over a group, and [`schedule`] has the learning-rate
//! scaling and early stopping that data parallelism calls for.

pub mod collective;
pub mod model_sync;
pub mod schedule;
