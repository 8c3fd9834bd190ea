//! What a test does when the machine lacks something it needs: it fails,
//! saying how `tools/test.sh` provides it, unless the run was asked to leave
//! that need out (`RAYLET_TEST_LEAVE_OUT=chromium,slurm,...`); then it
//! ends early and says so. No test passes by skipping on its own, and CI
//! leaves nothing out.

use std::fmt;
use std::io::Write;

/// The variable that names the needs a run leaves out, comma-separated.
pub const LEAVE_OUT: &str = "RAYLET_TEST_LEAVE_OUT";
/// The variable that names a file where each test left out adds a line
/// (tools/test.sh prints it at the end of the run, where nextest would
/// not show a passing test's stderr).
pub const LEFT_OUT_LOG: &str = "RAYLET_TEST_LEFT_OUT_LOG";

/// Something a few tests need that only root or a package manager can
/// provide, so that a run on another machine may leave it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Headless Chromium, for the dashboard's browser test.
    Chromium,
    /// A running one-machine Slurm, for the autoscaler's Slurm provider.
    Slurm,
    /// Network namespaces (root), for the multi-host and chaos suites.
    NetworkNamespaces,
    /// Mounting a small `/dev/shm` in a mount namespace (root).
    ShmMount,
    /// Debian's Prometheus server, for the scrape test.
    Prometheus,
}

impl Need {
    /// Every need, in the order `tools/test.sh` lists them.
    pub const ALL: [Need; 5] = [
        Need::Chromium,
        Need::Slurm,
        Need::NetworkNamespaces,
        Need::ShmMount,
        Need::Prometheus,
    ];

    /// Its name in `RAYLET_TEST_LEAVE_OUT`.
    pub fn name(self) -> &'static str {
        match self {
            Need::Chromium => "chromium",
            Need::Slurm => "slurm",
            Need::NetworkNamespaces => "netns",
            Need::ShmMount => "shm-mount",
            Need::Prometheus => "prometheus",
        }
    }

    /// How a run gets it.
    fn provided_by(self) -> &'static str {
        match self {
            Need::Chromium => "tools/test.sh installs it (Debian's chromium package)",
            Need::Slurm => "tools/test.sh installs and starts a one-machine Slurm (.ci/slurm.sh)",
            Need::NetworkNamespaces => "run the tests as root (`ip netns` needs CAP_SYS_ADMIN)",
            Need::ShmMount => "run the tests as root (mounting needs CAP_SYS_ADMIN)",
            Need::Prometheus => "tools/test.sh installs it (Debian's prometheus package)",
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `need` is missing from this machine, for the reason `why`. Returns
/// (after saying so on stderr) when the run leaves `need` out, so that the
/// test can end; panics otherwise, saying how to provide it or leave it
/// out.
pub fn missing(need: Need, why: &dyn fmt::Display) {
    let leave_out = std::env::var(LEAVE_OUT).unwrap_or_default();
    let on_ci = std::env::var("CI").as_deref() == Ok("true");
    ensure_left_out(need, why, &leave_out, on_ci);
    record_left_out(need, why);
}

/// Panics unless a run whose `RAYLET_TEST_LEAVE_OUT` is `leave_out` leaves
/// `need` out, and it is not a CI run.
fn ensure_left_out(need: Need, why: &dyn fmt::Display, leave_out: &str, on_ci: bool) {
    if !left_out(need, leave_out) {
        panic!(
            "this test needs {need}, which is missing: {why}. {}; or leave the tests that need it out \
             with {LEAVE_OUT}={need}",
            need.provided_by()
        );
    }
    assert!(
        !on_ci,
        "CI leaves nothing out, but {LEAVE_OUT}={leave_out} and this test needs {need}: {why}"
    );
}

/// Says on stderr, and in the `RAYLET_TEST_LEFT_OUT_LOG` file when there
/// is one, that the running test is left out.
fn record_left_out(need: Need, why: &dyn fmt::Display) {
    let line = format!("{}: needs {need}: {why}", current_test());
    eprintln!("left out ({LEAVE_OUT} names {need}): {line}");
    if let Some(log) = std::env::var_os(LEFT_OUT_LOG) {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| writeln!(file, "{line}"));
        if let Err(error) = appended {
            eprintln!("{LEFT_OUT_LOG} ({}) cannot be written: {error}", log.to_string_lossy());
        }
    }
}

/// The running test's name: the test harness names each test's thread
/// after it (and nextest runs each test alone in a process).
fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_string()
}

/// Whether the comma-separated list `leave_out` names `need`.
fn left_out(need: Need, leave_out: &str) -> bool {
    leave_out.split(',').any(|name| name.trim() == need.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_need_is_left_out_only_when_the_list_names_it() {
        assert!(left_out(Need::Slurm, "chromium, slurm"));
        assert!(left_out(Need::NetworkNamespaces, "netns"));
        assert!(!left_out(Need::Slurm, ""));
        assert!(!left_out(Need::Slurm, "slurmd,chromium"));
    }

    #[test]
    fn every_need_has_a_distinct_name() {
        let mut names: Vec<&str> = Need::ALL.iter().map(|need| need.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Need::ALL.len());
    }

    #[test]
    #[should_panic(expected = "leave the tests that need it out with RAYLET_TEST_LEAVE_OUT=chromium")]
    fn a_missing_need_that_is_not_left_out_fails_the_test() {
        ensure_left_out(Need::Chromium, &"no chromium on the PATH", "slurm", false);
    }

    #[test]
    fn a_missing_need_that_is_left_out_does_not_fail_the_test() {
        ensure_left_out(Need::Chromium, &"no chromium on the PATH", "slurm,chromium", false);
    }

    #[test]
    #[should_panic(expected = "CI leaves nothing out")]
    fn ci_leaves_nothing_out() {
        ensure_left_out(Need::Slurm, &"scontrol is not installed", "slurm", true);
    }
}
