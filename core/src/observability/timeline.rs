//! Timeline spans: the runs of tasks and the phases inside them (a Train
//! allreduce's steps, or a user's own) that `raylet timeline` draws as a
//! Chrome trace. They are recorded only in jobs that turn the timeline on
//! (`Config::timeline`, or `RAYLET_TIMELINE=1` in the driver's
//! environment); when it is off, [`span`] costs one atomic load.
//!
//! ```no_run
//! let _span = raylet::timeline::span("load shard", "data");
//! // ... the work the span covers; it ends when `_span` drops.
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use raylet_proto::v1::Span;
use raylet_proto::{JobId, NodeId};

static ON: AtomicBool = AtomicBool::new(false);
/// The job spans are recorded under: the driver's, or in a worker the job of
/// the task it runs.
static JOB: Mutex<Option<JobId>> = Mutex::new(None);
static PENDING: Mutex<Vec<Span>> = Mutex::new(Vec::new());
static NODE: OnceLock<NodeId> = OnceLock::new();
/// Most spans a process holds before a task's result takes them.
const MAX_PENDING: usize = 100_000;

/// Whether this process records spans.
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns recording on or off: a driver as its config says, a worker as the
/// task it starts says.
pub(crate) fn set_on(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Records this process's spans under `job` from now on.
pub(crate) fn set_job(job: JobId) {
    *JOB.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
}

/// Microseconds since the Unix epoch.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// The node this worker process runs on, stamped on its spans.
pub(crate) fn set_node(node: NodeId) {
    let _ = NODE.set(node);
}

/// A span that is open until it drops; empty when the timeline is off.
#[must_use = "a span ends when it drops"]
pub struct SpanGuard {
    open: Option<Span>,
}

impl SpanGuard {
    /// Adds a detail shown with the span.
    pub fn arg(mut self, key: &str, value: impl ToString) -> Self {
        if let Some(span) = &mut self.open {
            span.args.insert(key.to_string(), value.to_string());
        }
        self
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some(mut span) = self.open.take() {
            span.end_unix_micros = unix_micros();
            record(span);
        }
    }
}

/// Opens a span named `name` of the kind `category` (e.g. "train").
pub fn span(name: &str, category: &str) -> SpanGuard {
    if !is_on() {
        return SpanGuard { open: None };
    }
    let job = JOB
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map(|job| job.as_bytes().to_vec());
    let open = Span {
        name: name.to_string(),
        category: category.to_string(),
        job_id: job.unwrap_or_default(),
        node_id: NODE.get().map(|id| id.as_bytes().to_vec()).unwrap_or_default(),
        pid: std::process::id(),
        start_unix_micros: unix_micros(),
        args: HashMap::new(),
        ..Span::default()
    };
    SpanGuard { open: Some(open) }
}

pub(crate) fn record(span: Span) {
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if pending.len() < MAX_PENDING {
        pending.push(span);
    }
}

/// The spans recorded since the last call: they travel with a task's result.
pub(crate) fn take_pending() -> Vec<Span> {
    std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()))
}
