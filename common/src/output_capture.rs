//! Captures this process's stdout or stderr: the file descriptor becomes a
//! pipe read by a thread that hands every line to a callback, so that a
//! worker can send its lines to the task's owner and a daemon can write
//! them to a log that rotates ([`capture_into_log`]). Bytes written but
//! not yet handed over can be waited for ([`CapturedPipe::drain`]), so a
//! result or an exit does not overtake what was printed before it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::log_rotation::{RotatingFile, RotationSettings};

/// The standard stream a pipe replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The read end of a captured stream and whether its reader holds bytes
/// it has read but not yet handed over.
pub struct CapturedPipe {
    reader: RawFd,
    busy: AtomicBool,
}

impl CapturedPipe {
    /// Whether bytes written so far may still be unhanded: in the pipe, or
    /// read and not yet handed over. The reader marks itself busy before
    /// it reads, so checking the pipe first and the mark second never
    /// misses bytes in between.
    fn holds_unsent(&self) -> bool {
        bytes_in_pipe(self.reader) > 0 || self.busy.load(Ordering::SeqCst)
    }

    /// Waits, for `patience` at most, until every line written so far has
    /// been handed over.
    pub fn drain(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        while self.holds_unsent() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

nix::ioctl_read_bad!(fionread, nix::libc::FIONREAD, nix::libc::c_int);

fn bytes_in_pipe(fd: RawFd) -> i32 {
    let mut count: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points
    // at a live local; `fd` is a pipe kept open for the process's life.
    match unsafe { fionread(fd, &mut count) } {
        Ok(_) => count,
        Err(_) => 0,
    }
}

/// Replaces `stream` with a pipe whose lines (without their newline) a
/// thread hands to `on_line`, for the rest of the process's life.
pub fn capture(
    stream: Stream,
    mut on_line: impl FnMut(String) + Send + 'static,
) -> std::io::Result<&'static CapturedPipe> {
    let (reader, writer) = nix::unistd::pipe()?;
    match stream {
        Stream::Stdout => nix::unistd::dup2_stdout(&writer)?,
        Stream::Stderr => nix::unistd::dup2_stderr(&writer)?,
    }
    let pipe: &'static CapturedPipe = Box::leak(Box::new(CapturedPipe {
        reader: reader.as_raw_fd(),
        busy: AtomicBool::new(false),
    }));
    std::thread::Builder::new()
        .name("raylet-output".into())
        .spawn(move || read_lines(pipe, reader, &mut on_line))?;
    Ok(pipe)
}

fn read_lines(pipe: &CapturedPipe, reader: OwnedFd, on_line: &mut dyn FnMut(String)) {
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
            on_line(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
        pipe.busy.store(false, Ordering::SeqCst);
    }
}

/// How long a panicking process waits at most for its last lines to reach
/// its log.
const PANIC_DRAIN: Duration = Duration::from_millis(500);

/// Sends this process's stdout and stderr to the log at `path`, which
/// rotates by `settings` (a daemon's log). Output written before this call
/// stays where it went; a panic's message is in the log before the process
/// ends.
pub fn capture_into_log(path: &Path, settings: RotationSettings) -> std::io::Result<()> {
    let log = Arc::new(Mutex::new(RotatingFile::open(path, settings)?));
    let mut pipes = Vec::new();
    for stream in [Stream::Stdout, Stream::Stderr] {
        let log = log.clone();
        let pipe = capture(stream, move |mut line| {
            line.push('\n');
            // A line the disk has no room for is lost: there is nowhere
            // else to say so.
            let _ = log.lock().unwrap_or_else(|p| p.into_inner()).append(line.as_bytes());
        })?;
        pipes.push(pipe);
    }
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        report(panic);
        for pipe in &pipes {
            pipe.drain(PANIC_DRAIN);
        }
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_rotation::rotated_path;

    /// Set in the child process this test starts: the log to capture into.
    const CHILD_LOG: &str = "RAYLET_TEST_CAPTURED_LOG";

    #[test]
    fn a_captured_process_writes_its_output_to_a_log_that_rotates_and_keeps_its_panic_message() {
        if let Ok(path) = std::env::var(CHILD_LOG) {
            let settings = RotationSettings {
                max_bytes: 4096,
                backup_count: 2,
            };
            capture_into_log(Path::new(&path), settings).unwrap();
            for n in 0..1000 {
                println!("out {n:04}");
                eprintln!("err {n:04}");
            }
            panic!("the daemon's last words");
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("daemon.log");
        let name = "output_capture::tests::a_captured_process_writes_its_output_to_a_log_that_rotates_and_keeps_its_panic_message";
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture"])
            .env(CHILD_LOG, &log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the child panicked");
        let parts: Vec<_> = (0..4)
            .map(|n| rotated_path(&log, n))
            .filter(|part| part.exists())
            .collect();
        assert_eq!(parts.len(), 3, "the log and its 2 kept parts: {parts:?}");
        let on_disk: u64 = parts.iter().map(|part| std::fs::metadata(part).unwrap().len()).sum();
        assert!(on_disk <= 3 * 4096 + 512, "{on_disk} bytes");
        let text: String = parts
            .iter()
            .rev()
            .map(|part| std::fs::read_to_string(part).unwrap())
            .collect();
        assert!(text.contains("out 0999") && text.contains("err 0999"), "{text}");
        assert!(text.contains("the daemon's last words"), "{text}");
    }
}
