//! Forwards a worker's stdout and stderr to the owner of the running task,
//! line by line, tagged with the function's name, and writes every line to
//! the worker's log files, `worker-<id>-<pid>.out|.err` in the node's log
//! directory, a task's lines after a `:task_start: TASK_ID FUNCTION` line
//! and before a `:task_end: TASK_ID` line (`raylet logs` reads them; a task
//! that prints nothing costs no line). The files rotate by size (see
//! [`raylet_common::log_rotation`]). Without a log directory, lines that no
//! task printed go where the process's output went.
//! [`drain`] holds a task's result back until the lines it printed are on
//! their way, so that output never comes after the result it belongs to (an
//! owner may stop listening then).

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use raylet_common::log_rotation::{RotatingFile, RotationSettings};
use raylet_common::output_capture::{self, CapturedPipe, Stream};
use raylet_proto::TaskId;
use raylet_proto::v1::{LogLine, WorkerEvents};
use raylet_proto::worker_logs::{TASK_END, TASK_START};

use raylet_proto::task_stream::EventSender as ResultSender;

struct Sink {
    /// `None` for a task whose id did not decode.
    task_id: Option<TaskId>,
    function: String,
    results: ResultSender,
}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

static PIPES: OnceLock<[&'static CapturedPipe; 2]> = OnceLock::new();

/// How long a result waits at most for its task's output to be sent.
const DRAIN_PATIENCE: Duration = Duration::from_millis(200);

/// Sends the lines that follow to `results`, tagged with `function`.
pub(crate) fn attach(task_id: Option<TaskId>, function: &str, results: ResultSender) {
    let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    *sink = Some(Sink {
        task_id,
        function: function.to_string(),
        results,
    });
}

/// Waits (briefly at most) until what the task printed has been sent.
pub(crate) fn drain() {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    for pipe in PIPES.get().into_iter().flatten() {
        pipe.drain(DRAIN_PATIENCE);
    }
}

/// Where a captured stream's lines go besides the task's owner.
enum Destination {
    /// The worker's log file, which takes every line.
    Log {
        file: RotatingFile,
        /// The task whose lines the file shows last, if any.
        task: Option<TaskId>,
    },
    /// The process's own output, which takes the lines no owner took.
    ProcessOutput(std::fs::File),
}

impl Destination {
    /// The log file of this worker's `stream` in `log_dir`, rotating by the
    /// node's settings, or the stream's own output without a directory.
    fn of(log_dir: Option<&Path>, stem: &str, stream: Stream) -> std::io::Result<Destination> {
        let Some(dir) = log_dir else {
            let original = match stream {
                Stream::Stdout => nix::unistd::dup(std::io::stdout())?,
                Stream::Stderr => nix::unistd::dup(std::io::stderr())?,
            };
            return Ok(Destination::ProcessOutput(std::fs::File::from(original)));
        };
        let extension = match stream {
            Stream::Stdout => "out",
            Stream::Stderr => "err",
        };
        // The node checked the settings before it started this worker.
        let settings = RotationSettings::process().unwrap_or_default();
        let file = RotatingFile::open(&dir.join(format!("{stem}.{extension}")), settings)?;
        Ok(Destination::Log { file, task: None })
    }

    /// Writes a line of the task `task` (`None`: of no task) to the log
    /// file, after the markers of a change of task, in one write.
    fn write(file: &mut RotatingFile, shown: &mut Option<TaskId>, task: Option<(TaskId, &str)>, line: &str) {
        let mut text = String::with_capacity(line.len() + 1);
        let task_id = task.map(|(id, _)| id);
        if *shown != task_id {
            if let Some(ended) = shown.take() {
                let _ = writeln!(text, "{TASK_END} {ended}");
            }
            if let Some((id, function)) = task {
                let _ = writeln!(text, "{TASK_START} {id} {function}");
                *shown = Some(id);
            }
        }
        text.push_str(line);
        text.push('\n');
        let _ = file.append(text.as_bytes());
    }
}

/// Replaces fds 1 and 2 with pipes whose lines go to the running task's
/// owner and to `worker-<worker_id>-<pid>.out|.err` in `log_dir` when
/// given, which rotate by size.
pub(crate) fn capture(log_dir: Option<&Path>, worker_id: &str) -> std::io::Result<()> {
    let stem = raylet_proto::worker_logs::file_stem(worker_id, std::process::id());
    let capture_stream = |stream: Stream| -> std::io::Result<&'static CapturedPipe> {
        let mut destination = Destination::of(log_dir, &stem, stream)?;
        output_capture::capture(stream, move |line| {
            pass_on(line, stream == Stream::Stderr, &mut destination)
        })
    };
    let pipes = [capture_stream(Stream::Stdout)?, capture_stream(Stream::Stderr)?];
    let _ = PIPES.set(pipes);
    Ok(())
}

/// Sends a line to the running task's owner and to the log file; without a
/// log file, a line no owner took goes where the process's output went.
fn pass_on(line: String, stderr: bool, destination: &mut Destination) {
    let sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if let Destination::Log { file, task: shown } = destination {
        let task = sink
            .as_ref()
            .and_then(|sink| Some((sink.task_id?, sink.function.as_str())));
        Destination::write(file, shown, task, &line);
    }
    let sent = sink.as_ref().is_some_and(|sink| {
        let log = LogLine {
            function: sink.function.clone(),
            stderr,
            line: line.clone(),
        };
        sink.results
            .send(&WorkerEvents {
                logs: vec![log],
                ..WorkerEvents::default()
            })
            .is_ok()
    });
    drop(sink);
    if let (false, Destination::ProcessOutput(file)) = (sent, destination) {
        let _ = writeln!(file, "{line}");
    }
}
