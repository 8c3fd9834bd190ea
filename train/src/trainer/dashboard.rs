//! What a run shows on the dashboard's Train page: its status, workers and
//! each report's metrics, published to the head at most once a second and
//! when the run ends. The dashboard is a view: a failed publish is logged
//! and the run goes on.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use raylet::Cluster;
use serde::Serialize;

use super::result::Report;
use crate::metrics::Metrics;

/// The shortest time between two publishes of a running run.
const PUBLISH_PERIOD: Duration = Duration::from_secs(1);
/// The most reports a run shows: the newest.
const MAX_REPORTS: usize = 2_000;

#[derive(Serialize)]
struct ReportPoint {
    index: u64,
    metrics: Metrics,
}

/// A run as the dashboard's `/api/train` lists it.
#[derive(Serialize)]
struct RunEntry {
    id: String,
    name: String,
    /// RUNNING, FINISHED or FAILED.
    status: &'static str,
    workers: usize,
    started_ms: u64,
    updated_ms: u64,
    reports: Vec<ReportPoint>,
}

pub(super) struct RunBoard<'a> {
    cluster: &'a Cluster,
    entry: RunEntry,
    published: Option<Instant>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

impl<'a> RunBoard<'a> {
    /// Shows the run as running.
    pub(super) fn start(cluster: &'a Cluster, name: &str, workers: usize) -> Self {
        let started_ms = unix_ms();
        let entry = RunEntry {
            id: format!("{name}-{started_ms}"),
            name: name.to_string(),
            status: "RUNNING",
            workers,
            started_ms,
            updated_ms: started_ms,
            reports: Vec::new(),
        };
        let mut board = RunBoard {
            cluster,
            entry,
            published: None,
        };
        board.publish();
        board
    }

    pub(super) fn report(&mut self, report: &Report) {
        if self.entry.reports.len() == MAX_REPORTS {
            self.entry.reports.remove(0);
        }
        self.entry.reports.push(ReportPoint {
            index: report.index,
            metrics: report.metrics.clone(),
        });
        if self.published.is_none_or(|at| at.elapsed() >= PUBLISH_PERIOD) {
            self.publish();
        }
    }

    /// Shows how the run ended.
    pub(super) fn finish(mut self, succeeded: bool) {
        self.entry.status = match succeeded {
            true => "FINISHED",
            false => "FAILED",
        };
        self.publish();
    }

    fn publish(&mut self) {
        self.entry.updated_ms = unix_ms();
        self.published = Some(Instant::now());
        if let Err(error) = self.cluster.publish_to_dashboard("train", &self.entry.id, &self.entry) {
            tracing::debug!(%error, run = self.entry.name, "the run could not be shown on the dashboard");
        }
    }
}
