//! What data parallelism changes about a training schedule: the learning
//! rate for a global batch that grew with the workers, the warmup and
//! cosine decay that transformers train with, and when to stop because the
//! validation metric stopped improving.

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

/// A learning rate that rises linearly from 0 to `peak` over
/// `warmup_steps`, then follows half a cosine down to `peak * final_ratio`
/// at `total_steps`, and stays there.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WarmupCosine {
    pub peak: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    /// The final learning rate as a fraction of the peak.
    pub final_ratio: f64,
}

impl WarmupCosine {
    /// The learning rate of step `step`, counting from 0.
    pub fn at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let floor = self.peak * self.final_ratio;
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        floor + (self.peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
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
    fn the_learning_rate_warms_up_linearly_then_decays_along_a_cosine_to_its_floor() {
        let schedule = WarmupCosine {
            peak: 1.0,
            warmup_steps: 4,
            total_steps: 14,
            final_ratio: 0.1,
        };
        let rates: Vec<f64> = (0..4).map(|step| schedule.at(step)).collect();
        assert_eq!(rates, [0.25, 0.5, 0.75, 1.0]);
        assert_eq!(schedule.at(4), 1.0, "the decay starts at the peak");
        assert!(
            (schedule.at(9) - 0.55).abs() < 1e-12,
            "halfway: the mean of peak and floor"
        );
        assert!((schedule.at(14) - 0.1).abs() < 1e-12);
        assert!(
            (schedule.at(100) - 0.1).abs() < 1e-12,
            "past the end it stays at the floor"
        );
        let decaying: Vec<f64> = (4..=14).map(|step| schedule.at(step)).collect();
        assert!(decaying.windows(2).all(|pair| pair[1] < pair[0]), "{decaying:?}");
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
