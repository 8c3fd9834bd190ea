//! Starting a daemon: the CLI re-executes itself with `--block` in the
//! background, its output going to the session's log, and waits for the
//! daemon to report through a ready file that it serves, or why it failed.
//! A token given as `--token` reaches the daemon in its environment, never
//! on its command line, which every local user can read in `ps`.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use raylet::session::Session;
use serde::{Deserialize, Serialize};

const POLL_INTERVAL: Duration = Duration::from_millis(2);
const LOG_TAIL_LINES: usize = 15;
/// The flag that carries the token on the starting command's line.
const TOKEN_FLAG: &str = "--token";
/// Where the daemon finds the token instead.
pub const TOKEN_VARIABLE: &str = "RAYLET_TOKEN";

/// What a daemon reports once it serves, or why it could not start.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyReport {
    Ready { address: String, node_id: String },
    Failed { error: String },
}

impl ReadyReport {
    /// Writes the report where the starting process looks for it.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let staging = path.with_extension("tmp");
        fs::write(&staging, serde_json::to_vec(self)?)?;
        fs::rename(&staging, path).with_context(|| format!("writing {}", path.display()))
    }

    fn read(path: &Path) -> Option<ReadyReport> {
        serde_json::from_slice(&fs::read(path).ok()?).ok()
    }
}

/// A daemon that reported that it serves.
pub struct Started {
    pub pid: u32,
    pub address: String,
    pub node_id: String,
    pub log: PathBuf,
}

/// Re-executes this command with `--block` in the background and waits up to
/// `patience` for it to report.
pub fn spawn_and_wait(session: &Session, log_name: &str, patience: Duration) -> anyhow::Result<Started> {
    let (args, token) = without_token(std::env::args_os().skip(1));
    let mut daemon = Command::new(std::env::current_exe()?);
    if let Some(token) = token {
        daemon.env(TOKEN_VARIABLE, token);
    }
    daemon.args(args);
    let (started, _daemon) = start_daemon(daemon, session, log_name, patience)?;
    Ok(started)
}

/// Starts `daemon` (a `raylet start` command) with `--block` in the
/// background of `session`, its output going to the session's log
/// `log_name`, and waits up to `patience` for it to report. Returns it too,
/// for a caller that outlives its start to reap it.
pub fn start_daemon(
    mut daemon: Command,
    session: &Session,
    log_name: &str,
    patience: Duration,
) -> anyhow::Result<(Started, Child)> {
    let ready_file = session.dir().join(format!("{log_name}.ready"));
    let _ = fs::remove_file(&ready_file);
    let log = session.log_path(log_name);
    let log_file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut child = daemon
        .arg("--block")
        .arg("--session-dir")
        .arg(session.dir())
        .arg("--ready-file")
        .arg(&ready_file)
        .arg("--log-file")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .process_group(0)
        .spawn()
        .context("starting the raylet daemon")?;
    let outcome = wait_for_report(&mut child, &ready_file, patience);
    let _ = fs::remove_file(&ready_file);
    match outcome {
        Ok(ReadyReport::Ready { address, node_id }) => {
            let started = Started {
                pid: child.id(),
                address,
                node_id,
                log,
            };
            Ok((started, child))
        }
        Ok(ReadyReport::Failed { error }) => {
            let _ = child.wait();
            bail!("{error}")
        }
        Err(error) => bail!("{error}\nlast lines of {}:\n{}", log.display(), log_tail(&log)),
    }
}

/// The daemon's report, once it wrote one; kills it when it has not after
/// `patience`.
fn wait_for_report(child: &mut Child, ready_file: &Path, patience: Duration) -> anyhow::Result<ReadyReport> {
    let started = Instant::now();
    loop {
        if let Some(report) = ReadyReport::read(ready_file) {
            return Ok(report);
        }
        if let Some(status) = child.try_wait()? {
            return ReadyReport::read(ready_file)
                .ok_or_else(|| anyhow!("the daemon exited ({status}) before it was ready"));
        }
        if started.elapsed() > patience {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the daemon was not ready after {patience:?}; it was killed");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The arguments without `--token T` or `--token=T`, and the token they held.
fn without_token(mut args: impl Iterator<Item = OsString>) -> (Vec<OsString>, Option<OsString>) {
    let mut kept = Vec::new();
    let mut token = None;
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == TOKEN_FLAG.as_bytes() {
            token = args.next();
        } else if let Some(value) = bytes.strip_prefix(format!("{TOKEN_FLAG}=").as_bytes()) {
            token = Some(OsStr::from_bytes(value).to_os_string());
        } else if bytes == b"--" {
            kept.push(arg);
            kept.extend(args.by_ref());
        } else {
            kept.push(arg);
        }
    }
    (kept, token)
}

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(args: &[&str]) -> (Vec<OsString>, Option<OsString>) {
        without_token(args.iter().map(OsString::from))
    }

    #[test]
    fn the_token_leaves_the_command_line_in_either_spelling() {
        let (kept, token) = split(&["start", "--address", "h:1", "--token", "abc", "--num-cpus", "1"]);
        assert_eq!(kept, ["start", "--address", "h:1", "--num-cpus", "1"]);
        assert_eq!(token.as_deref(), Some(OsStr::new("abc")));
        let (kept, token) = split(&["start", "--token=def", "--head"]);
        assert_eq!(kept, ["start", "--head"]);
        assert_eq!(token.as_deref(), Some(OsStr::new("def")));
    }

    #[test]
    fn other_arguments_are_kept_as_they_are() {
        let (kept, token) = split(&["start", "--head", "--labels", "a=--token"]);
        assert_eq!(kept, ["start", "--head", "--labels", "a=--token"]);
        assert_eq!(token, None);
    }
}
