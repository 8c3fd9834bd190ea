//! The live trial table, as Ray Tune prints it: trials by status, each
//! trial's hyperparameters, iteration, time and metric, and the best so
//! far. Redrawn in place on a terminal; printed every 10 s otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use raylet_train::Metrics;

use super::trial_state::Trial;
use crate::config::short_value;
use crate::{Mode, TrialStatus};

/// The most trial rows shown; the rest are counted.
const MAX_ROWS: usize = 20;
/// How often the table is printed when standard error is not a terminal.
const PRINT_EVERY: Duration = Duration::from_secs(10);
/// How often the table is redrawn on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// The experiment's progress display.
pub(crate) struct Progress {
    verbose: u8,
    name: String,
    metric: Option<String>,
    mode: Mode,
    started: Instant,
    last_shown: Option<Instant>,
    live: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn new(verbose: u8, name: &str, metric: Option<String>, mode: Mode) -> Self {
        let live = (verbose > 0 && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(ProgressStyle::with_template("{msg}").expect("a valid template"));
            bar
        });
        Progress {
            verbose,
            name: name.to_string(),
            metric,
            mode,
            started: Instant::now(),
            last_shown: None,
            live,
        }
    }

    /// Shows the table if it is due.
    pub(crate) fn update(&mut self, trials: &[Trial]) {
        if self.verbose == 0 {
            return;
        }
        let every = if self.live.is_some() { REDRAW_EVERY } else { PRINT_EVERY };
        if self.last_shown.is_some_and(|shown| shown.elapsed() < every) {
            return;
        }
        self.show(trials);
    }

    /// A line for one result, at verbosity 2.
    pub(crate) fn result_line(&self, trial: &str, metrics: &Metrics) {
        if self.verbose < 2 {
            return;
        }
        let line = format!("[{}] {trial}: {metrics}", self.name);
        match &self.live {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Shows the final table.
    pub(crate) fn finish(&mut self, trials: &[Trial]) {
        if self.verbose == 0 {
            return;
        }
        self.show(trials);
        if let Some(bar) = self.live.take() {
            bar.finish();
        }
    }

    fn show(&mut self, trials: &[Trial]) {
        self.last_shown = Some(Instant::now());
        let table = self.table(trials);
        match &self.live {
            Some(bar) => bar.set_message(table),
            None => eprintln!("{table}"),
        }
    }

    /// The whole display: the summary lines, then the trial rows.
    pub(crate) fn table(&self, trials: &[Trial]) -> String {
        let mut lines = vec![
            format!(
                "== {}: {} trials, {:.1} s ==",
                self.name,
                trials.len(),
                self.started.elapsed().as_secs_f64()
            ),
            format!("Trial status: {}", status_counts(trials)),
        ];
        if let Some(best) = self.best_line(trials) {
            lines.push(best);
        }
        lines.extend(render_rows(&self.rows(trials)));
        if trials.len() > MAX_ROWS {
            lines.push(format!("... {} more trials", trials.len() - MAX_ROWS));
        }
        lines.join("\n")
    }

    fn best_line(&self, trials: &[Trial]) -> Option<String> {
        let metric = self.metric.as_deref()?;
        let sign = if self.mode == Mode::Max { 1.0 } else { -1.0 };
        let (trial, value) = trials
            .iter()
            .filter_map(|t| Some((t, t.view().last_result.as_ref()?.get(metric)?)))
            .max_by(|a, b| (sign * a.1).total_cmp(&(sign * b.1)))?;
        Some(format!(
            "Current best trial: {} with {metric}={} and params {{{}}}",
            trial.id(),
            short_value(&value.into()),
            trial.view().config
        ))
    }

    /// The header and the shown trials' cells.
    fn rows(&self, trials: &[Trial]) -> Vec<Vec<String>> {
        let parameters = varying_parameters(trials);
        let mut header = vec!["Trial name".to_string(), "status".to_string()];
        header.extend(parameters.iter().cloned());
        header.extend(["iter".to_string(), "total time (s)".to_string()]);
        header.extend(self.metric.iter().cloned());
        let mut rows = vec![header];
        for trial in trials.iter().take(MAX_ROWS) {
            let view = trial.view();
            let mut row = vec![view.id.clone(), view.status.to_string()];
            row.extend(
                parameters
                    .iter()
                    .map(|p| view.config.value(p).map(short_value).unwrap_or_default()),
            );
            row.push(view.iteration.to_string());
            row.push(format!("{:.2}", trial.time_total()));
            if let Some(metric) = &self.metric {
                let value = view.last_result.as_ref().and_then(|r| r.get(metric));
                row.push(value.map(|v| short_value(&v.into())).unwrap_or_default());
            }
            rows.push(row);
        }
        rows
    }
}

/// `2 RUNNING | 5 TERMINATED`.
fn status_counts(trials: &[Trial]) -> String {
    let statuses = [
        TrialStatus::Running,
        TrialStatus::Paused,
        TrialStatus::Pending,
        TrialStatus::Terminated,
        TrialStatus::Error,
    ];
    let counts: Vec<String> = statuses
        .iter()
        .map(|status| (status, trials.iter().filter(|t| t.status() == *status).count()))
        .filter(|(_, count)| *count > 0)
        .map(|(status, count)| format!("{count} {status}"))
        .collect();
    counts.join(" | ")
}

/// The config paths whose values differ between trials (all of them for one trial).
fn varying_parameters(trials: &[Trial]) -> Vec<String> {
    let Some(first) = trials.first() else {
        return Vec::new();
    };
    first
        .view()
        .config
        .flatten()
        .into_iter()
        .filter(|(path, value)| trials.len() == 1 || trials.iter().any(|t| t.view().config.value(path) != Some(value)))
        .map(|(path, _)| path)
        .collect()
}

/// Rows as aligned columns, with a rule under the header.
fn render_rows(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|row| row[c].chars().count()).max().unwrap_or(0))
        .collect();
    let render = |row: &Vec<String>| {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        format!("│ {} │", cells.join(" │ "))
    };
    let rule = format!(
        "├{}┤",
        widths.iter().map(|w| "─".repeat(w + 2)).collect::<Vec<_>>().join("┼")
    );
    let mut lines = Vec::with_capacity(rows.len() + 1);
    for (index, row) in rows.iter().enumerate() {
        lines.push(render(row));
        if index == 0 {
            lines.push(rule.clone());
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use raylet_train::{Metrics, RunDirectory};
    use serde_json::Value;

    use super::*;
    use crate::tuner::trial_state::TrialRecord;
    use crate::{TrialConfig, TrialView};

    fn trial(id: &str, lr: f64, status: TrialStatus, accuracy: Option<f64>) -> Trial {
        let mut config = TrialConfig::new();
        config.set("lr", Value::from(lr));
        config.set("epochs", Value::from(10));
        let mut view = TrialView::pending(id.into(), config);
        view.status = status;
        view.last_result = accuracy.map(|a| Metrics::new().with("accuracy", a).with("time_total_s", 1.5));
        view.iteration = accuracy.map_or(0, |_| 3);
        let record = TrialRecord {
            view,
            failures: 0,
            error: None,
            latest_checkpoint: None,
        };
        Trial::new(record, RunDirectory::open(id.into()), Vec::new())
    }

    #[test]
    fn the_table_counts_statuses_shows_varying_parameters_and_the_best_trial() {
        let trials = vec![
            trial("trial_00000", 0.01, TrialStatus::Terminated, Some(0.9)),
            trial("trial_00001", 0.1, TrialStatus::Running, Some(0.95)),
            trial("trial_00002", 0.001, TrialStatus::Pending, None),
        ];
        let progress = Progress::new(0, "search", Some("accuracy".into()), Mode::Max);
        let table = progress.table(&trials);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[1], "Trial status: 1 RUNNING | 1 PENDING | 1 TERMINATED");
        assert_eq!(
            lines[2],
            "Current best trial: trial_00001 with accuracy=0.95 and params {epochs=10 lr=0.1}"
        );
        assert_eq!(
            lines[3],
            "│ Trial name  │ status     │ lr    │ iter │ total time (s) │ accuracy │"
        );
        assert_eq!(
            lines[5],
            "│ trial_00000 │ TERMINATED │ 0.01  │ 3    │ 1.50           │ 0.9      │"
        );
        assert_eq!(
            lines[7],
            "│ trial_00002 │ PENDING    │ 0.001 │ 0    │ 0.00           │          │"
        );
        assert!(
            !lines[3].contains("epochs"),
            "a value every trial shares is not a column"
        );
    }
}
