//! What users of a served model feel, measured where tokens are made: time
//! to first token (from a request's arrival at the engine), the gaps
//! between a sequence's tokens, and tokens made per second. Each is kept
//! over a recent window for the deployment's figures (`raylet serve
//! status`) and, when the engine serves a deployment, counted on the
//! cluster's `/metrics` labelled by application and deployment.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use raylet::metrics::{Counter, Gauge, Histogram};

/// Samples of each latency kept for percentiles.
const LATENCY_WINDOW: usize = 4096;
/// How far back tokens/s looks.
const RATE_WINDOW: Duration = Duration::from_secs(10);

const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];

static FIRST_TOKEN: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new(
        "serve_llm_time_to_first_token_seconds",
        "Time from a request's arrival at a model replica to its first generated token",
        &LATENCY_BUCKETS,
        &["app", "deployment"],
    )
});
static INTER_TOKEN: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new(
        "serve_llm_inter_token_latency_seconds",
        "Time between two tokens of one sequence",
        &LATENCY_BUCKETS,
        &["app", "deployment"],
    )
});
static TOKENS: LazyLock<Counter> = LazyLock::new(|| {
    Counter::new(
        "serve_llm_generated_tokens_total",
        "Tokens a model replica generated",
        &["app", "deployment"],
    )
});
static SEQUENCES: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_llm_sequences",
        "Sequences at a model replica, by state (running in the batch, or waiting to join it)",
        &["app", "deployment", "replica", "state"],
    )
});
static CACHE_TOKENS: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_llm_kv_cache_tokens",
        "Tokens of key/value cache at a model replica, by kind (reserved, capacity)",
        &["app", "deployment", "replica", "kind"],
    )
});

/// Who the figures are of, as labels on `/metrics`.
#[derive(Clone, Debug)]
pub struct StatsLabels {
    pub app: String,
    pub deployment: String,
    pub replica: String,
}

/// An engine's serving figures.
pub struct ServingStats {
    labels: Option<StatsLabels>,
    windows: Mutex<Windows>,
    /// Tokens made since the engine started.
    generated: AtomicU64,
}

#[derive(Default)]
struct Windows {
    first_token: VecDeque<f64>,
    inter_token: VecDeque<f64>,
    /// When tokens were made, and how many.
    made: VecDeque<(Instant, u64)>,
}

/// The figures at one moment, in seconds and tokens per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StatsSnapshot {
    pub time_to_first_token_p50: f64,
    pub time_to_first_token_p99: f64,
    pub inter_token_latency_p50: f64,
    pub inter_token_latency_p99: f64,
    pub tokens_per_second: f64,
    /// Tokens made since the engine started.
    pub generated_tokens: u64,
}

impl ServingStats {
    /// Figures kept here only.
    pub fn unlabelled() -> Self {
        ServingStats {
            labels: None,
            windows: Mutex::default(),
            generated: AtomicU64::new(0),
        }
    }

    /// Figures also counted on `/metrics` with `labels`.
    pub fn labelled(labels: StatsLabels) -> Self {
        ServingStats {
            labels: Some(labels),
            windows: Mutex::default(),
            generated: AtomicU64::new(0),
        }
    }

    pub(crate) fn first_token(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        push_bounded(&mut self.lock().first_token, seconds);
        if let Some(labels) = &self.labels {
            FIRST_TOKEN.observe(&[&labels.app, &labels.deployment], seconds);
        }
    }

    pub(crate) fn inter_token(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        push_bounded(&mut self.lock().inter_token, seconds);
        if let Some(labels) = &self.labels {
            INTER_TOKEN.observe(&[&labels.app, &labels.deployment], seconds);
        }
    }

    pub(crate) fn tokens_made(&self, count: u64) {
        self.generated.fetch_add(count, Ordering::Relaxed);
        let now = Instant::now();
        let mut windows = self.lock();
        windows.made.push_back((now, count));
        while windows.made.front().is_some_and(|(at, _)| now - *at > RATE_WINDOW) {
            windows.made.pop_front();
        }
        drop(windows);
        if let Some(labels) = &self.labels {
            TOKENS.inc(&[&labels.app, &labels.deployment], count as f64);
        }
    }

    /// The engine's occupancy, on `/metrics`.
    pub(crate) fn occupancy(&self, running: usize, waiting: usize, reserved: usize, capacity: usize) {
        let Some(labels) = &self.labels else {
            return;
        };
        let series = |state| [&*labels.app, &*labels.deployment, &*labels.replica, state];
        for (state, count) in [("running", running), ("waiting", waiting)] {
            SEQUENCES.set(&series(state), count as f64);
        }
        for (kind, tokens) in [("reserved", reserved), ("capacity", capacity)] {
            CACHE_TOKENS.set(&series(kind), tokens as f64);
        }
    }

    /// The figures over the recent windows.
    pub fn snapshot(&self) -> StatsSnapshot {
        let windows = self.lock();
        let rate = match (windows.made.front(), windows.made.back()) {
            (Some((first, _)), Some(_)) => {
                let tokens: u64 = windows.made.iter().map(|(_, count)| count).sum();
                let span = first.elapsed().max(Duration::from_millis(100));
                tokens as f64 / span.as_secs_f64()
            }
            _ => 0.0,
        };
        StatsSnapshot {
            time_to_first_token_p50: percentile(&windows.first_token, 0.50),
            time_to_first_token_p99: percentile(&windows.first_token, 0.99),
            inter_token_latency_p50: percentile(&windows.inter_token, 0.50),
            inter_token_latency_p99: percentile(&windows.inter_token, 0.99),
            tokens_per_second: rate,
            generated_tokens: self.generated.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn push_bounded(window: &mut VecDeque<f64>, value: f64) {
    if window.len() == LATENCY_WINDOW {
        window.pop_front();
    }
    window.push_back(value);
}

/// The `q` quantile of `samples` (nearest rank); 0 when there are none.
fn percentile(samples: &VecDeque<f64>, q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted: Vec<f64> = samples.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_ranks_of_the_window() {
        let stats = ServingStats::unlabelled();
        for ms in 1..=100 {
            stats.first_token(Duration::from_millis(ms));
        }
        let snapshot = stats.snapshot();
        assert!((snapshot.time_to_first_token_p50 - 0.050).abs() < 1e-9);
        assert!((snapshot.time_to_first_token_p99 - 0.099).abs() < 1e-9);
        assert_eq!(snapshot.inter_token_latency_p99, 0.0);
    }

    #[test]
    fn tokens_per_second_counts_the_recent_tokens() {
        let stats = ServingStats::unlabelled();
        stats.tokens_made(50);
        std::thread::sleep(Duration::from_millis(200));
        stats.tokens_made(50);
        let rate = stats.snapshot().tokens_per_second;
        assert!(rate > 100.0 && rate <= 500.0, "{rate} tokens/s");
    }
}
