//! Job drivers on this node: the job's binary and files fetched from the
//! head and laid out in the job's own directory, the binary checked to be
//! one this machine can run, the driver started there (joined to the
//! cluster through `RAYLET_*` variables, in a process group of its own),
//! its output and exit streamed back, the directory removed once it ended
//! (the blobs stay cached), and stops: SIGTERM, then SIGKILL.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use raylet_proto::v1::job_driver_event::Kind as Event;
use raylet_proto::v1::{JobDriverEvent, JobDriverExit, JobSpec};
use raylet_proto::{Error, JobId, ResourceSet, Result};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::NodeShared;
use super::blob_fetch::BlobFetch;

/// Where a driver's events go.
pub(crate) type DriverEvents = mpsc::UnboundedSender<std::result::Result<JobDriverEvent, tonic::Status>>;

/// Bytes of stderr kept for a failed job's message.
const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// Lines of stderr kept for a failed job's message.
const STDERR_TAIL_LINES: usize = 20;

/// The drivers this node runs, by job.
pub(crate) struct JobDrivers {
    blobs: BlobFetch,
    jobs_dir: PathBuf,
    running: Mutex<HashMap<JobId, u32>>,
}

impl JobDrivers {
    pub(crate) fn new(work_dir: &Path, head_address: String, token: raylet_proto::auth::AuthToken) -> Self {
        JobDrivers {
            blobs: BlobFetch::new(work_dir.join("blobs"), head_address, token),
            jobs_dir: work_dir.join("jobs"),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// A worker binary that is not on this node, from the head, which has
    /// it when it came with a job.
    pub(crate) async fn binary_by_build(&self, build_hash: &str) -> Result<PathBuf> {
        self.blobs.get_binary(build_hash).await
    }

    fn running(&self) -> MutexGuard<'_, HashMap<JobId, u32>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Signals the job's driver group with SIGTERM, and SIGKILL after
    /// `grace` if it still runs. Says whether this node runs the driver.
    pub(crate) fn stop(self: &Arc<Self>, job: JobId, grace: Duration) -> bool {
        let Some(pid) = self.running().get(&job).copied() else {
            return false;
        };
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let drivers = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if drivers.running().get(&job) == Some(&pid) {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        });
        true
    }
}

/// Prepares and runs the driver, sending its events; ends once it exited.
pub(crate) async fn run(shared: Arc<NodeShared>, job: JobId, spec: JobSpec, events: DriverEvents) {
    let send = |kind: Event| {
        let _ = events.send(Ok(JobDriverEvent { kind: Some(kind) }));
    };
    let demand = match ResourceSet::from_proto(&spec.resources.clone().unwrap_or_default()) {
        Ok(demand) => demand,
        Err(error) => return send(Event::Failed(error.to_string())),
    };
    let Some(holder) = shared.leases.hold_for_driver(demand) else {
        return send(Event::Busy(
            "the node has no room for the driver's resources now".into(),
        ));
    };
    let outcome = prepare_and_run(&shared, job, &spec, &send).await;
    shared.leases.release_driver(holder);
    let dir = shared.job_drivers.jobs_dir.join(job.to_string());
    if let Err(error) = std::fs::remove_dir_all(&dir) {
        tracing::debug!(%job, %error, "could not remove the job's directory");
    }
    match outcome {
        Ok(exit) => send(Event::Exited(exit)),
        Err(error) => send(Event::Failed(error.to_string())),
    }
}

async fn prepare_and_run(
    shared: &Arc<NodeShared>,
    job: JobId,
    spec: &JobSpec,
    send: &impl Fn(Event),
) -> Result<JobDriverExit> {
    let drivers = &shared.job_drivers;
    let dir = drivers.jobs_dir.join(job.to_string());
    let binary = lay_out(drivers, &dir, spec).await?;
    check_runnable(&binary)?;
    let mut child = tokio::process::Command::new(&binary)
        .args(&spec.args)
        .current_dir(&dir)
        .envs(driver_env(shared, job))
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::FailedPrecondition(format!("the driver {} could not start: {e}", binary.display())))?;
    let pid = child.id().unwrap_or_default();
    drivers.running().insert(job, pid);
    send(Event::Started(pid));
    let (output, mut received) = mpsc::unbounded_channel();
    let stdout = tokio::spawn(forward(child.stdout.take(), output.clone(), None));
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let stderr = tokio::spawn(forward(child.stderr.take(), output, Some(stderr_tail.clone())));
    while let Some(data) = received.recv().await {
        send(Event::Output(data));
    }
    let _ = (stdout.await, stderr.await);
    let status = child.wait().await;
    drivers.running().remove(&job);
    let status = status.map_err(|e| Error::Internal(format!("waiting for the driver: {e}")))?;
    let tail = stderr_tail.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(JobDriverExit {
        exit_code: status.code(),
        signal: status.signal(),
        stderr_tail: last_lines(&Vec::from(tail)),
    })
}

/// The variables that join the driver to this cluster through this node.
fn driver_env(shared: &NodeShared, job: JobId) -> Vec<(&'static str, String)> {
    vec![
        ("RAYLET_ADDRESS", shared.config.head_address.clone()),
        ("RAYLET_TOKEN", shared.config.token.expose().to_string()),
        ("RAYLET_NODE_MANAGER", shared.address.to_string()),
        ("RAYLET_JOB_ID", job.to_string()),
        ("RAYLET_NAMESPACE", format!("job-{job}")),
    ]
}

/// Fetches the binary and files and places them in `dir`; returns the
/// binary's path there.
async fn lay_out(drivers: &JobDrivers, dir: &Path, spec: &JobSpec) -> Result<PathBuf> {
    let binary = spec
        .binary
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the job names no binary".into()))?;
    let cached = drivers.blobs.get(binary).await?;
    let target = dir.join(&spec.binary_name);
    link_binary(&cached, &target)?;
    for file in &spec.files {
        let blob = file
            .blob
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument(format!("the file {} names no blob", file.path)))?;
        let cached = drivers.blobs.get(blob).await?;
        place(&cached, &dir.join(&file.path), file.executable)?;
    }
    Ok(target)
}

/// Links the cached binary (executable, and never written) into the job's
/// directory; copies it where a link cannot be made.
fn link_binary(cached: &Path, target: &Path) -> Result<()> {
    let failed = |e: std::io::Error| Error::Internal(format!("placing {}: {e}", target.display()));
    std::fs::create_dir_all(target.parent().unwrap_or(Path::new("."))).map_err(failed)?;
    match std::fs::hard_link(cached, target) {
        Ok(()) => Ok(()),
        Err(_) => place(cached, target, true),
    }
}

/// Copies a cached blob to `target`, making its directories: the job may
/// change its copy without touching the cache.
fn place(cached: &Path, target: &Path, executable: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |e: std::io::Error| Error::Internal(format!("placing {}: {e}", target.display()));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    std::fs::copy(cached, target).map_err(failed)?;
    let mode = if executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode)).map_err(failed)
}

/// The ELF machine number of this build's architecture.
fn elf_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86_64" => Some(62),
        "aarch64" => Some(183),
        "riscv64" => Some(243),
        _ => None,
    }
}

/// Refuses a binary this machine cannot run, saying why, before trying.
fn check_runnable(binary: &Path) -> Result<()> {
    let mut head = [0u8; 20];
    let read = std::fs::File::open(binary)
        .and_then(|mut file| file.read(&mut head))
        .map_err(|e| Error::Internal(format!("reading {}: {e}", binary.display())))?;
    let head = &head[..read];
    if head.starts_with(b"#!") {
        return Ok(());
    }
    let here = format!("{} Linux", std::env::consts::ARCH);
    if !head.starts_with(b"\x7fELF") || head.len() < 20 {
        return Err(Error::FailedPrecondition(format!(
            "the job's binary is not an executable this node ({here}) can run: it is neither an ELF file nor a script"
        )));
    }
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if head[4] != 2 || Some(machine) != elf_machine() {
        return Err(Error::FailedPrecondition(format!(
            "the job's binary is built for another machine (ELF class {}, machine {machine}); this node is {here}",
            head[4]
        )));
    }
    Ok(())
}

/// Sends what `pipe` gives as output events; keeps its tail if asked.
async fn forward(
    pipe: Option<impl AsyncRead + Unpin>,
    output: mpsc::UnboundedSender<Vec<u8>>,
    tail: Option<Arc<Mutex<VecDeque<u8>>>>,
) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = pipe.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        if let Some(tail) = &tail {
            let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
            tail.extend(&buffer[..read]);
            let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
            tail.drain(..excess);
        }
        let _ = output.send(buffer[..read].to_vec());
    }
}

/// The last lines of `bytes`, as text.
fn last_lines(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_for_other_machines_and_non_executables_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, b"just some text").unwrap();
        let error = check_runnable(&text).unwrap_err().to_string();
        assert!(error.contains("neither an ELF file nor a script"), "{error}");
        let mut foreign = b"\x7fELF\x02\x01\x01\x00".to_vec();
        foreign.resize(18, 0);
        foreign.extend(20u16.to_le_bytes());
        let other = dir.path().join("ppc");
        std::fs::write(&other, &foreign).unwrap();
        let error = check_runnable(&other).unwrap_err().to_string();
        assert!(
            error.contains("built for another machine (ELF class 2, machine 20)"),
            "{error}"
        );
        assert!(check_runnable(&std::env::current_exe().unwrap()).is_ok());
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_lines() {
        let text: String = (0..30).map(|i| format!("line {i}\n")).collect();
        let tail = last_lines(text.as_bytes());
        assert!(tail.starts_with("line 10") && tail.ends_with("line 29"), "{tail}");
    }
}
