//! Metrics that any raylet process (a driver, a task, an actor) records,
//! as Ray's `ray.util.metrics` does: counters, gauges and histograms with
//! labels. Each process sums its updates and sends them to the head with
//! its task events once a second, and a worker also hands them to the
//! owner of each task it finishes (so none are lost when it is ended); the
//! head exports them on `/metrics`.
//! Train records its step and allreduce times this way, Tune its trials by
//! state.
//!
//! ```no_run
//! use raylet::metrics::Histogram;
//! let latency = Histogram::new("app_batch_seconds", "Time per batch", &[0.01, 0.1, 1.0], &["model"]);
//! latency.observe(&["resnet"], 0.042);
//! ```

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use raylet_proto::v1::{MetricKind, MetricUpdate};

/// Most observations a histogram series keeps between two reports.
const MAX_OBSERVATIONS: usize = 10_000;

/// One series: a metric's name and its label values.
type SeriesKey = (String, Vec<String>);

static PENDING: LazyLock<Mutex<HashMap<SeriesKey, MetricUpdate>>> = LazyLock::new(Mutex::default);

/// The definition a metric's series share.
#[derive(Clone, Debug)]
struct Definition {
    name: String,
    help: String,
    kind: MetricKind,
    label_names: Vec<String>,
    buckets: Vec<f64>,
}

impl Definition {
    fn new(name: &str, help: &str, kind: MetricKind, label_names: &[&str], buckets: &[f64]) -> Self {
        Definition {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            label_names: label_names.iter().map(|label| label.to_string()).collect(),
            buckets: buckets.to_vec(),
        }
    }

    /// Changes the pending update of the series `labels`; values for a
    /// different number of labels than the metric has are ignored.
    fn update(&self, labels: &[&str], change: impl FnOnce(&mut MetricUpdate)) {
        if labels.len() != self.label_names.len() {
            tracing::warn!(
                metric = self.name,
                "a metric was given the wrong number of label values"
            );
            return;
        }
        let values: Vec<String> = labels.iter().map(|value| value.to_string()).collect();
        let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        let update = pending
            .entry((self.name.clone(), values.clone()))
            .or_insert_with(|| MetricUpdate {
                name: self.name.clone(),
                help: self.help.clone(),
                kind: self.kind as i32,
                label_names: self.label_names.clone(),
                label_values: values,
                buckets: self.buckets.clone(),
                ..MetricUpdate::default()
            });
        change(update);
    }
}

/// A count that only goes up.
#[derive(Clone, Debug)]
pub struct Counter(Definition);

impl Counter {
    pub fn new(name: &str, help: &str, label_names: &[&str]) -> Self {
        Counter(Definition::new(name, help, MetricKind::Counter, label_names, &[]))
    }

    pub fn inc(&self, labels: &[&str], by: f64) {
        if by > 0.0 {
            self.0.update(labels, |update| update.value += by);
        }
    }
}

/// A value that is set.
#[derive(Clone, Debug)]
pub struct Gauge(Definition);

impl Gauge {
    pub fn new(name: &str, help: &str, label_names: &[&str]) -> Self {
        Gauge(Definition::new(name, help, MetricKind::Gauge, label_names, &[]))
    }

    pub fn set(&self, labels: &[&str], value: f64) {
        self.0.update(labels, |update| update.value = value);
    }
}

/// Observations counted in buckets (upper bounds, ascending).
#[derive(Clone, Debug)]
pub struct Histogram(Definition);

impl Histogram {
    pub fn new(name: &str, help: &str, buckets: &[f64], label_names: &[&str]) -> Self {
        Histogram(Definition::new(name, help, MetricKind::Histogram, label_names, buckets))
    }

    pub fn observe(&self, labels: &[&str], value: f64) {
        self.0.update(labels, |update| {
            if update.observations.len() < MAX_OBSERVATIONS {
                update.observations.push(value);
            }
        });
    }
}

/// The updates since the last call: for the next report to the head, or
/// in a worker for the result of the task it ran, which its owner passes on.
pub(crate) fn take_updates() -> Vec<MetricUpdate> {
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    pending.drain().map(|(_, update)| update).collect()
}

/// Adds updates that a worker sent with a task's result to this process's.
pub(crate) fn absorb(updates: Vec<MetricUpdate>) {
    if updates.is_empty() {
        return;
    }
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    for update in updates {
        let key = (update.name.clone(), update.label_values.clone());
        match pending.get_mut(&key) {
            None => {
                pending.insert(key, update);
            }
            Some(held) => match update.kind() {
                MetricKind::Counter => held.value += update.value,
                MetricKind::Gauge => held.value = update.value,
                MetricKind::Histogram => {
                    let room = MAX_OBSERVATIONS.saturating_sub(held.observations.len());
                    held.observations.extend(update.observations.into_iter().take(room));
                }
            },
        }
    }
}
