//! What data parallelism changes about a training schedule: the learning
//! rate for a global batch that grew with the workers, and when to stop
//! because the validation metric stopped improving.

/// How the learning rate grows with the global batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LrScaling {
    /// In proportion to the batch (Goyal et al.), for SGD.
    Linear,
    /// With the square root of the batch, for adaptive optimizers.
    Sqrt,
}

/// The learning rate for `global_batch` when `base_lr` suited `base_batch`.
pub fn scaled_learning_rate(base_lr: f64, base_batch: usize, global_batch: usize, rule: LrScaling) -> f64 {
    let ratio = global_batch as f64 / base_batch.max(1) as f64;
    match rule {
        LrScaling::Linear => base_lr * ratio,
        LrScaling::Sqrt => base_lr * ratio.sqrt(),
    }
}

/// Whether a metric improves by going down (a loss) or up (an accuracy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    Minimize,
    Maximize,
}

/// Stops training once the validation metric has not improved by more than
/// `min_delta` for `patience` evaluations in a row.
#[derive(Clone, Debug)]
pub struct EarlyStopping {
    patience: usize,
    goal: Goal,
    min_delta: f64,
    best: Option<f64>,
    since_best: usize,
}

impl EarlyStopping {
    pub fn new(patience: usize, goal: Goal) -> Self {
        EarlyStopping {
            patience,
            goal,
            min_delta: 0.0,
            best: None,
            since_best: 0,
        }
    }

    /// An improvement must beat the best value by more than this.
    pub fn min_delta(mut self, delta: f64) -> Self {
        self.min_delta = delta.abs();
        self
    }

    /// Records one evaluation; returns whether training should stop.
    pub fn should_stop(&mut self, metric: f64) -> bool {
        let improved = match (self.best, self.goal) {
            (None, _) => true,
            (Some(best), Goal::Minimize) => metric < best - self.min_delta,
            (Some(best), Goal::Maximize) => metric > best + self.min_delta,
        };
        if improved {
            self.best = Some(metric);
            self.since_best = 0;
        } else {
            self.since_best += 1;
        }
        self.since_best >= self.patience
    }

    /// The best value seen so far.
    pub fn best(&self) -> Option<f64> {
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learning_rate_grows_linearly_or_with_the_square_root_of_the_batch() {
        assert_eq!(scaled_learning_rate(0.1, 32, 128, LrScaling::Linear), 0.4);
        assert_eq!(scaled_learning_rate(0.1, 32, 128, LrScaling::Sqrt), 0.2);
        assert_eq!(scaled_learning_rate(0.1, 32, 32, LrScaling::Linear), 0.1);
    }

    #[test]
    fn training_stops_after_patience_evaluations_without_improvement() {
        let mut stopping = EarlyStopping::new(2, Goal::Minimize).min_delta(0.01);
        assert!(!stopping.should_stop(1.0));
        assert!(!stopping.should_stop(0.5));
        assert!(!stopping.should_stop(0.495), "within min_delta: not an improvement");
        assert!(stopping.should_stop(0.6), "two evaluations without improvement");
        assert_eq!(stopping.best(), Some(0.5));
        let mut accuracy = EarlyStopping::new(1, Goal::Maximize);
        assert!(!accuracy.should_stop(0.9));
        assert!(!accuracy.should_stop(0.95));
        assert!(accuracy.should_stop(0.94));
    }
}
