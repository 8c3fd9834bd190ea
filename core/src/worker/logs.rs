//! Forwards a worker's stdout and stderr to the owner of the running task,
//! line by line, tagged with the function's name. Before any task ran, lines
//! go where the process's output went. [`drain`] holds a task's result back
//! until the lines it printed are on their way, so that output never comes
//! after the result it belongs to (an owner may stop listening then).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use raylet_proto::v1::{LogLine, WorkerEvents};

use super::executor::ResultSender;

struct Sink {
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
pub(crate) fn attach(function: &str, results: ResultSender) {
    let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    *sink = Some(Sink {
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

/// Replaces fds 1 and 2 with pipes read by two forwarding threads.
pub(crate) fn capture() -> std::io::Result<()> {
    let mut pipes = Vec::new();
    for stderr in [false, true] {
        let original = match stderr {
            false => nix::unistd::dup(std::io::stdout())?,
            true => nix::unistd::dup(std::io::stderr())?,
        };
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

fn forward(pipe: &Pipe, reader: OwnedFd, original: OwnedFd, stderr: bool) {
    let mut fallback = std::fs::File::from(original);
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
            pass_on(line, stderr, &mut fallback);
        }
        pipe.busy.store(false, Ordering::SeqCst);
    }
}

/// Sends a line to the running task's owner, or else where output went.
fn pass_on(line: String, stderr: bool, fallback: &mut std::fs::File) {
    let sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    let sent = sink.as_ref().is_some_and(|sink| {
        let log = LogLine {
            function: sink.function.clone(),
            stderr,
            line: line.clone(),
        };
        sink.results
            .send(&WorkerEvents {
                results: Vec::new(),
                logs: vec![log],
            })
            .is_ok()
    });
    drop(sink);
    if !sent {
        let _ = writeln!(fallback, "{line}");
    }
}
