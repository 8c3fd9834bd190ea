//! Searchers: where each new trial's configuration comes from. The basic
//! variant searcher walks the grid and draws the rest at random; TPE
//! learns from finished trials; [`Searcher`] is the trait for others.

mod basic_variant;
mod latin_hypercube;
mod space;
pub mod tpe;

pub use basic_variant::BasicVariant;
pub use space::{
    Domain, SampleFn, SearchSpace, choice, constant, grid, lograndint, loguniform, qrandint, quniform, randint, randn,
    sample_from, uniform,
};
pub use tpe::Tpe;

use raylet_train::Metrics;

use crate::{Mode, TrialConfig, TuneError};

pub(crate) use latin_hypercube::latin_hypercube;
pub(crate) use space::standard_normal;

/// What a searcher proposes next.
#[derive(Clone, Debug, PartialEq)]
pub enum Suggestion {
    /// Start a trial with this configuration.
    Config(TrialConfig),
    /// Nothing now: ask again when a trial finishes.
    Wait,
    /// The search is over.
    Finished,
}

/// What a searcher is told before its first suggestion.
#[derive(Clone, Copy, Debug)]
pub struct SearchSetup<'a> {
    pub space: &'a SearchSpace,
    /// The metric to optimize, if the search has one.
    pub metric: Option<&'a str>,
    pub mode: Mode,
    /// How many trials to make (for the basic variant searcher: how many
    /// times to walk the grid).
    pub num_samples: usize,
}

/// Proposes trial configurations and learns from their results.
pub trait Searcher: Send {
    /// Takes the search space and objective; fails when it cannot search it.
    fn setup(&mut self, setup: &SearchSetup<'_>) -> Result<(), TuneError>;

    /// The configuration of the trial `trial_id`, which is about to start.
    fn suggest(&mut self, trial_id: &str) -> Suggestion;

    /// An intermediate result of a running trial.
    fn on_trial_result(&mut self, _trial_id: &str, _result: &Metrics) {}

    /// How many trials may wait unstarted at once: the driver asks for
    /// suggestions until this many wait. One by default, so that each
    /// suggestion sees the latest results.
    fn max_pending(&self) -> usize {
        1
    }

    /// A trial ended: with its last result, or with `None` when it failed.
    fn on_trial_complete(&mut self, trial_id: &str, result: Option<&Metrics>);

    /// A trial of an experiment being restored, in the order they were
    /// made: it had `config`, and ended with `result` if it ended. Later
    /// suggestions then go on from where the interrupted search was.
    fn restore_trial(&mut self, trial_id: &str, config: &TrialConfig, result: Option<&Metrics>);
}
