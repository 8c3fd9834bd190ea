//! The basic variant searcher: every combination of the grid values,
//! `num_samples` times, with the other values drawn at random (Ray's
//! `BasicVariantGenerator`).

use rand::SeedableRng;
use rand::rngs::StdRng;
use raylet_train::Metrics;

use super::{SearchSetup, SearchSpace, Searcher, Suggestion};
use crate::{TrialConfig, TuneError};

/// Grid and random search.
pub struct BasicVariant {
    rng: StdRng,
    space: SearchSpace,
    grid: Vec<TrialConfig>,
    total: usize,
    made: usize,
}

impl BasicVariant {
    /// Draws from an unpredictable seed.
    pub fn new() -> Self {
        Self::seeded(rand::random())
    }

    /// Draws the same configurations every run.
    pub fn seeded(seed: u64) -> Self {
        BasicVariant {
            rng: StdRng::seed_from_u64(seed),
            space: SearchSpace::new(),
            grid: vec![TrialConfig::new()],
            total: 0,
            made: 0,
        }
    }
}

impl Default for BasicVariant {
    fn default() -> Self {
        Self::new()
    }
}

impl Searcher for BasicVariant {
    fn setup(&mut self, setup: &SearchSetup<'_>) -> Result<(), TuneError> {
        setup.space.check()?;
        self.space = setup.space.clone();
        self.grid = grid_product(&self.space);
        self.total = setup.num_samples * self.grid.len();
        Ok(())
    }

    fn suggest(&mut self, _trial_id: &str) -> Suggestion {
        if self.made >= self.total {
            return Suggestion::Finished;
        }
        let point = &self.grid[self.made % self.grid.len()];
        self.made += 1;
        Suggestion::Config(self.space.sample_with(point, &mut self.rng))
    }

    /// Its configurations do not depend on results, so it makes them
    /// well ahead (as Ray does): synchronous schedulers such as HyperBand
    /// see their brackets filled before they cut.
    fn max_pending(&self) -> usize {
        16
    }

    fn on_trial_complete(&mut self, _trial_id: &str, _result: Option<&Metrics>) {}

    fn restore_trial(&mut self, trial_id: &str, _config: &TrialConfig, _result: Option<&Metrics>) {
        self.suggest(trial_id);
    }
}

/// Every combination of the grid values; the first grid entry changes
/// fastest. One empty configuration when there is no grid.
fn grid_product(space: &SearchSpace) -> Vec<TrialConfig> {
    let entries = space.grid_entries();
    let count: usize = entries.iter().map(|(_, values)| values.len()).product();
    (0..count)
        .map(|mut index| {
            let mut point = TrialConfig::new();
            for (path, values) in &entries {
                point.set(path, values[index % values.len()].clone());
                index /= values.len();
            }
            point
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::Mode;
    use crate::search::{grid, uniform};

    fn all_suggestions(searcher: &mut BasicVariant) -> Vec<TrialConfig> {
        let mut configs = Vec::new();
        while let Suggestion::Config(config) = searcher.suggest("t") {
            configs.push(config);
        }
        configs
    }

    fn setup(space: &SearchSpace, num_samples: usize) -> SearchSetup<'_> {
        SearchSetup {
            space,
            metric: None,
            mode: Mode::Max,
            num_samples,
        }
    }

    #[test]
    fn the_grid_is_complete_num_samples_times_with_fresh_random_values() {
        let space = SearchSpace::new()
            .with("a", grid([1, 2, 3]))
            .with("b", grid(["x", "y"]))
            .with("lr", uniform(0.0, 1.0));
        let mut searcher = BasicVariant::seeded(3);
        searcher.setup(&setup(&space, 2)).unwrap();
        let configs = all_suggestions(&mut searcher);
        assert_eq!(configs.len(), 12);
        let combos: Vec<(i64, String)> = configs
            .iter()
            .map(|c| (c.get("a").unwrap(), c.get("b").unwrap()))
            .collect();
        let distinct: BTreeSet<_> = combos.iter().cloned().collect();
        assert_eq!(distinct.len(), 6, "every combination of the grid: {combos:?}");
        assert_eq!(
            &combos[..6],
            &combos[6..],
            "each sample walks the whole grid in the same order"
        );
        assert_eq!(combos[0], (1, "x".into()));
        assert_eq!(combos[1], (2, "x".into()), "the first grid entry changes fastest");
        let lrs: BTreeSet<u64> = configs.iter().map(|c| c.get::<f64>("lr").unwrap().to_bits()).collect();
        assert_eq!(lrs.len(), 12, "every trial draws its own random values");
    }

    #[test]
    fn seeded_searches_repeat_and_a_restore_goes_on_where_the_search_was() {
        let space = SearchSpace::new().with("lr", uniform(0.0, 1.0));
        let run = |seed| {
            let mut searcher = BasicVariant::seeded(seed);
            searcher.setup(&setup(&space, 10)).unwrap();
            all_suggestions(&mut searcher)
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));

        let whole = run(5);
        let mut restored = BasicVariant::seeded(5);
        restored.setup(&setup(&space, 10)).unwrap();
        for config in &whole[..4] {
            restored.restore_trial("t", config, None);
        }
        assert_eq!(all_suggestions(&mut restored), whole[4..]);
    }
}
