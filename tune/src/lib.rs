//! raylet-tune: parallel hyperparameter search on a raylet cluster.

mod config;
mod error;
pub mod schedulers;
pub mod search;
mod trial;

pub use config::TrialConfig;
pub use error::TuneError;
pub use raylet_train::ScoreMode as Mode;
pub use trial::{TrialStatus, TrialView};
