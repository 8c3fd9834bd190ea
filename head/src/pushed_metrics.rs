//! The metrics that processes record with `raylet::metrics` and report to
//! the head: each is registered in the head process's Prometheus registry
//! on first sight, so the head's `/metrics` exports it. Counters and gauges
//! are the prometheus crate's; a histogram arrives counted into buckets and
//! is added up by [`histogram::PushedHistogram`]. A report that does not fit
//! the metric as first seen (another kind, other labels or other buckets,
//! or not one value per label or one count per bucket), whose histogram
//! buckets do not increase, or whose name is taken, is dropped with a
//! warning.

mod histogram;

use std::collections::HashMap;

use prometheus::core::Collector;
use prometheus::{CounterVec, GaugeVec, Opts};
use raylet_common::metrics::registry;
use raylet_proto::v1::{MetricKind, MetricUpdate};

use histogram::PushedHistogram;

/// Why a reported metric, or a report of one, was refused.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error(transparent)]
    Prometheus(#[from] prometheus::Error),
    #[error("histogram buckets must be finite and increase: {0:?}")]
    Bounds(Vec<f64>),
    #[error("`le` is the label of a histogram's buckets, not one of its own")]
    BucketLabel,
    #[error("{got} label values for {expected} labels")]
    LabelValues { expected: usize, got: usize },
    #[error("the buckets {got:?} are not the histogram's {expected:?}")]
    OtherBuckets { expected: Vec<f64>, got: Vec<f64> },
    #[error("{got} bucket counts for {expected} buckets")]
    BucketCounts { expected: usize, got: usize },
}

/// A reported metric as registered here.
enum Family {
    Counter(CounterVec),
    Gauge(GaugeVec),
    Histogram(PushedHistogram),
}

/// The reported metrics the head exports, by name.
#[derive(Default)]
pub struct PushedMetrics {
    families: HashMap<String, (Family, Vec<String>)>,
}

impl PushedMetrics {
    pub fn apply(&mut self, update: MetricUpdate) {
        let Some((family, names)) = self.family(&update) else {
            return;
        };
        if *names != update.label_names {
            tracing::warn!(metric = update.name, "a reported metric changed its labels; dropped");
            return;
        }
        if let Err(error) = add(family, &update) {
            tracing::warn!(metric = update.name, %error, "a report does not fit its metric; dropped");
        }
    }

    /// The family of `update`'s metric, registered now if it is new.
    fn family(&mut self, update: &MetricUpdate) -> Option<&(Family, Vec<String>)> {
        if !self.families.contains_key(&update.name) {
            let family = register(update)
                .inspect_err(|error| tracing::warn!(metric = update.name, %error, "a reported metric was refused"))
                .ok()?;
            self.families
                .insert(update.name.clone(), (family, update.label_names.clone()));
        }
        let entry = self.families.get(&update.name)?;
        let same_kind = matches!(
            (&entry.0, update.kind()),
            (Family::Counter(_), MetricKind::Counter)
                | (Family::Gauge(_), MetricKind::Gauge)
                | (Family::Histogram(_), MetricKind::Histogram)
        );
        same_kind.then_some(entry)
    }
}

/// Adds `update` to its series of `family`.
fn add(family: &Family, update: &MetricUpdate) -> Result<(), Refused> {
    let labels: Vec<&str> = update.label_values.iter().map(String::as_str).collect();
    match family {
        Family::Counter(counter) => counter
            .get_metric_with_label_values(&labels)?
            .inc_by(update.value.max(0.0)),
        Family::Gauge(gauge) => gauge.get_metric_with_label_values(&labels)?.set(update.value),
        Family::Histogram(histogram) => histogram.add(update)?,
    }
    Ok(())
}

fn register(update: &MetricUpdate) -> Result<Family, Refused> {
    let labels: Vec<&str> = update.label_names.iter().map(String::as_str).collect();
    let help = match update.help.is_empty() {
        true => update.name.clone(),
        false => update.help.clone(),
    };
    let (family, collector): (Family, Box<dyn Collector>) = match update.kind() {
        MetricKind::Counter => {
            let counter = CounterVec::new(Opts::new(&update.name, help), &labels)?;
            (Family::Counter(counter.clone()), Box::new(counter))
        }
        MetricKind::Gauge => {
            let gauge = GaugeVec::new(Opts::new(&update.name, help), &labels)?;
            (Family::Gauge(gauge.clone()), Box::new(gauge))
        }
        MetricKind::Histogram => {
            let histogram = PushedHistogram::new(&update.name, &help, &update.label_names, &update.buckets)?;
            (Family::Histogram(histogram.clone()), Box::new(histogram))
        }
    };
    registry().register(collector)?;
    Ok(family)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[f64] = &[0.1, 1.0];

    /// The bucket counts of one observation of `value`.
    fn counted(value: f64) -> Vec<u64> {
        let mut counts = vec![0; BOUNDS.len() + 1];
        counts[BOUNDS.partition_point(|bound| *bound < value)] = 1;
        counts
    }

    fn update(name: &str, kind: MetricKind, labels: &[&str], value: f64) -> MetricUpdate {
        MetricUpdate {
            name: name.into(),
            kind: kind as i32,
            label_names: vec!["run".into()],
            label_values: labels.iter().map(|l| l.to_string()).collect(),
            value,
            buckets: BOUNDS.to_vec(),
            bucket_counts: counted(value),
            sum: value,
            ..MetricUpdate::default()
        }
    }

    #[test]
    fn reports_add_up_and_a_mismatched_report_is_dropped() {
        let mut metrics = PushedMetrics::default();
        metrics.apply(update("test_pushed_total", MetricKind::Counter, &["a"], 2.0));
        metrics.apply(update("test_pushed_total", MetricKind::Counter, &["a"], 3.0));
        metrics.apply(update("test_pushed_total", MetricKind::Gauge, &["a"], 100.0));
        metrics.apply(update("test_pushed_seconds", MetricKind::Histogram, &["a"], 0.5));
        metrics.apply(update("test_pushed_seconds", MetricKind::Histogram, &["a"], 0.05));
        let text = raylet_common::metrics::encode_text();
        assert!(text.contains("test_pushed_total{run=\"a\"} 5"), "{text}");
        assert!(text.contains("test_pushed_seconds_count{run=\"a\"} 2"), "{text}");
        assert!(
            text.contains("test_pushed_seconds_bucket{run=\"a\",le=\"0.1\"} 1"),
            "{text}"
        );
    }

    /// A report carries counts, not observations: however many a process
    /// recorded between two reports, all of them are exported.
    #[test]
    fn a_histograms_reported_counts_are_exported_exactly() {
        let mut metrics = PushedMetrics::default();
        let mut first = update("test_pushed_many_seconds", MetricKind::Histogram, &["a"], 0.0);
        first.bucket_counts = vec![10_000, 15_000, 5_000];
        first.sum = 9_000.5;
        let mut second = first.clone();
        second.bucket_counts = vec![0, 5_000, 15_000];
        second.sum = 30_000.25;
        metrics.apply(first);
        metrics.apply(second);
        let text = raylet_common::metrics::encode_text();
        let expected = [
            r#"test_pushed_many_seconds_bucket{run="a",le="0.1"} 10000"#,
            r#"test_pushed_many_seconds_bucket{run="a",le="1"} 30000"#,
            r#"test_pushed_many_seconds_bucket{run="a",le="+Inf"} 50000"#,
            r#"test_pushed_many_seconds_sum{run="a"} 39000.75"#,
            r#"test_pushed_many_seconds_count{run="a"} 50000"#,
        ];
        for line in expected {
            assert!(text.lines().any(|exported| exported == line), "{line} in {text}");
        }
    }

    /// Found by the `decode_requests` fuzz target: a report with fewer
    /// label values than names panicked in `with_label_values`.
    #[test]
    fn a_report_without_one_value_per_label_is_dropped_not_a_panic() {
        let mut metrics = PushedMetrics::default();
        for kind in [MetricKind::Counter, MetricKind::Gauge, MetricKind::Histogram] {
            let name = format!("test_pushed_cardinality_{}", kind.as_str_name().to_lowercase());
            for values in [&[][..], &["a", "b"]] {
                metrics.apply(update(&name, kind, values, 1.0));
            }
            metrics.apply(update(&name, kind, &["a"], 1.0));
        }
        let text = raylet_common::metrics::encode_text();
        assert!(text.contains("test_pushed_cardinality_counter{run=\"a\"} 1"), "{text}");
    }

    /// Found by the `decode_requests` fuzz target: a histogram whose
    /// buckets do not increase was registered, and its first series panicked.
    #[test]
    fn a_histogram_whose_buckets_do_not_increase_is_refused_not_a_panic() {
        let mut metrics = PushedMetrics::default();
        let mut bad = update("test_pushed_bad_buckets", MetricKind::Histogram, &["a"], 1.0);
        bad.buckets = vec![1.0, 0.5];
        metrics.apply(bad);
        assert!(metrics.families.is_empty());
        metrics.apply(update("test_pushed_bad_buckets", MetricKind::Histogram, &["a"], 1.0));
        let text = raylet_common::metrics::encode_text();
        assert!(text.contains("test_pushed_bad_buckets_count{run=\"a\"} 1"), "{text}");
    }

    #[test]
    fn a_name_the_head_uses_itself_is_refused() {
        let own = raylet_common::metrics::counter("test_head_own_total", "the head's own", &["run"]);
        own.with_label_values(&["x"]).inc();
        let mut metrics = PushedMetrics::default();
        metrics.apply(update("test_head_own_total", MetricKind::Counter, &["x"], 5.0));
        assert!(metrics.families.is_empty());
        assert_eq!(own.with_label_values(&["x"]).get(), 1);
    }
}
