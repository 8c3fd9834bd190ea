//! Job drivers on this node. A driver is started in its job's directory
//! (joined to the cluster through `RAYLET_*` variables, in a process group
//! of its own) and supervised on its own: its output goes to a file beside
//! the directory and its end is kept for a while, so that a head that lost
//! the stream (it restarted) attaches again and reads on from where it was.
//! The directory is removed once the driver ended (the blobs stay cached,
//! and lease sessions opened on the job's binary start workers from its
//! cached blob: detached actors the job leaves behind outlive it).
//! Stops: SIGTERM, then SIGKILL.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use raylet_proto::v1::job_driver_event::Kind as Event;
use raylet_proto::v1::{JobDriverEvent, JobDriverExit, JobSpec, WorkerBinary};
use raylet_proto::{Error, JobId, ResourceSet, Result};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};

use super::NodeShared;
use super::blob_fetch::BlobFetch;
use super::job_layout::{check_runnable, lay_out};

/// Where a driver's events go.
pub(crate) type DriverEvents = raylet_proto::peer_stream::PeerSender<JobDriverEvent>;

/// Bytes of stderr kept for a failed job's message.
const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// Lines of stderr kept for a failed job's message.
const STDERR_TAIL_LINES: usize = 20;
/// How long an ended driver's output and end are kept for a head that
/// attaches late.
const ENDED_RETENTION: Duration = Duration::from_secs(600);
/// The most output bytes sent in one event.
const OUTPUT_CHUNK: usize = 64 * 1024;
/// Chunks of a driver's output read but not yet written to its file; a
/// driver that prints faster than the disk takes waits on its pipe.
const OUTPUT_CHUNKS_WAITING: usize = 64;

/// How far a driver has got.
#[derive(Clone, Debug, Default)]
struct Progress {
    pid: Option<u32>,
    output_bytes: u64,
    /// `Exited` or `Failed`, once it ended.
    end: Option<Event>,
}

/// A driver this node started, running or lately ended.
struct Driver {
    output: PathBuf,
    progress: watch::Sender<Progress>,
}

/// The drivers this node runs, by job.
pub(crate) struct JobDrivers {
    blobs: BlobFetch,
    jobs_dir: PathBuf,
    drivers: Mutex<HashMap<JobId, Arc<Driver>>>,
    /// The binaries of the jobs laid out here, by their path in the job's
    /// directory, to the cached blob each was placed from. One entry per
    /// job this node ran, kept for the node's life: a job's directory goes
    /// when its driver ends, the detached actors it started do not.
    lasting: Mutex<HashMap<PathBuf, PathBuf>>,
}

impl JobDrivers {
    pub(crate) fn new(work_dir: &Path, head_address: String, token: raylet_common::auth::AuthToken) -> Self {
        JobDrivers {
            blobs: BlobFetch::new(work_dir.join("blobs"), head_address, token),
            jobs_dir: work_dir.join("jobs"),
            drivers: Mutex::new(HashMap::new()),
            lasting: Mutex::new(HashMap::new()),
        }
    }

    /// `binary` as lease sessions start workers from it: a job's binary
    /// laid out on this node becomes its cached blob (the same file, linked
    /// into the job's directory), which outlives that directory.
    pub(crate) fn lasting_binary(&self, binary: WorkerBinary) -> WorkerBinary {
        let named = Path::new(&binary.path);
        let lasting = self.lasting.lock().unwrap_or_else(|p| p.into_inner());
        let cached = lasting.get(named).or_else(|| {
            let canonical = named.canonicalize().ok()?;
            lasting.get(&canonical)
        });
        match cached {
            Some(cached) => WorkerBinary {
                path: cached.to_string_lossy().into_owned(),
                ..binary
            },
            None => binary,
        }
    }

    /// Notes that the job binary at `binary` was placed from `cached`.
    fn laid_out(&self, binary: &Path, cached: PathBuf) {
        let binary = binary.canonicalize().unwrap_or_else(|_| binary.to_path_buf());
        let mut lasting = self.lasting.lock().unwrap_or_else(|p| p.into_inner());
        lasting.insert(binary, cached);
    }

    /// A worker binary that is not on this node, from the head, which has
    /// it when it came with a job.
    pub(crate) async fn binary_by_build(&self, build_hash: &str) -> Result<PathBuf> {
        self.blobs.get_binary(build_hash).await
    }

    fn drivers(&self) -> MutexGuard<'_, HashMap<JobId, Arc<Driver>>> {
        self.drivers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn driver(&self, job: JobId) -> Option<Arc<Driver>> {
        self.drivers().get(&job).cloned()
    }

    /// Signals the job's driver group with SIGTERM, and SIGKILL after
    /// `grace` if it still runs. Says whether this node runs the driver.
    pub(crate) fn stop(self: &Arc<Self>, job: JobId, grace: Duration) -> bool {
        let running = self.driver(job).and_then(|driver| {
            let progress = driver.progress.borrow();
            progress.pid.filter(|_| progress.end.is_none())
        });
        let Some(pid) = running else {
            return false;
        };
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let drivers = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let still = drivers.driver(job).is_some_and(|d| d.progress.borrow().end.is_none());
            if still {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        });
        true
    }

    /// Kills every running driver's process group at once; returns how
    /// many there were.
    pub(crate) fn kill_all(&self) -> usize {
        let running: Vec<u32> = self
            .drivers()
            .values()
            .filter_map(|driver| {
                let progress = driver.progress.borrow();
                progress.pid.filter(|_| progress.end.is_none())
            })
            .collect();
        for pid in &running {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        running.len()
    }

    /// Streams the driver's events to `events`: its start, its output from
    /// `offset` on, and its end. Fails when this node has no such driver.
    pub(crate) fn attach(&self, job: JobId, offset: u64, events: DriverEvents) -> Result<()> {
        let driver = self
            .driver(job)
            .ok_or_else(|| Error::NotFound(format!("this node runs no driver of job {job}, and has not lately")))?;
        tokio::spawn(stream_events(driver, offset, events));
        Ok(())
    }
}

/// Starts the job's driver and streams its events; sends only `Busy` when
/// the node has no room for it. A driver runs at most once per job here: a
/// head that asks again (it restarted before it knew the driver started)
/// follows the one this node runs, or lately ran, from its start.
pub(crate) fn start(shared: &Arc<NodeShared>, job: JobId, spec: JobSpec, events: DriverEvents) -> Result<()> {
    if shared.job_drivers.driver(job).is_some() {
        tracing::info!(%job, "the head asked again for a driver this node runs; following that one");
        return shared.job_drivers.attach(job, 0, events);
    }
    let demand = ResourceSet::from_proto(&spec.resources.clone().unwrap_or_default())?;
    let Some(holder) = shared.leases.hold_for_driver(demand) else {
        let busy = Event::Busy("the node has no room for the driver's resources now".into());
        let _ = events.send(Ok(JobDriverEvent { kind: Some(busy) }));
        return Ok(());
    };
    let drivers = &shared.job_drivers;
    let driver = Arc::new(Driver {
        output: drivers.jobs_dir.join(format!("{job}.out")),
        progress: watch::channel(Progress::default()).0,
    });
    drivers.drivers().insert(job, driver.clone());
    let shared = shared.clone();
    tokio::spawn(async move {
        let end = match supervise(&shared, job, &spec, &driver).await {
            Ok(exit) => Event::Exited(exit),
            Err(error) => Event::Failed(error.to_string()),
        };
        shared.leases.release_driver(holder);
        let dir = shared.job_drivers.jobs_dir.join(job.to_string());
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            tracing::debug!(%job, %error, "could not remove the job's directory");
        }
        driver.progress.send_modify(|progress| progress.end = Some(end));
        tokio::time::sleep(ENDED_RETENTION).await;
        forget(&shared.job_drivers, job, &driver);
    });
    drivers.attach(job, 0, events)
}

/// Drops an ended driver's record and output, unless a newer one took its place.
fn forget(drivers: &JobDrivers, job: JobId, driver: &Arc<Driver>) {
    let mut all = drivers.drivers();
    if all.get(&job).is_some_and(|current| Arc::ptr_eq(current, driver)) {
        all.remove(&job);
    }
    let _ = std::fs::remove_file(&driver.output);
}

/// Lays the job out, runs its driver and keeps its output; returns how it
/// exited.
async fn supervise(shared: &Arc<NodeShared>, job: JobId, spec: &JobSpec, driver: &Driver) -> Result<JobDriverExit> {
    let drivers = &shared.job_drivers;
    let dir = drivers.jobs_dir.join(job.to_string());
    let (binary, cached) = lay_out(&drivers.blobs, &dir, spec).await?;
    check_runnable(&binary)?;
    drivers.laid_out(&binary, cached);
    let mut output = std::fs::File::create(&driver.output)
        .map_err(|e| Error::Internal(format!("creating {}: {e}", driver.output.display())))?;
    let mut child = tokio::process::Command::new(&binary)
        .args(&spec.args)
        .current_dir(&dir)
        .envs(driver_env(shared, job))
        .envs(raylet_common::tls::child_env())
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::FailedPrecondition(format!("the driver {} could not start: {e}", binary.display())))?;
    let pid = child.id().unwrap_or_default();
    driver.progress.send_modify(|progress| progress.pid = Some(pid));
    let (chunks, mut received) = mpsc::channel(OUTPUT_CHUNKS_WAITING);
    let stdout = tokio::spawn(forward(child.stdout.take(), chunks.clone(), None));
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let stderr = tokio::spawn(forward(child.stderr.take(), chunks, Some(stderr_tail.clone())));
    while let Some(data) = received.recv().await {
        match output.write_all(&data) {
            Ok(()) => driver
                .progress
                .send_modify(|progress| progress.output_bytes += data.len() as u64),
            Err(error) => tracing::warn!(%job, %error, "cannot keep the driver's output"),
        }
    }
    let _ = (stdout.await, stderr.await);
    let status = child
        .wait()
        .await
        .map_err(|e| Error::Internal(format!("waiting for the driver: {e}")))?;
    let tail = stderr_tail.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(JobDriverExit {
        exit_code: status.code(),
        signal: status.signal(),
        stderr_tail: last_lines(&Vec::from(tail)),
    })
}

/// Sends the driver's start, its output from `offset` and its end, as they
/// come, until it ended or the receiver is gone. The output is read from
/// its file only as fast as the receiver takes it.
async fn stream_events(driver: Arc<Driver>, mut offset: u64, events: DriverEvents) {
    let send = |kind: Event| events.send_when_room(Ok(JobDriverEvent { kind: Some(kind) }));
    let mut progress = driver.progress.subscribe();
    let mut started = false;
    let mut output: Option<std::fs::File> = None;
    loop {
        let now = progress.borrow_and_update().clone();
        if let (false, Some(pid)) = (started, now.pid) {
            started = send(Event::Started(pid)).await.is_ok();
        }
        while offset < now.output_bytes {
            let chunk = match read_output(&mut output, &driver.output, offset, now.output_bytes) {
                Ok(chunk) => chunk,
                Err(error) => {
                    let _ = send(Event::Failed(error.to_string())).await;
                    return;
                }
            };
            offset += chunk.len() as u64;
            if send(Event::Output(chunk)).await.is_err() {
                return;
            }
        }
        if let Some(end) = now.end {
            let _ = send(end).await;
            return;
        }
        if progress.changed().await.is_err() {
            return;
        }
    }
}

/// Up to one chunk of the output file from `offset`, not past `end`; the
/// file is opened on the first read and kept open for the next ones.
fn read_output(file: &mut Option<std::fs::File>, path: &Path, offset: u64, end: u64) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let failed = |e: std::io::Error| Error::Internal(format!("reading {}: {e}", path.display()));
    let file = match file {
        Some(file) => file,
        None => file.insert(std::fs::File::open(path).map_err(failed)?),
    };
    let mut chunk = vec![0u8; (end - offset).min(OUTPUT_CHUNK as u64) as usize];
    let read = file.read_at(&mut chunk, offset).map_err(failed)?;
    chunk.truncate(read);
    if chunk.is_empty() {
        return Err(Error::Internal(format!(
            "{} holds less output than was written",
            path.display()
        )));
    }
    Ok(chunk)
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

/// Sends what `pipe` gives as output events; keeps its tail if asked.
async fn forward(
    pipe: Option<impl AsyncRead + Unpin>,
    output: mpsc::Sender<Vec<u8>>,
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
        if output.send(buffer[..read].to_vec()).await.is_err() {
            return;
        }
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
    fn the_stderr_tail_keeps_the_last_lines() {
        let text: String = (0..30).map(|i| format!("line {i}\n")).collect();
        let tail = last_lines(text.as_bytes());
        assert!(tail.starts_with("line 10") && tail.ends_with("line 29"), "{tail}");
    }
}
