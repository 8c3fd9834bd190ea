//! Forwards a worker's stdout and stderr to the owner of the running task,
//! line by line, tagged with the function's name, and writes every line to
//! the worker's log files, `worker-<id>-<pid>.out|.err` in the node's log
//! directory, a task's lines after a `:task_start: TASK_ID FUNCTION` line
//! and before a `:task_end: TASK_ID` line (`raylet logs` reads them; a task
//! that prints nothing costs no line). Without a log
//! directory, lines that no task printed go where the process's output went.
//! [`drain`] holds a task's result back until the lines it printed are on
//! their way, so that output never comes after the result it belongs to (an
//! owner may stop listening then).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
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

/// The read end of a captured stream and whether its forwarder holds bytes
/// it has read but not yet passed on.
struct Pipe {
    reader: RawFd,
    busy: AtomicBool,
}

impl Pipe {
    /// Whether bytes written so far may still be unsent: in the pipe, or
    /// read by the forwarder and not yet passed on. The forwarder marks
    /// itself busy before it reads, so checking the pipe first and the
    /// mark second never misses bytes in between.
    fn holds_unsent(&self) -> bool {
        bytes_in_pipe(self.reader) > 0 || self.busy.load(Ordering::SeqCst)
    }
}

static PIPES: OnceLock<Vec<&'static Pipe>> = OnceLock::new();

/// How long a result waits at most for its task's output to be sent.
const DRAIN_PATIENCE: Duration = Duration::from_millis(200);

nix::ioctl_read_bad!(fionread, nix::libc::FIONREAD, nix::libc::c_int);

fn bytes_in_pipe(fd: RawFd) -> i32 {
    let mut count: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points
    // at a live local; `fd` is a pipe this module keeps open for good.
    match unsafe { fionread(fd, &mut count) } {
        Ok(_) => count,
        Err(_) => 0,
    }
}

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
    let Some(pipes) = PIPES.get() else {
        return;
    };
    let deadline = Instant::now() + DRAIN_PATIENCE;
    while pipes.iter().any(|pipe| pipe.holds_unsent()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Where a captured stream's lines go besides the task's owner.
struct Destination {
    file: std::fs::File,
    /// Whether every line goes there (a log file), or only lines no owner
    /// took (the process's own output).
    every_line: bool,
    /// The task whose lines the log file shows last, if any.
    task: Option<TaskId>,
}

impl Destination {
    /// Writes a line of the task `task` (`None`: of no task) to the log
    /// file, after the markers of a change of task.
    fn write(&mut self, task: Option<(TaskId, &str)>, line: &str) {
        let task_id = task.map(|(id, _)| id);
        if self.task != task_id {
            if let Some(ended) = self.task.take() {
                let _ = writeln!(self.file, "{TASK_END} {ended}");
            }
            if let Some((id, function)) = task {
                let _ = writeln!(self.file, "{TASK_START} {id} {function}");
                self.task = Some(id);
            }
        }
        let _ = writeln!(self.file, "{line}");
    }
}

/// The log files of this worker in `log_dir`, or its own output without one.
fn destination(log_dir: Option<&Path>, stem: &str, stderr: bool) -> std::io::Result<Destination> {
    let Some(dir) = log_dir else {
        let original = match stderr {
            false => nix::unistd::dup(std::io::stdout())?,
            true => nix::unistd::dup(std::io::stderr())?,
        };
        return Ok(Destination {
            file: std::fs::File::from(original),
            every_line: false,
            task: None,
        });
    };
    let name = format!("{stem}.{}", if stderr { "err" } else { "out" });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))?;
    Ok(Destination {
        file,
        every_line: true,
        task: None,
    })
}

/// Replaces fds 1 and 2 with pipes read by two forwarding threads, which
/// write to `worker-<worker_id>-<pid>.out|.err` in `log_dir` when given.
pub(crate) fn capture(log_dir: Option<&Path>, worker_id: &str) -> std::io::Result<()> {
    let stem = raylet_proto::worker_logs::file_stem(worker_id, std::process::id());
    let mut pipes = Vec::new();
    for stderr in [false, true] {
        let original = destination(log_dir, &stem, stderr)?;
        let (reader, writer) = nix::unistd::pipe()?;
        match stderr {
            false => nix::unistd::dup2_stdout(&writer)?,
            true => nix::unistd::dup2_stderr(&writer)?,
        }
        let pipe: &'static Pipe = Box::leak(Box::new(Pipe {
            reader: reader.as_raw_fd(),
            busy: AtomicBool::new(false),
        }));
        pipes.push(pipe);
        std::thread::Builder::new()
            .name("raylet-log-forwarder".into())
            .spawn(move || forward(pipe, reader, original, stderr))?;
    }
    let _ = PIPES.set(pipes);
    Ok(())
}

fn forward(pipe: &Pipe, reader: OwnedFd, mut destination: Destination, stderr: bool) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let mut ready = [PollFd::new(reader.as_fd(), PollFlags::POLLIN)];
        if poll(&mut ready, PollTimeout::NONE).is_err() {
            continue;
        }
        pipe.busy.store(true, Ordering::SeqCst);
        let read = match nix::unistd::read(&reader, &mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        pending.extend_from_slice(&buffer[..read]);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            pass_on(line, stderr, &mut destination);
        }
        pipe.busy.store(false, Ordering::SeqCst);
    }
}

/// Sends a line to the running task's owner and to the log file; without a
/// log file, a line no owner took goes where the process's output went.
fn pass_on(line: String, stderr: bool, destination: &mut Destination) {
    let sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if destination.every_line {
        let task = sink
            .as_ref()
            .and_then(|sink| Some((sink.task_id?, sink.function.as_str())));
        destination.write(task, &line);
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
    if !sent && !destination.every_line {
        let _ = writeln!(destination.file, "{line}");
    }
}
