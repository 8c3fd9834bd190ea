//! Metrics that any raylet process (a driver, a task, an actor) records,
//! as Ray's `ray.util.metrics` does: counters, gauges and histograms with
//! labels. Each process sums its updates per series (a metric's name and
//! label values) and sends them to the head with its task events once a
//! second, and a worker also hands them to the owner of each task it
//! finishes (so none are lost when it is ended); the head exports them on
//! `/metrics`. A histogram counts each observation into its bucket as it is
//! recorded, so a series' update is one count per bucket and a sum however
//! many observations it holds, and none is dropped on the way.
//! Train records its step and allreduce times this way, Tune its trials by
//! state.
//!
//! ```no_run
//! use raylet::metrics::Histogram;
//! let latency = Histogram::new("app_batch_seconds", "Time per batch", &[0.01, 0.1, 1.0], &["model"]);
//! latency.observe(&["resnet"], 0.042);
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use raylet_proto::v1::{MetricKind, MetricUpdate};

/// This process's updates since its last report.
static PENDING: LazyLock<Mutex<PendingUpdates>> = LazyLock::new(Mutex::default);

/// Hashes series for [`PendingUpdates`]; shared, so that an update hashes
/// its series before it takes the lock.
static SERIES_HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// The pending update of each series, by the hash of its name and label
/// values (with the rare collisions side by side): found without building
/// the series' key, so an update of a series that has one allocates nothing.
#[derive(Default)]
struct PendingUpdates {
    by_hash: HashMap<u64, Vec<MetricUpdate>>,
}

impl PendingUpdates {
    /// The pending update of `definition`'s series `labels`, whose hash is
    /// `hash`; made now if the series has none.
    fn series(&mut self, hash: u64, definition: &Definition, labels: &[&str]) -> &mut MetricUpdate {
        let same_hash = self.by_hash.entry(hash).or_default();
        let index = match same_hash
            .iter()
            .position(|held| is_series(held, &definition.name, labels))
        {
            Some(index) => index,
            None => {
                same_hash.push(definition.new_update(labels));
                same_hash.len() - 1
            }
        };
        &mut same_hash[index]
    }

    /// Every pending update; none is left.
    fn take(&mut self) -> Vec<MetricUpdate> {
        self.by_hash.drain().flat_map(|(_, updates)| updates).collect()
    }

    /// Adds an update made elsewhere to the pending one of its series.
    fn absorb(&mut self, update: MetricUpdate) {
        let labels: Vec<&str> = update.label_values.iter().map(String::as_str).collect();
        let same_hash = self.by_hash.entry(series_hash(&update.name, &labels)).or_default();
        match same_hash.iter().position(|held| is_series(held, &update.name, &labels)) {
            None => same_hash.push(update),
            Some(index) => merge(&mut same_hash[index], update),
        }
    }
}

fn series_hash(name: &str, labels: &[&str]) -> u64 {
    SERIES_HASHER.hash_one((name, labels))
}

fn is_series(update: &MetricUpdate, name: &str, labels: &[&str]) -> bool {
    update.name == name
        && update
            .label_values
            .iter()
            .map(String::as_str)
            .eq(labels.iter().copied())
}

fn lock(pending: &Mutex<PendingUpdates>) -> MutexGuard<'_, PendingUpdates> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Adds `update` to `held`, the pending update of the same series.
fn merge(held: &mut MetricUpdate, update: MetricUpdate) {
    match update.kind() {
        MetricKind::Counter => held.value += update.value,
        MetricKind::Gauge => held.value = update.value,
        MetricKind::Histogram => add_bucket_counts(held, &update),
    }
}

/// Adds a histogram update's counts and sum to `held`'s; an update with
/// other buckets is dropped.
fn add_bucket_counts(held: &mut MetricUpdate, update: &MetricUpdate) {
    if held.buckets != update.buckets || held.bucket_counts.len() != update.bucket_counts.len() {
        tracing::warn!(
            metric = update.name,
            "a histogram's update has other buckets than this process's; dropped"
        );
        return;
    }
    for (count, added) in held.bucket_counts.iter_mut().zip(&update.bucket_counts) {
        *count += added;
    }
    held.sum += update.sum;
}

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

    /// An update of the series `labels` with nothing in it yet.
    fn new_update(&self, labels: &[&str]) -> MetricUpdate {
        let bucket_counts = match self.kind {
            MetricKind::Histogram => vec![0; self.buckets.len() + 1],
            MetricKind::Counter | MetricKind::Gauge => Vec::new(),
        };
        MetricUpdate {
            name: self.name.clone(),
            help: self.help.clone(),
            kind: self.kind as i32,
            label_names: self.label_names.clone(),
            label_values: labels.iter().map(|value| value.to_string()).collect(),
            buckets: self.buckets.clone(),
            bucket_counts,
            ..MetricUpdate::default()
        }
    }

    /// Changes the update of the series `labels` in `pending`; values for a
    /// different number of labels than the metric has are ignored.
    fn update(&self, pending: &Mutex<PendingUpdates>, labels: &[&str], change: impl FnOnce(&mut MetricUpdate)) {
        if labels.len() != self.label_names.len() {
            tracing::warn!(
                metric = self.name,
                "a metric was given the wrong number of label values"
            );
            return;
        }
        let hash = series_hash(&self.name, labels);
        change(lock(pending).series(hash, self, labels));
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
            self.0.update(&PENDING, labels, |update| update.value += by);
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
        self.0.update(&PENDING, labels, |update| update.value = value);
    }
}

/// Observations counted in buckets, as Prometheus's histograms count them:
/// each in the first bucket whose upper bound is at least the value, or in
/// the +Inf bucket above them all (NaN too).
#[derive(Clone, Debug)]
pub struct Histogram(Definition);

impl Histogram {
    /// A histogram whose buckets have the upper bounds `buckets`, which
    /// increase; the +Inf bucket is always there (a last bound of +Inf is
    /// that bucket), and a histogram of no bounds counts only the
    /// observations and their sum.
    pub fn new(name: &str, help: &str, buckets: &[f64], label_names: &[&str]) -> Self {
        let bounds = buckets.strip_suffix(&[f64::INFINITY]).unwrap_or(buckets);
        Histogram(Definition::new(name, help, MetricKind::Histogram, label_names, bounds))
    }

    pub fn observe(&self, labels: &[&str], value: f64) {
        self.observe_into(&PENDING, labels, value);
    }

    fn observe_into(&self, pending: &Mutex<PendingUpdates>, labels: &[&str], value: f64) {
        let bucket = bucket_of(&self.0.buckets, value);
        self.0.update(pending, labels, |update| {
            count_observation(update, &self.0.buckets, bucket, value)
        });
    }
}

/// The bucket `value` is counted in: the first whose upper bound `value`
/// does not pass, or the +Inf bucket after `bounds`.
fn bucket_of(bounds: &[f64], value: f64) -> usize {
    match value.is_nan() {
        true => bounds.len(),
        false => bounds.partition_point(|bound| *bound < value),
    }
}

/// Counts an observation in the update of its series; one whose series is
/// pending for another metric of the same name (another kind, or other
/// buckets) is dropped.
fn count_observation(update: &mut MetricUpdate, bounds: &[f64], bucket: usize, value: f64) {
    if update.buckets != bounds {
        return;
    }
    if let Some(count) = update.bucket_counts.get_mut(bucket) {
        *count += 1;
        update.sum += value;
    }
}

/// The updates since the last call: for the next report to the head, or
/// in a worker for the result of the task it ran, which its owner passes on.
pub(crate) fn take_updates() -> Vec<MetricUpdate> {
    lock(&PENDING).take()
}

/// Adds updates that a worker sent with a task's result to this process's.
pub(crate) fn absorb(updates: Vec<MetricUpdate>) {
    if updates.is_empty() {
        return;
    }
    let mut pending = lock(&PENDING);
    for update in updates {
        pending.absorb(update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[0.1, 1.0, 10.0];

    fn histogram(name: &str) -> Histogram {
        Histogram::new(name, "a test histogram", BOUNDS, &["model"])
    }

    /// The only update in `pending`.
    fn only_update(pending: &Mutex<PendingUpdates>) -> MetricUpdate {
        let mut updates = lock(pending).take();
        assert_eq!(updates.len(), 1, "{updates:?}");
        updates.remove(0)
    }

    #[test]
    fn an_observation_is_counted_in_the_first_bucket_whose_bound_it_does_not_pass() {
        let pending = Mutex::default();
        let latency = histogram("test_buckets_seconds");
        for value in [0.05, 0.1, 0.5, 1.0, 1.0 + f64::EPSILON, 10.0, 10.5, f64::INFINITY] {
            latency.observe_into(&pending, &["a"], value);
        }
        let update = only_update(&pending);
        assert_eq!(update.buckets, BOUNDS);
        assert_eq!(update.bucket_counts, [2, 2, 2, 2], "le bounds are inclusive");
        assert_eq!(update.sum, f64::INFINITY);
    }

    #[test]
    fn nan_is_counted_in_the_inf_bucket() {
        let pending = Mutex::default();
        histogram("test_nan_seconds").observe_into(&pending, &["a"], f64::NAN);
        let update = only_update(&pending);
        assert_eq!(update.bucket_counts, [0, 0, 0, 1]);
        assert!(update.sum.is_nan());
    }

    #[test]
    fn a_last_bound_of_inf_is_the_inf_bucket() {
        let latency = Histogram::new("test_inf_bound_seconds", "", &[1.0, f64::INFINITY], &[]);
        let pending = Mutex::default();
        latency.observe_into(&pending, &[], 2.0);
        let update = only_update(&pending);
        assert_eq!(update.buckets, [1.0]);
        assert_eq!(update.bucket_counts, [0, 1]);
    }

    #[test]
    fn fifty_thousand_observations_between_two_reports_all_count() {
        let pending = Mutex::default();
        let latency = histogram("test_many_seconds");
        for i in 0..50_000 {
            latency.observe_into(&pending, &["a"], f64::from(i) / 1000.0);
        }
        let update = only_update(&pending);
        assert_eq!(update.bucket_counts, [101, 900, 9_000, 39_999]);
        assert_eq!(update.bucket_counts.iter().sum::<u64>(), 50_000);
        let exact = 49_999.0 * 50_000.0 / 2.0 / 1000.0;
        assert!(
            (update.sum - exact).abs() < exact * 1e-9,
            "{} against {exact}",
            update.sum
        );
    }

    #[test]
    fn series_are_kept_apart_and_a_workers_updates_add_to_its_owners() {
        let (worker, owner) = (Mutex::default(), Mutex::default());
        let latency = histogram("test_absorbed_seconds");
        latency.observe_into(&worker, &["a"], 0.5);
        latency.observe_into(&worker, &["b"], 5.0);
        latency.observe_into(&owner, &["a"], 50.0);
        for update in lock(&worker).take() {
            lock(&owner).absorb(update);
        }
        let mut updates = lock(&owner).take();
        updates.sort_by(|x, y| x.label_values.cmp(&y.label_values));
        let counts: Vec<_> = updates.iter().map(|u| (u.bucket_counts.clone(), u.sum)).collect();
        assert_eq!(counts, [(vec![0, 1, 0, 1], 50.5), (vec![0, 0, 1, 0], 5.0)]);
    }

    #[test]
    fn a_histogram_does_not_count_into_another_metrics_series_of_its_name() {
        let pending = Mutex::default();
        let other = Histogram::new("test_shared_name", "", &[1.0], &["model"]);
        other.observe_into(&pending, &["a"], 0.5);
        histogram("test_shared_name").observe_into(&pending, &["a"], 0.5);
        assert_eq!(only_update(&pending).bucket_counts, [1, 0]);
    }
}
