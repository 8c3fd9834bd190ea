//! `raylet stop`: ends, by pid, every raylet daemon that this machine's
//! sessions started (joined nodes first, then the heads' nodes, then the
//! heads), and cleans up their records.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet::session::{ProcessRole, TempRoot};

use crate::args::StopArgs;

const POLL_INTERVAL: Duration = Duration::from_millis(20);

pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let root = TempRoot::new(&args.temp_dir);
    let targets = find_daemons(&root);
    if targets.is_empty() {
        println!("Did not find any active raylet processes.");
    }
    let mut survivors = Vec::new();
    for role in [ProcessRole::Node, ProcessRole::HeadNode, ProcessRole::Head] {
        let pids: Vec<u32> = targets
            .iter()
            .filter(|(_, r)| **r == role)
            .map(|(pid, _)| *pid)
            .collect();
        survivors.extend(end_processes(&pids, &args));
    }
    for session in root.sessions() {
        for record in session.processes().0 {
            if !survivors.contains(&record.pid) {
                session.remove_process(record.pid);
            }
        }
    }
    root.clear_latest()?;
    if !survivors.is_empty() {
        anyhow::bail!(
            "stopped only {} of {} raylet processes; still running: {survivors:?}",
            targets.len() - survivors.len(),
            targets.len()
        );
    }
    if !targets.is_empty() {
        println!("Stopped all {} raylet processes.", targets.len());
    }
    Ok(())
}

/// Ends this machine's raylet heads under `root`, waiting up to the grace
/// period for each to finish its shutdown; returns those still running.
pub(crate) fn end_heads(root: &TempRoot, args: &StopArgs) -> Vec<u32> {
    let heads: Vec<u32> = find_daemons(root)
        .into_iter()
        .filter(|(_, role)| *role == ProcessRole::Head)
        .map(|(pid, _)| pid)
        .collect();
    end_processes(&heads, args)
}

/// Daemons from the sessions' process records, and from a scan of /proc for
/// raylet daemons whose session directory is under this temp root (in case
/// a record was lost or corrupted).
pub(crate) fn find_daemons(root: &TempRoot) -> BTreeMap<u32, ProcessRole> {
    let mut daemons = BTreeMap::new();
    for session in root.sessions() {
        let (records, corrupt) = session.processes();
        for (path, error) in corrupt {
            eprintln!(
                "warning: ignoring unreadable process record {}: {error}",
                path.display()
            );
            let _ = fs::remove_file(path);
        }
        for record in records {
            if is_raylet_daemon(record.pid) {
                daemons.insert(record.pid, record.role);
            }
        }
    }
    daemons.extend(scan_proc_for_daemons(root.path()));
    daemons
}

fn scan_proc_for_daemons(root: &Path) -> Vec<(u32, ProcessRole)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter_map(|pid| {
            let args = command_line(pid)?;
            let session_dir = args
                .iter()
                .position(|a| a == "--session-dir")
                .and_then(|i| args.get(i + 1))?;
            let ours = is_raylet(&args) && is_under(Path::new(session_dir), root);
            let has = |flag: &str| args.iter().any(|a| a == flag);
            let role = match (has("--head"), has("--head-node")) {
                (true, _) => ProcessRole::Head,
                (false, true) => ProcessRole::HeadNode,
                (false, false) => ProcessRole::Node,
            };
            ours.then_some((pid, role))
        })
        .collect()
}

/// Whether `session_dir` lies inside the temp root `root`, compared by
/// whole path components: `/tmp/raylet-other/session_x` is not under
/// `/tmp/raylet`, though its text starts with it.
fn is_under(session_dir: &Path, root: &Path) -> bool {
    session_dir.starts_with(root) && session_dir != root
}

/// Whether `pid` is a raylet daemon (and not a process that took its pid).
pub(crate) fn is_raylet_daemon(pid: u32) -> bool {
    command_line(pid).is_some_and(|args| is_raylet(&args))
}

fn command_line(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!args.is_empty()).then_some(args)
}

fn is_raylet(args: &[String]) -> bool {
    let program = Path::new(&args[0]).file_name().unwrap_or_default();
    program == "raylet" && args.iter().any(|a| a == "start") && is_running_args(args)
}

fn is_running_args(args: &[String]) -> bool {
    args.iter().any(|a| a == "--block")
}

/// A process that exited but was not reaped yet counts as gone.
fn is_running(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Sends SIGTERM (or SIGKILL with --force), waits out the grace period, then
/// SIGKILLs what is left. Returns the pids that are still running.
fn end_processes(pids: &[u32], args: &StopArgs) -> Vec<u32> {
    let first = if args.force { Signal::SIGKILL } else { Signal::SIGTERM };
    signal_all(pids, first);
    if !wait_until_gone(pids, args.grace_period) {
        signal_all(pids, Signal::SIGKILL);
        wait_until_gone(pids, Duration::from_secs(5));
    }
    pids.iter().copied().filter(|pid| is_running(*pid)).collect()
}

fn signal_all(pids: &[u32], signal: Signal) {
    for pid in pids {
        if is_running(*pid) {
            let _ = kill(Pid::from_raw(*pid as i32), signal);
        }
    }
}

fn wait_until_gone(pids: &[u32], patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if pids.iter().all(|pid| !is_running(*pid)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_session_directories_inside_the_temp_root_are_ours() {
        let root = Path::new("/tmp/raylet");
        assert!(is_under(Path::new("/tmp/raylet/session_1"), root));
        assert!(is_under(Path::new("/tmp/raylet/session_1/"), Path::new("/tmp/raylet/")));
        for other in [
            "/tmp/raylet-other/session_1",
            "/tmp/raylet2/session_1",
            "/tmp/raylet",
            "/tmp/rayle/session_1",
        ] {
            assert!(
                !is_under(Path::new(other), root),
                "{other} is not under {}",
                root.display()
            );
        }
    }
}
