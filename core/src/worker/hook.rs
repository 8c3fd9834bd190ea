//! The hook that runs before `main` in every binary that links raylet: when
//! the bootstrap variable is set, the process becomes a worker and exits
//! without running `main`.

use raylet_common::worker_env::{WORKER_ENV, WorkerBootstrap};

#[ctor::ctor(unsafe)]
fn enter_worker_mode() {
    let Some(value) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    // SAFETY: this runs before main, on the only thread of the process.
    unsafe { std::env::remove_var(WORKER_ENV) };
    ignore_sigpipe();
    reuse_large_allocations();
    let code = std::panic::catch_unwind(|| match WorkerBootstrap::from_env_value(&value.to_string_lossy()) {
        Ok(bootstrap) => super::run(bootstrap),
        Err(error) => {
            eprintln!("raylet worker: {error}");
            2
        }
    });
    std::process::exit(code.unwrap_or(101));
}

/// Rust ignores SIGPIPE before `main`, which has not run here.
fn ignore_sigpipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_IGN installs no handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// A worker moves values of megabytes one after another (arguments,
/// returns, a generator's items): glibc gives each its own mapping and
/// unmaps it when it is freed, so every value pays its page faults and
/// zeroing again. Keeping up to 64 MiB of freed memory in the heap lets the
/// next value reuse it: twice the items per second from a generator of
/// 1 MiB items.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn reuse_large_allocations() {
    // SAFETY: mallopt only sets the allocator's thresholds; nothing has
    // been allocated with the old ones that the new ones could mistreat.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn reuse_large_allocations() {}
