//! The results of an experiment: each trial's config, status, last and
//! every result, and checkpoint; the best trial by a metric; and the
//! exports (`results.csv`, `results.jsonl`) that pandas reads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use raylet_train::{Checkpoint, Metrics, RunDirectory};
use serde_json::{Map, Value};

use crate::{Mode, TrialConfig, TrialStatus, TuneError};

/// One trial's outcome.
#[derive(Clone, Debug)]
pub struct TrialResult {
    pub trial_id: String,
    pub config: TrialConfig,
    pub status: TrialStatus,
    /// Its last result.
    pub metrics: Option<Metrics>,
    /// Every result, in order.
    pub metrics_history: Vec<Metrics>,
    /// Its latest checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// Its directory (of an experiment in object storage: this node's copy;
    /// its checkpoint is read from object storage where the copy lacks it).
    pub path: PathBuf,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Every trial's outcome, in the order the trials were made.
#[derive(Clone, Debug)]
pub struct ResultGrid {
    pub(crate) results: Vec<TrialResult>,
    pub(crate) directory: RunDirectory,
    pub(crate) metric: Option<String>,
    pub(crate) mode: Mode,
}

impl ResultGrid {
    pub fn len(&self) -> usize {
        self.results.len()
    }

    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &TrialResult> {
        self.results.iter()
    }

    pub fn get(&self, index: usize) -> Option<&TrialResult> {
        self.results.get(index)
    }

    /// The experiment's directory (of an experiment in object storage:
    /// this node's copy).
    pub fn path(&self) -> &Path {
        self.directory.root()
    }

    /// Where the experiment is kept: its folder in object storage
    /// (`s3://bucket/prefix/name`, what [`Tuner::restore`](crate::Tuner::restore)
    /// takes) for one kept there, else its directory.
    pub fn location(&self) -> PathBuf {
        self.directory.location()
    }

    /// The trials that failed.
    pub fn errors(&self) -> Vec<&TrialResult> {
        self.results.iter().filter(|r| r.status == TrialStatus::Error).collect()
    }

    /// The trial whose last result has the best `metric`.
    pub fn best_result(&self, metric: &str, mode: Mode) -> Option<&TrialResult> {
        let sign = if mode == Mode::Max { 1.0 } else { -1.0 };
        self.results
            .iter()
            .filter_map(|r| Some((r, r.metrics.as_ref()?.get(metric).filter(|v| !v.is_nan())?)))
            .max_by(|a, b| (sign * a.1).total_cmp(&(sign * b.1)))
            .map(|(result, _)| result)
    }

    /// The best trial by the experiment's own metric and mode.
    pub fn best(&self) -> Option<&TrialResult> {
        self.best_result(self.metric.as_deref()?, self.mode)
    }

    /// Writes `results.csv` and `results.jsonl` in the experiment's
    /// directory (and its folder in object storage): a row per trial with
    /// its id, status, iterations, error, `config/...` columns and its last
    /// result's metrics.
    pub fn export(&self) -> Result<(), TuneError> {
        let rows: Vec<Map<String, Value>> = self.results.iter().map(summary_row).collect();
        let jsonl: String = rows
            .iter()
            .map(|row| format!("{}\n", Value::Object(row.clone())))
            .collect();
        self.directory.write_file("results.jsonl", jsonl)?;
        let cells: Vec<Vec<(String, String)>> = rows
            .iter()
            .map(|row| row.iter().map(|(k, v)| (k.clone(), csv_cell(v))).collect())
            .collect();
        write_csv(&self.directory, "results.csv", &cells)
    }
}

fn summary_row(result: &TrialResult) -> Map<String, Value> {
    let mut row = Map::new();
    row.insert("trial_id".into(), Value::from(result.trial_id.clone()));
    row.insert("status".into(), Value::from(result.status.to_string()));
    row.insert("iterations".into(), Value::from(result.metrics_history.len()));
    row.insert(
        "error".into(),
        result.error.clone().map(Value::from).unwrap_or(Value::Null),
    );
    for (path, value) in result.config.flatten() {
        row.insert(format!("config/{path}"), value);
    }
    for (name, value) in result.metrics.iter().flat_map(Metrics::iter) {
        row.insert(name.to_string(), Value::from(value));
    }
    row
}

fn csv_cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Writes rows of (column, cell) as CSV file `name` of `directory`; the
/// columns are every name seen, in the order first seen, and a row without
/// one leaves it empty.
pub(crate) fn write_csv(directory: &RunDirectory, name: &str, rows: &[Vec<(String, String)>]) -> Result<(), TuneError> {
    let mut columns: Vec<&str> = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, _) in rows.iter().flatten() {
        if seen.insert(name.as_str()) {
            columns.push(name);
        }
    }
    let failed = |message: String| TuneError::Experiment {
        path: directory.location().join(name),
        message: format!("writing CSV: {message}"),
    };
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(&columns).map_err(|e| failed(e.to_string()))?;
    for row in rows {
        let record = columns.iter().map(|column| {
            row.iter()
                .find(|(name, _)| name == column)
                .map_or("", |(_, cell)| cell.as_str())
        });
        writer.write_record(record).map_err(|e| failed(e.to_string()))?;
    }
    let bytes = writer.into_inner().map_err(|e| failed(e.to_string()))?;
    Ok(directory.write_file(name, bytes)?)
}
