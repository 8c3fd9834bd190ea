//! Dumps every thread's backtrace while the worker runs on, for `raylet
//! stack`. The node manager sends the worker [`stack_request_signal`]; a
//! dumping thread then interrupts each other thread with a second signal,
//! whose handler records the thread's return addresses (no allocation, no
//! lock) and returns, so a thread stops for microseconds, not for the dump.
//! The dumping thread names the addresses' functions and writes the dump to
//! `worker-<id>-<pid>.stack` in the node's log directory, where the node
//! manager reads it.
//!
//! The handler unwinds with the system unwinder, as sampling profilers do;
//! a thread interrupted inside the dynamic loader's own lock (loading a
//! library) could not be unwound, so the dump waits for each thread a
//! short while and says so for a thread that did not answer.

use std::fmt::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::libc;
use raylet_proto::worker_logs::{stack_file_name, stack_request_signal};

/// The most frames recorded for one thread.
const MAX_FRAMES: usize = 128;
/// How long the dump waits for a thread to record its frames.
const THREAD_PATIENCE: Duration = Duration::from_millis(200);

/// The frames of the thread being recorded: one thread at a time.
struct FrameSlot {
    frames: [AtomicUsize; MAX_FRAMES],
    count: AtomicUsize,
    done: AtomicBool,
}

static SLOT: FrameSlot = FrameSlot {
    frames: [const { AtomicUsize::new(0) }; MAX_FRAMES],
    count: AtomicUsize::new(0),
    done: AtomicBool::new(false),
};

/// The write end of the pipe that wakes the dumping thread.
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// Where this worker writes its dumps.
static DUMP_PATH: OnceLock<PathBuf> = OnceLock::new();

/// The signal that asks a thread to record its frames.
fn record_signal() -> i32 {
    stack_request_signal() + 1
}

/// Starts the dumping thread and installs both signals' handlers; dumps go
/// to `log_dir`.
pub(crate) fn install(log_dir: &Path, worker_id: &str) -> std::io::Result<()> {
    let _ = DUMP_PATH.set(log_dir.join(stack_file_name(worker_id, std::process::id())));
    let (reader, writer) = nix::unistd::pipe()?;
    WAKE.store(writer.as_raw_fd(), Ordering::Release);
    std::mem::forget(writer);
    std::thread::Builder::new()
        .name("raylet-stacks".into())
        .spawn(move || dump_on_request(reader))?;
    install_handler(stack_request_signal(), on_request)?;
    install_handler(record_signal(), on_record)
}

fn install_handler(number: i32, handler: extern "C" fn(i32)) -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid one to fill; both handlers only
    // touch atomics, write(2) and the unwinder, and the real-time signals
    // they take are raylet's alone.
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(number, &action, std::ptr::null_mut())
    };
    match installed {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The request signal's handler: wakes the dumping thread.
extern "C" fn on_request(_: i32) {
    let wake = WAKE.load(Ordering::Acquire);
    if wake >= 0 {
        // SAFETY: write(2) is async-signal-safe; the buffer is a live byte.
        unsafe { libc::write(wake, [1u8].as_ptr().cast(), 1) };
    }
}

/// The record signal's handler: records this thread's return addresses.
extern "C" fn on_record(_: i32) {
    let mut count = 0;
    // SAFETY: the dump records one thread at a time and waits for `done`,
    // so no other unwind of this module runs at once.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            SLOT.frames[count].store(frame.ip() as usize, Ordering::Relaxed);
            count += 1;
            count < MAX_FRAMES
        });
    }
    SLOT.count.store(count, Ordering::Relaxed);
    SLOT.done.store(true, Ordering::Release);
}

fn dump_on_request(reader: OwnedFd) {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&reader, &mut byte) {
            Ok(0) => return,
            Ok(_) => write_dump(),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

fn write_dump() {
    let Some(path) = DUMP_PATH.get() else {
        return;
    };
    let text = dump_threads();
    let mut unfinished = path.clone().into_os_string();
    unfinished.push(".partial");
    let written = std::fs::write(&unfinished, text).and_then(|()| std::fs::rename(&unfinished, path));
    if let Err(error) = written {
        eprintln!(
            "raylet worker: cannot write a stack dump to {}: {error}",
            path.display()
        );
    }
}

/// Every other thread's name and named frames.
fn dump_threads() -> String {
    let pid = std::process::id();
    let own = nix::unistd::gettid().as_raw();
    let mut text = String::new();
    let _ = writeln!(text, "Process {pid}, {} threads", threads().len());
    for tid in threads() {
        let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
        let _ = writeln!(text, "\nThread {tid} ({}):", name.trim());
        if tid == own {
            let _ = writeln!(text, "    (the thread writing this dump)");
            continue;
        }
        match record(pid as i32, tid) {
            Some(frames) => write_frames(&mut text, &frames),
            None => {
                let _ = writeln!(text, "    (did not answer within {THREAD_PATIENCE:?})");
            }
        }
    }
    text
}

/// The ids of this process's threads.
fn threads() -> Vec<i32> {
    let mut tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// Asks thread `tid` to record its frames and waits for them.
fn record(pid: i32, tid: i32) -> Option<Vec<usize>> {
    SLOT.done.store(false, Ordering::Release);
    // SAFETY: tgkill sends a signal whose handler this module installed.
    if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, record_signal()) } != 0 {
        return None;
    }
    let deadline = Instant::now() + THREAD_PATIENCE;
    while !SLOT.done.load(Ordering::Acquire) {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    let count = SLOT.count.load(Ordering::Relaxed);
    Some(
        SLOT.frames[..count]
            .iter()
            .map(|ip| ip.load(Ordering::Relaxed))
            .collect(),
    )
}

/// Names the frames after the signal's own: the handler's and the
/// kernel's return trampoline after it.
fn write_frames(text: &mut String, frames: &[usize]) {
    let named: Vec<(usize, Vec<String>)> = frames.iter().map(|ip| (*ip, names_of(*ip))).collect();
    let after_signal = named
        .iter()
        .rposition(|(_, names)| names.iter().any(|name| name.contains("on_record")))
        .map_or(0, |handler| (handler + 2).min(named.len()));
    for (index, (ip, names)) in named[after_signal..].iter().enumerate() {
        match names.is_empty() {
            true => {
                let _ = writeln!(text, "  {index:>3}: {ip:#x}");
            }
            false => {
                for name in names {
                    let _ = writeln!(text, "  {index:>3}: {name}");
                }
            }
        }
    }
}

/// The function (and inlined ones) at `ip`, with file and line when known.
fn names_of(ip: usize) -> Vec<String> {
    let mut names = Vec::new();
    backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
        let name = symbol
            .name()
            .map_or_else(|| "?".to_string(), |name| format!("{name:#}"));
        let place = match (symbol.filename(), symbol.lineno()) {
            (Some(file), Some(line)) => format!("\n         at {}:{line}", file.display()),
            _ => String::new(),
        };
        names.push(format!("{name}{place}"));
    });
    names
}
