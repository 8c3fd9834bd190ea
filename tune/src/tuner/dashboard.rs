//! What an experiment shows on the dashboard's Train & Tune page: its
//! status and metric, and each trial's config, status, latest result and
//! history, published to the head at most once a second and when the
//! experiment ends; with it, the `raylet_tune_trials{experiment,state}`
//! gauge of `/metrics`. The dashboard is a view: a failed publish is logged
//! and the experiment goes on.

use std::sync::LazyLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use raylet::Cluster;
use raylet::metrics::Gauge;
use raylet_train::Metrics;
use serde::Serialize;

use super::trial_state::Trial;
use crate::{Mode, TrialConfig, TrialStatus};

static TRIALS: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "raylet_tune_trials",
        "Trials of each running or finished experiment, by state",
        &["experiment", "state"],
    )
});
const STATES: [TrialStatus; 5] = [
    TrialStatus::Pending,
    TrialStatus::Running,
    TrialStatus::Paused,
    TrialStatus::Terminated,
    TrialStatus::Error,
];

/// The shortest time between two publishes of a running experiment.
const PUBLISH_PERIOD: Duration = Duration::from_secs(1);
/// The most results a trial's curve shows, the newest: with the head's
/// 16 MiB bound on an entry, a few thousand trials still fit.
const MAX_HISTORY: usize = 200;

#[derive(Serialize)]
struct HistoryPoint<'a> {
    iteration: usize,
    metrics: &'a Metrics,
}

#[derive(Serialize)]
struct TrialEntry<'a> {
    id: &'a str,
    status: String,
    config: &'a TrialConfig,
    iterations: u64,
    last: Option<&'a Metrics>,
    error: Option<&'a str>,
    history: Vec<HistoryPoint<'a>>,
}

/// An experiment as the dashboard's `/api/tune` lists it.
#[derive(Serialize)]
struct ExperimentEntry<'a> {
    id: &'a str,
    name: &'a str,
    /// RUNNING or FINISHED.
    status: &'a str,
    metric: &'a str,
    mode: Mode,
    updated_ms: u64,
    trials: Vec<TrialEntry<'a>>,
}

pub(super) struct ExperimentBoard {
    id: String,
    published: Option<Instant>,
}

impl ExperimentBoard {
    pub(super) fn new(name: &str) -> Self {
        let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        ExperimentBoard {
            id: format!("{name}-{}", started.as_millis()),
            published: None,
        }
    }

    /// Publishes the experiment if a second passed since the last time, or
    /// when `finished`.
    pub(super) fn update(
        &mut self,
        cluster: &Cluster,
        name: &str,
        goal: (&str, Mode),
        trials: &[Trial],
        finished: bool,
    ) {
        if !finished && self.published.is_some_and(|at| at.elapsed() < PUBLISH_PERIOD) {
            return;
        }
        self.published = Some(Instant::now());
        let updated_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let entry = ExperimentEntry {
            id: &self.id,
            name,
            status: if finished { "FINISHED" } else { "RUNNING" },
            metric: goal.0,
            mode: goal.1,
            updated_ms,
            trials: trials.iter().map(trial_entry).collect(),
        };
        for state in STATES {
            let count = trials.iter().filter(|trial| trial.status() == state).count();
            TRIALS.set(&[name, &state.to_string()], count as f64);
        }
        if let Err(error) = cluster.publish_to_dashboard("tune", &self.id, &entry) {
            tracing::debug!(%error, experiment = name, "the experiment could not be shown on the dashboard");
        }
    }
}

fn trial_entry(trial: &Trial) -> TrialEntry<'_> {
    let skip = trial.history.len().saturating_sub(MAX_HISTORY);
    TrialEntry {
        id: trial.id(),
        status: trial.status().to_string(),
        config: &trial.view().config,
        iterations: trial.view().iteration,
        last: trial.view().last_result.as_ref(),
        error: trial.record.error.as_deref(),
        history: trial
            .history
            .iter()
            .enumerate()
            .skip(skip)
            .map(|(index, metrics)| HistoryPoint {
                iteration: index + 1,
                metrics,
            })
            .collect(),
    }
}
