//! The hook that runs before `main` in every binary that links raylet: when
//! the bootstrap variable is set, the process becomes a worker and exits
//! without running `main`.

use raylet_proto::worker_env::{WORKER_ENV, WorkerBootstrap};

#[ctor::ctor(unsafe)]
fn enter_worker_mode() {
    let Some(value) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    // SAFETY: this runs before main, on the only thread of the process.
    unsafe { std::env::remove_var(WORKER_ENV) };
    ignore_sigpipe();
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
