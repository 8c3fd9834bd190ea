//! raylet-train's integration tests, one binary (each test still runs in a
//! process of its own under nextest): collectives, data-parallel training,
//! sharding, the Trainer, MLflow, object storage and tensors as objects.

mod collective;
mod collective_actors;
mod data_parallel;
mod mlflow;
mod object_storage;
mod sharding;
mod tensor_objects;
mod trainer;
