//! raylet-lm's integration tests, one binary: preparing a corpus on an
//! embedded cluster, and training a GPT on it.

mod prepare;
mod stdlib_sample;
mod training;
