//! The progress bar of a run: inputs (files or items) done of the total,
//! rows per second, and the blocks and input bytes in flight.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) struct Progress {
    bar: ProgressBar,
    started: Instant,
    rows: u64,
}

impl Progress {
    /// A bar over `total` inputs, drawn on stderr when it is a terminal.
    pub fn new(total: u64, show: bool) -> Self {
        let target = match show {
            true => ProgressDrawTarget::stderr(),
            false => ProgressDrawTarget::hidden(),
        };
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} inputs, {msg} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix("dataset");
        bar.set_message("starting");
        bar.set_draw_target(target);
        bar.enable_steady_tick(Duration::from_millis(250));
        Progress {
            bar,
            started: Instant::now(),
            rows: 0,
        }
    }

    /// Inputs done before this run started (a resumed write).
    pub fn skip(&self, inputs: u64) {
        self.bar.inc(inputs);
    }

    pub fn block_done(&mut self, inputs: u64, rows: u64) {
        self.rows += rows;
        self.bar.inc(inputs);
    }

    /// What is in flight: blocks, their input bytes, and the pool's actors.
    pub fn in_flight(&self, blocks: usize, bytes: u64, actors: Option<usize>) {
        let rate = self.rows as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        let actors = actors.map(|n| format!(", {n} actors")).unwrap_or_default();
        self.bar.set_message(format!(
            "{rate:.0} rows/s, {blocks} blocks in flight ({:.1} MiB){actors}",
            bytes as f64 / (1 << 20) as f64
        ));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
