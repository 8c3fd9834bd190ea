//! raylet-lm's integration tests, one binary: preparing a corpus on an
//! embedded cluster, training and tuning a GPT on it (tracked on MLflow),
//! and scoring files with it.

mod inference;
mod prepare;
mod stdlib_sample;
mod tracking;
mod training;
mod tuning;
