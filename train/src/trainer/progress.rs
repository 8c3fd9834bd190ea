//! What the driver shows while a run trains: a progress bar over the
//! reports on standard error, and a line per report on standard output.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{Checkpoint, Metrics};

pub(super) struct Progress {
    bar: ProgressBar,
    name: String,
    verbose: bool,
}

impl Progress {
    /// A bar over `total` reports when known (a spinner otherwise), of
    /// which `done` are behind already.
    pub(super) fn new(name: &str, total: Option<u64>, done: u64, verbose: bool) -> Self {
        let bar = match (verbose, total) {
            (false, _) => ProgressBar::hidden(),
            (true, Some(total)) => ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()),
            (true, None) => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
        };
        let template = match total {
            Some(_) => "{spinner} {prefix} [{bar:30}] {pos}/{len} reports · {elapsed} · {msg}",
            None => "{spinner} {prefix} {pos} reports · {elapsed} · {msg}",
        };
        let style = ProgressStyle::with_template(template).expect("a valid template");
        bar.set_style(style.progress_chars("=> "));
        bar.set_prefix(name.to_string());
        bar.set_position(done);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar,
            name: name.to_string(),
            verbose,
        }
    }

    /// Rank 0 reported.
    pub(super) fn report(&self, index: u64, metrics: &Metrics, checkpoint: Option<&Checkpoint>) {
        self.bar.set_position(index + 1);
        self.bar.set_message(metrics.to_string());
        let saved = checkpoint
            .and_then(|c| c.path().file_name())
            .map(|file| format!(" · saved {}", file.to_string_lossy()))
            .unwrap_or_default();
        self.line(&format!("report {index}: {metrics}{saved}"));
    }

    /// A line about the run, above the bar.
    pub(super) fn line(&self, text: &str) {
        if self.verbose {
            self.bar.suspend(|| println!("[{}] {text}", self.name));
        }
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
