//! `WorkerEvent`: what a worker tells the driver, sent from its train
//! loop's context and thread, and polled from the worker actor.

use serde::{Deserialize, Serialize};

use crate::{Checkpoint, Metrics};

/// What a worker tells the driver.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerEvent {
    /// Rank 0 reported.
    Report {
        index: u64,
        metrics: Metrics,
        checkpoint: Option<Checkpoint>,
    },
    /// The train loop returned.
    Finished,
    /// The train loop failed or panicked.
    Failed(String),
}
