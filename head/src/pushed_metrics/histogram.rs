//! A histogram family of the head's registry that adds up the bucket
//! counts processes report: `raylet::metrics` counts observations into
//! buckets where they are recorded, and the prometheus crate's histograms
//! take only single observations, so this one collects its series itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use raylet_proto::v1::MetricUpdate;

use super::Refused;

/// The label Prometheus gives each bucket's upper bound.
const BUCKET_LABEL: &str = "le";

/// What a series was reported, in all.
struct SeriesCounts {
    /// Per bucket, not cumulative; the last is the +Inf bucket's own.
    bucket_counts: Vec<u64>,
    sum: f64,
}

/// A histogram family whose series add up reported bucket counts; clones
/// share the series.
#[derive(Clone)]
pub(super) struct PushedHistogram {
    desc: Desc,
    bounds: Vec<f64>,
    series: Arc<Mutex<BTreeMap<Vec<String>, SeriesCounts>>>,
}

impl PushedHistogram {
    /// A family of buckets with the upper bounds `bounds` (the +Inf bucket
    /// implied), refused where Prometheus would refuse it.
    pub(super) fn new(name: &str, help: &str, label_names: &[String], bounds: &[f64]) -> Result<Self, Refused> {
        let increasing = bounds.windows(2).all(|pair| pair[0] < pair[1]);
        if !increasing || !bounds.iter().all(|bound| bound.is_finite()) {
            return Err(Refused::Bounds(bounds.to_vec()));
        }
        if label_names.iter().any(|name| name == BUCKET_LABEL) {
            return Err(Refused::BucketLabel);
        }
        let desc = Desc::new(name.into(), help.into(), label_names.to_vec(), HashMap::new())?;
        Ok(PushedHistogram {
            desc,
            bounds: bounds.to_vec(),
            series: Arc::default(),
        })
    }

    /// Adds a report's bucket counts and sum to its series.
    pub(super) fn add(&self, update: &MetricUpdate) -> Result<(), Refused> {
        self.check(update)?;
        let mut series = self.lock();
        let held = series
            .entry(update.label_values.clone())
            .or_insert_with(|| SeriesCounts {
                bucket_counts: vec![0; update.bucket_counts.len()],
                sum: 0.0,
            });
        for (count, added) in held.bucket_counts.iter_mut().zip(&update.bucket_counts) {
            *count = count.saturating_add(*added);
        }
        held.sum += update.sum;
        Ok(())
    }

    /// Whether `update` is a report of a series of this family.
    fn check(&self, update: &MetricUpdate) -> Result<(), Refused> {
        let labels = self.desc.variable_labels.len();
        if update.label_values.len() != labels {
            return Err(Refused::LabelValues {
                expected: labels,
                got: update.label_values.len(),
            });
        }
        if update.buckets != self.bounds {
            return Err(Refused::OtherBuckets {
                expected: self.bounds.clone(),
                got: update.buckets.clone(),
            });
        }
        let buckets = self.bounds.len() + 1;
        if update.bucket_counts.len() != buckets {
            return Err(Refused::BucketCounts {
                expected: buckets,
                got: update.bucket_counts.len(),
            });
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Vec<String>, SeriesCounts>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The series `label_values` as Prometheus exports it.
    fn metric(&self, label_values: &[String], counts: &SeriesCounts) -> Metric {
        let mut labels: Vec<LabelPair> = self
            .desc
            .variable_labels
            .iter()
            .zip(label_values)
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name(name.clone());
                pair.set_value(value.clone());
                pair
            })
            .collect();
        labels.sort_by(|a, b| a.name().cmp(b.name()));
        let mut metric = Metric::from_label(labels);
        metric.set_histogram(self.histogram(counts));
        metric
    }

    /// Counts per bucket made cumulative, as Prometheus's buckets are.
    fn histogram(&self, counts: &SeriesCounts) -> Histogram {
        let mut cumulative = 0u64;
        let buckets = self
            .bounds
            .iter()
            .zip(&counts.bucket_counts)
            .map(|(bound, count)| {
                cumulative = cumulative.saturating_add(*count);
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect();
        let mut histogram = Histogram::default();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(
            counts
                .bucket_counts
                .iter()
                .fold(0, |total, count| total.saturating_add(*count)),
        );
        histogram.set_sample_sum(counts.sum);
        histogram
    }
}

impl Collector for PushedHistogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        let metrics = self
            .lock()
            .iter()
            .map(|(values, counts)| self.metric(values, counts))
            .collect();
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(label_values: &[&str], bucket_counts: &[u64], sum: f64) -> MetricUpdate {
        MetricUpdate {
            label_values: label_values.iter().map(|value| value.to_string()).collect(),
            buckets: vec![0.1, 1.0],
            bucket_counts: bucket_counts.to_vec(),
            sum,
            ..MetricUpdate::default()
        }
    }

    #[test]
    fn bad_bounds_and_the_bucket_label_are_refused() {
        let labels = ["run".to_string()];
        for bounds in [&[1.0, 0.5][..], &[1.0, 1.0], &[f64::NAN], &[1.0, f64::INFINITY]] {
            let made = PushedHistogram::new("test_bounds", "help", &labels, bounds);
            assert!(matches!(made, Err(Refused::Bounds(_))), "{bounds:?}");
        }
        let made = PushedHistogram::new("test_le", "help", &["le".to_string()], &[1.0]);
        assert!(matches!(made, Err(Refused::BucketLabel)));
    }

    #[test]
    fn a_report_that_does_not_fit_is_refused_and_adds_nothing() {
        let histogram = PushedHistogram::new("test_fit", "help", &["run".to_string()], &[0.1, 1.0]).unwrap();
        let wrong_labels = histogram.add(&report(&[], &[1, 0, 0], 0.0));
        assert!(matches!(wrong_labels, Err(Refused::LabelValues { .. })));
        let mut other_buckets = report(&["a"], &[1, 0, 0], 0.0);
        other_buckets.buckets = vec![0.2, 1.0];
        assert!(matches!(
            histogram.add(&other_buckets),
            Err(Refused::OtherBuckets { .. })
        ));
        let short = histogram.add(&report(&["a"], &[1, 0], 0.0));
        assert!(matches!(short, Err(Refused::BucketCounts { .. })));
        assert!(histogram.collect()[0].get_metric().is_empty());
    }

    #[test]
    fn reports_add_up_into_cumulative_buckets() {
        let histogram = PushedHistogram::new("test_add", "help", &["run".to_string()], &[0.1, 1.0]).unwrap();
        histogram.add(&report(&["a"], &[3, 2, 1], 7.5)).unwrap();
        histogram.add(&report(&["a"], &[1, 0, 4], 40.25)).unwrap();
        let family = &histogram.collect()[0];
        let exported = family.get_metric()[0].get_histogram();
        let cumulative: Vec<_> = exported.get_bucket().iter().map(Bucket::cumulative_count).collect();
        assert_eq!(cumulative, [4, 6]);
        assert_eq!(exported.get_sample_count(), 11);
        assert_eq!(exported.get_sample_sum(), 47.75);
    }
}
