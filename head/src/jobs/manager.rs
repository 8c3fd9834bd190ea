//! Runs jobs: picks a node for each driver with the placement policy, asks
//! that node manager to run it, records what it reports (start, output,
//! exit) and stops drivers on request. A driver that finds no room waits.
//! When the stream from the node breaks, or the head restarted, the head
//! attaches to the driver again and reads its output on from where it was.

use std::collections::HashMap;
use std::path::{Component, Path};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raylet_common::Backoff;
use raylet_common::auth::AuthToken;
use raylet_placement::{Choice, Placer};
use raylet_proto::blob::check_ref;
use raylet_proto::v1::job_driver_event::Kind as DriverEvent;
use raylet_proto::v1::node_manager_service_client::NodeManagerServiceClient;
use raylet_proto::v1::{
    AttachJobDriverRequest, JobDriverEvent, JobDriverExit, JobRecord, JobSpec, JobStatus, RunJobDriverRequest,
    StopJobDriverRequest,
};
use raylet_proto::{JobId, NodeId, ResourceSet, Scheduling};
use tonic::Code;

use super::blobs::BlobStore;
use super::error::JobError;
use super::table::{JobTable, WAITING_FOR_A_NODE, is_ended};
use crate::NodeTable;
use crate::state_store::StateStore;

/// How long a node manager may take to answer a connection.
const NODE_PATIENCE: Duration = Duration::from_secs(5);
/// How often a job that found no room looks again, and how often the head
/// tries to attach again to a driver on a node it cannot reach.
const PENDING_RETRY: Duration = Duration::from_millis(500);
/// The most files one job may ship.
const MAX_FILES: usize = 100_000;
/// How a job stopped before its driver started ended.
const STOPPED_BEFORE_START: &str = "stopped before its driver started";

/// Where a job's driver runs, and whether it was asked to stop.
#[derive(Clone, Default)]
struct Driver {
    address: Option<String>,
    stop_grace: Option<Duration>,
}

/// Where following a driver's stream got to.
enum Following {
    Ended(Ended),
    /// The node had no room for the driver.
    Busy,
    /// The stream broke while the driver may still run.
    Broken(String),
}

/// How the head goes on with a job.
enum Resume {
    /// Place its driver on a node with room.
    Place,
    /// Its driver was being started on this node: follow it there, or place
    /// it anew when that node never started it.
    Starting(NodeId),
    /// Follow its driver on this node.
    Running(NodeId),
}

type Result<T, E = JobError> = std::result::Result<T, E>;

/// Why a job's driver cannot run, or can no longer be followed: the job
/// fails with this.
#[derive(Debug, thiserror::Error)]
enum DriverFailure {
    #[error("the driver can never be placed: {reason}")]
    NeverPlaceable { reason: String },
    #[error("the node {node_id} running the driver died")]
    NodeDied { node_id: NodeId },
    #[error("the node {node_id} lost the driver: {reason}")]
    DriverLost { node_id: NodeId, reason: String },
}

/// How a job ended.
struct Ended {
    status: JobStatus,
    message: String,
    exit: Option<JobDriverExit>,
}

/// The head's jobs and their drivers.
pub struct JobManager {
    pub(crate) table: JobTable,
    pub(crate) blobs: BlobStore,
    nodes: Arc<Mutex<NodeTable>>,
    placer: Mutex<Placer>,
    token: AuthToken,
    drivers: Mutex<HashMap<JobId, Driver>>,
}

impl JobManager {
    /// Keeps blobs and job output under `dir` and records in `store`;
    /// goes on with the jobs `store` holds that had not ended: places the
    /// pending ones and attaches to the running ones' drivers.
    pub fn recover(
        dir: &Path,
        max_blob_bytes: u64,
        nodes: Arc<Mutex<NodeTable>>,
        token: AuthToken,
        store: StateStore,
    ) -> Result<Arc<Self>> {
        let manager = Arc::new(JobManager {
            table: JobTable::recover(&dir.join("jobs"), store.clone())?,
            blobs: BlobStore::recover(&dir.join("blobs"), max_blob_bytes, store)?,
            nodes,
            placer: Mutex::new(Placer::new(rand::random())),
            token,
            drivers: Mutex::new(HashMap::new()),
        });
        for record in manager.table.list() {
            manager.go_on_with(record);
        }
        Ok(manager)
    }

    /// Goes on with a recovered job that had not ended.
    fn go_on_with(self: &Arc<Self>, record: JobRecord) {
        let (Ok(id), Some(spec)) = (JobId::from_wire(&record.job_id), record.spec.clone()) else {
            return;
        };
        let demand = ResourceSet::from_proto(&spec.resources.clone().unwrap_or_default()).unwrap_or_default();
        let node = NodeId::from_wire(&record.node_id).ok();
        let resume = match (record.status(), node) {
            (JobStatus::Pending, None) => Resume::Place,
            (JobStatus::Pending, Some(node_id)) => Resume::Starting(node_id),
            (JobStatus::Running, Some(node_id)) => Resume::Running(node_id),
            _ => return,
        };
        tracing::info!(job = %id, status = ?record.status(), "going on with a job after a restart");
        self.drivers().insert(id, Driver::default());
        tokio::spawn(self.clone().drive(id, spec, demand, resume));
    }

    fn drivers(&self) -> MutexGuard<'_, HashMap<JobId, Driver>> {
        self.drivers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the job and, once its record is on disk, starts placing
    /// its driver: a head restarted at any time after the answer knows the
    /// job, and no driver runs for a job it does not know.
    pub async fn submit(self: &Arc<Self>, id: JobId, spec: JobSpec) -> Result<JobRecord> {
        let demand = self.check_spec(&spec)?;
        let (record, committed) = self.table.create(id, spec.clone(), now_ms())?;
        self.drivers().insert(id, Driver::default());
        if let Err(error) = committed.await {
            self.drivers().remove(&id);
            self.table.forget(id);
            return Err(error.into());
        }
        tokio::spawn(self.clone().drive(id, spec, demand, Resume::Place));
        Ok(record)
    }

    /// Stops the job: a pending one at once (on disk before the answer, so
    /// that a restarted head does not start it), a running one by
    /// signalling its driver (SIGTERM, then SIGKILL after `grace`).
    pub async fn stop(&self, id: JobId, grace: Duration) -> Result<JobRecord> {
        let record = self.table.record(id)?;
        if is_ended(record.status()) {
            return Ok(record);
        }
        let address = {
            let mut drivers = self.drivers();
            let driver = drivers.entry(id).or_default();
            driver.stop_grace = Some(grace);
            driver.address.clone()
        };
        match address {
            Some(address) => {
                let signalled = self.signal_driver(&address, id, grace).await;
                signalled.map_err(|error| JobError::SignalFailed { address, error })?;
            }
            None => {
                self.table.update(id, |record| {
                    record.set_status(JobStatus::Stopped);
                    record.message = STOPPED_BEFORE_START.into();
                    record.ended_unix_ms = now_ms();
                })?;
                self.table.flushed().await?;
            }
        }
        self.table.record(id)
    }

    /// Forgets an ended job, its record and output, once that is on disk.
    pub async fn delete(&self, id: JobId) -> Result<()> {
        let committed = self.table.delete(id)?;
        self.drivers().remove(&id);
        Ok(committed.await?)
    }

    /// Checks the spec; returns what the driver holds.
    fn check_spec(&self, spec: &JobSpec) -> Result<ResourceSet> {
        let binary = spec.binary.as_ref().ok_or(JobError::NoBinary)?;
        check_relative(&spec.binary_name)?;
        if spec.files.len() > MAX_FILES {
            return Err(JobError::TooManyFiles {
                count: spec.files.len(),
                limit: MAX_FILES,
            });
        }
        let mut blobs = vec![binary];
        for file in &spec.files {
            check_relative(&file.path)?;
            let without_blob = || JobError::FileWithoutBlob {
                path: file.path.clone(),
            };
            blobs.push(file.blob.as_ref().ok_or_else(without_blob)?);
        }
        for blob in blobs {
            check_ref(blob)?;
            if self.blobs.path(&blob.sha256).is_none() {
                return Err(JobError::BlobNotUploaded {
                    sha256: blob.sha256.clone(),
                });
            }
        }
        Ok(ResourceSet::from_proto(&spec.resources.clone().unwrap_or_default())?)
    }

    /// Places and runs the driver, or follows the one a node runs, until
    /// the job ends; then records how.
    async fn drive(self: Arc<Self>, id: JobId, spec: JobSpec, demand: ResourceSet, resume: Resume) {
        let ended = match resume {
            Resume::Place => self.run_until_ended(id, &spec, &demand).await,
            Resume::Running(node_id) => self.attach(id, node_id).await,
            Resume::Starting(node_id) => match self.follow_driver_on(id, node_id).await {
                Ok(end) => end,
                Err(reason) => {
                    tracing::info!(job = %id, %reason, "the driver had not started before the restart; placing it anew");
                    self.run_until_ended(id, &spec, &demand).await
                }
            },
        };
        let result = self.table.update(id, |record| {
            record.set_status(ended.status);
            record.message = ended.message;
            if let Some(exit) = ended.exit {
                record.exit_code = exit.exit_code;
                record.signal = exit.signal;
                record.stderr_tail = exit.stderr_tail;
            }
            record.ended_unix_ms = now_ms();
        });
        if let Err(error) = result {
            tracing::warn!(job = %id, %error, "could not record the end of a job");
        }
        self.drivers().remove(&id);
    }

    async fn run_until_ended(&self, id: JobId, spec: &JobSpec, demand: &ResourceSet) -> Ended {
        let mut pending = Backoff::constant(PENDING_RETRY);
        loop {
            if self.stop_grace(id).is_some() {
                self.nodes().set_waiting_driver(id, None);
                return ended(JobStatus::Stopped, STOPPED_BEFORE_START.into(), None);
            }
            let chosen = self.choose_node(demand);
            self.nodes()
                .set_waiting_driver(id, matches!(chosen, Ok(None)).then_some(demand));
            match chosen {
                Err(failure) => return ended(JobStatus::Failed, failure.to_string(), None),
                Ok(None) => {}
                Ok(Some((node_id, address))) => {
                    if let Some(end) = self.run_on(id, spec, node_id, &address).await {
                        return end;
                    }
                }
            }
            pending.wait().await;
        }
    }

    fn nodes(&self) -> MutexGuard<'_, NodeTable> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stop_grace(&self, id: JobId) -> Option<Duration> {
        self.drivers().get(&id).and_then(|driver| driver.stop_grace)
    }

    /// The node for the driver: `None` while no node has room, or while
    /// only a node type the autoscaler may launch fits it.
    fn choose_node(&self, demand: &ResourceSet) -> Result<Option<(NodeId, String)>, DriverFailure> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let mut placer = self.placer.lock().unwrap_or_else(|p| p.into_inner());
        match nodes.choose(&mut placer, demand, &Scheduling::default()) {
            Choice::Run(index) => {
                let node = nodes.placement_view().node(index);
                Ok(Some((node.node_id, node.address.clone())))
            }
            Choice::Queue(_) | Choice::AwaitLaunch(_) => Ok(None),
            Choice::Infeasible(reason) | Choice::Unschedulable(reason) => Err(DriverFailure::NeverPlaceable { reason }),
        }
    }

    /// Runs the driver on one node; `None` when the node had no room. The
    /// node is on disk before it is asked: a head restarted at any time
    /// after follows the driver there, and starts it elsewhere only when
    /// that node never started it.
    async fn run_on(&self, id: JobId, spec: &JobSpec, node_id: NodeId, address: &str) -> Option<Ended> {
        self.drivers().entry(id).or_default().address = Some(address.to_string());
        let lost = |error: String| {
            let message = format!("the node {node_id} running the driver died or became unreachable: {error}");
            Some(ended(JobStatus::Failed, message, None))
        };
        if let Err(error) = self.record_placement(id, Some((node_id, address))).await {
            let message = format!("could not record that the driver starts on node {node_id}: {error}");
            return Some(ended(JobStatus::Failed, message, None));
        }
        let channel = match raylet_proto::channel::connect(address, &self.token, NODE_PATIENCE).await {
            Ok(channel) => channel,
            Err(error) => return lost(error.to_string()),
        };
        let request = RunJobDriverRequest {
            job_id: id.as_bytes().to_vec(),
            spec: Some(spec.clone()),
        };
        let events = match NodeManagerServiceClient::new(channel).run_job_driver(request).await {
            Ok(events) => events.into_inner(),
            Err(status) => return lost(raylet_proto::Error::from(status).to_string()),
        };
        match self.follow(id, node_id, address, events).await {
            Following::Ended(end) => Some(end),
            Following::Busy => {
                self.drivers().entry(id).or_default().address = None;
                if let Err(error) = self.record_placement(id, None).await {
                    tracing::warn!(job = %id, %error, "could not record that the driver waits for a node");
                }
                None
            }
            Following::Broken(reason) => {
                tracing::warn!(job = %id, %reason, "the stream from the driver's node broke; attaching again");
                Some(self.attach(id, node_id).await)
            }
        }
    }

    /// Records the driver's events until it ended or the stream broke.
    async fn follow(
        &self,
        id: JobId,
        node_id: NodeId,
        address: &str,
        mut events: tonic::Streaming<JobDriverEvent>,
    ) -> Following {
        loop {
            let event = match events.message().await {
                Ok(Some(event)) => event.kind,
                Ok(None) => return Following::Broken("its stream ended before the driver exited".into()),
                Err(status) => return Following::Broken(raylet_proto::Error::from(status).to_string()),
            };
            match event {
                Some(DriverEvent::Started(pid)) => self.started(id, node_id, address, pid).await,
                Some(DriverEvent::Output(data)) => {
                    if let Err(error) = self.table.append_output(id, &data) {
                        tracing::warn!(job = %id, %error, "could not keep a job's output");
                    }
                }
                Some(DriverEvent::Exited(exit)) => return Following::Ended(self.exited(id, exit)),
                Some(DriverEvent::Failed(reason)) => {
                    return Following::Ended(ended(JobStatus::Failed, reason, None));
                }
                Some(DriverEvent::Busy(_)) => return Following::Busy,
                None => {}
            }
        }
    }

    /// Where the driver starts (the node and its address), or that it waits
    /// for one; durable when this returns.
    async fn record_placement(&self, id: JobId, node: Option<(NodeId, &str)>) -> Result<()> {
        self.table.update(id, |record| {
            (record.node_id, record.message) = match node {
                Some((node_id, address)) => (
                    node_id.as_bytes().to_vec(),
                    format!("starting on node {node_id} ({address})"),
                ),
                None => (Vec::new(), WAITING_FOR_A_NODE.into()),
            };
        })?;
        Ok(self.table.flushed().await?)
    }

    /// Follows the driver that runs on `node_id` until it ended; the job
    /// failed when its node died or forgot it.
    async fn attach(&self, id: JobId, node_id: NodeId) -> Ended {
        self.follow_driver_on(id, node_id)
            .await
            .unwrap_or_else(|failure| ended(JobStatus::Failed, failure.to_string(), None))
    }

    /// Follows the driver on `node_id` from the output the head has,
    /// attaching again whenever the stream breaks, until it ended; fails
    /// with why when its node died or does not know it.
    async fn follow_driver_on(&self, id: JobId, node_id: NodeId) -> Result<Ended, DriverFailure> {
        let mut pending = Backoff::constant(PENDING_RETRY);
        loop {
            let Some(address) = self.alive_address(node_id) else {
                return Err(DriverFailure::NodeDied { node_id });
            };
            self.drivers().entry(id).or_default().address = Some(address.clone());
            match self.attach_once(id, node_id, &address).await {
                Ok(Following::Ended(end)) => return Ok(end),
                Ok(Following::Busy) => {}
                Ok(Following::Broken(reason)) => tracing::debug!(job = %id, %reason, "attaching again"),
                Err(error) if error.code() == Code::NotFound => {
                    let reason = error.message().to_string();
                    return Err(DriverFailure::DriverLost { node_id, reason });
                }
                Err(error) => tracing::debug!(job = %id, %error, "cannot attach to the driver yet"),
            }
            pending.wait().await;
        }
    }

    /// Follows the driver through one attach call; an error is the node's
    /// or the connection's, or the job's when the head forgot it.
    async fn attach_once(&self, id: JobId, node_id: NodeId, address: &str) -> raylet_proto::Result<Following> {
        let channel = raylet_proto::channel::connect(address, &self.token, NODE_PATIENCE).await?;
        let request = AttachJobDriverRequest {
            job_id: id.as_bytes().to_vec(),
            output_offset: self.table.output_bytes(id)?,
        };
        let events = NodeManagerServiceClient::new(channel)
            .attach_job_driver(request)
            .await?
            .into_inner();
        Ok(self.follow(id, node_id, address, events).await)
    }

    /// The address of the node while it is alive.
    fn alive_address(&self, node_id: NodeId) -> Option<String> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .alive_resources()
            .into_iter()
            .find(|node| node.node_id == node_id)
            .map(|node| node.address)
    }

    async fn started(&self, id: JobId, node_id: NodeId, address: &str, pid: u32) {
        let running = self.table.update(id, |record| {
            record.set_status(JobStatus::Running);
            record.node_id = node_id.as_bytes().to_vec();
            record.message = format!("running on node {node_id} ({address}), pid {pid}");
        });
        if let Err(error) = running {
            tracing::warn!(job = %id, %error, "could not record a job's start");
        }
        if let Some(grace) = self.stop_grace(id) {
            let _ = self.signal_driver(address, id, grace).await;
        }
    }

    fn exited(&self, id: JobId, exit: JobDriverExit) -> Ended {
        let how = match (exit.exit_code, exit.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "an unknown status".into(),
        };
        let (status, message) = match (self.stop_grace(id), exit.exit_code) {
            (Some(_), _) => (
                JobStatus::Stopped,
                format!("stopped on request; the driver ended with {how}"),
            ),
            (None, Some(0)) => (JobStatus::Succeeded, "the driver exited with code 0".into()),
            (None, _) => (JobStatus::Failed, format!("the driver ended with {how}")),
        };
        ended(status, message, Some(exit))
    }

    async fn signal_driver(&self, address: &str, id: JobId, grace: Duration) -> raylet_proto::Result<()> {
        let channel = raylet_proto::channel::connect(address, &self.token, NODE_PATIENCE).await?;
        let request = StopJobDriverRequest {
            job_id: id.as_bytes().to_vec(),
            grace_ms: grace.as_millis() as u64,
        };
        NodeManagerServiceClient::new(channel).stop_job_driver(request).await?;
        Ok(())
    }
}

fn ended(status: JobStatus, message: String, exit: Option<JobDriverExit>) -> Ended {
    Ended { status, message, exit }
}

/// Checks that a shipped path stays inside the job's directory.
fn check_relative(path: &str) -> Result<()> {
    let parsed = Path::new(path);
    let inside = !path.is_empty()
        && path.len() <= 4096
        && parsed
            .components()
            .all(|component| matches!(component, Component::Normal(_)));
    match inside {
        true => Ok(()),
        false => Err(JobError::PathOutside { path: path.to_string() }),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use raylet_proto::blob::blob_of_file;
    use raylet_proto::resources::CPU;
    use raylet_proto::v1::BlobRef;
    use raylet_proto::{Amount, Labels};

    use super::*;
    use crate::state_store::tests::TestDisk;
    use crate::state_store::{StateError, StateStore, Table};
    use crate::wire::Coded;
    use crate::{Heartbeat, Registration};
    use raylet_cluster_status::NodeStats;

    /// A manager with its blobs and output under `dir`, and its nodes.
    fn manager(dir: &Path, store: StateStore) -> (Arc<JobManager>, Arc<Mutex<NodeTable>>) {
        let nodes = Arc::new(Mutex::new(NodeTable::new(Duration::from_secs(5))));
        let manager = JobManager::recover(dir, 1 << 20, nodes.clone(), AuthToken::generate(), store).unwrap();
        (manager, nodes)
    }

    /// Uploads a binary as the upload service does.
    async fn binary(manager: &JobManager, dir: &Path) -> BlobRef {
        let source = dir.join("driver");
        std::fs::write(&source, b"a driver").unwrap();
        let blob = blob_of_file(&source).unwrap();
        let mut writer = manager.blobs.receive(blob.clone()).unwrap().unwrap();
        writer.write(b"a driver").unwrap();
        manager.blobs.keep(writer, &blob.sha256).await.unwrap();
        blob
    }

    fn spec(binary: BlobRef, cpus: u64) -> JobSpec {
        JobSpec {
            binary: Some(binary),
            binary_name: "driver".into(),
            resources: Some(ResourceSet::new().with(CPU, Amount::whole(cpus)).to_proto()),
            ..JobSpec::default()
        }
    }

    /// The job's record as the disk has it.
    fn on_disk(store: &StateStore, id: JobId) -> Option<JobRecord> {
        let records = store.load(Table::Jobs).unwrap();
        let (_, bytes) = records.into_iter().find(|(key, _)| key.as_slice() == id.as_bytes())?;
        Some(JobRecord::decode(bytes.as_slice()).unwrap())
    }

    #[tokio::test]
    async fn a_submission_is_answered_once_its_record_is_on_disk_and_refused_when_the_disk_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (store, disk) = TestDisk::store();
        let (manager, _nodes) = manager(dir.path(), store.clone());
        let binary = binary(&manager, dir.path()).await;
        disk.stall();
        let id = JobId::random();
        let submitting = {
            let (manager, spec) = (manager.clone(), spec(binary.clone(), 0));
            tokio::spawn(async move { manager.submit(id, spec).await })
        };
        disk.until_a_sync_waits().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!submitting.is_finished(), "not answered before the record is on disk");
        disk.resume();
        submitting.await.unwrap().unwrap();
        assert!(on_disk(&store, id).is_some());

        disk.fail();
        let refused_id = JobId::random();
        let refused = manager.submit(refused_id, spec(binary, 0)).await.unwrap_err();
        assert!(
            matches!(&refused, JobError::State(StateError::WriteFailed { .. })),
            "{refused:?}"
        );
        assert!(
            matches!(manager.table.record(refused_id), Err(JobError::UnknownJob { job_id }) if job_id == refused_id),
            "a refused job is not known"
        );
        assert!(
            manager.drivers().get(&refused_id).is_none(),
            "and no driver is started for it"
        );
    }

    /// Adds an alive node of 1 CPU at `address` with `available` CPUs.
    fn add_node(nodes: &Mutex<NodeTable>, address: &str, available: u64) -> NodeId {
        let mut nodes = nodes.lock().unwrap();
        let node_id = NodeId::random();
        let total = ResourceSet::new().with(CPU, Amount::whole(1));
        let registration = Registration {
            node_id,
            address: address.into(),
            hostname: "node".into(),
            is_head_node: false,
            total: total.clone(),
            labels: Labels::new(),
            metrics_address: None,
        };
        let incarnation = nodes.register(registration, std::time::Instant::now());
        let heartbeat = Heartbeat {
            node_id,
            incarnation,
            total,
            available: ResourceSet::new().with(CPU, Amount::whole(available)),
            stats: NodeStats::default(),
            demands: Vec::new(),
        };
        nodes.heartbeat(heartbeat, std::time::Instant::now());
        node_id
    }

    /// Issue 47, item 5: a head killed after it asked a node to start a
    /// driver, and before it heard that the driver started, must not start
    /// it again elsewhere: the node is on disk before the node is asked.
    #[tokio::test]
    async fn the_node_a_driver_starts_on_is_on_disk_before_the_node_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state")).unwrap();
        let (manager, nodes) = manager(dir.path(), store.clone());
        let node_manager = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = node_manager.local_addr().unwrap().to_string();
        let node_id = add_node(&nodes, &address, 1);
        let binary = binary(&manager, dir.path()).await;
        let id = JobId::random();
        manager.submit(id, spec(binary, 1)).await.unwrap();
        let (_asked, _) = node_manager.accept().await.unwrap();
        let stored = on_disk(&store, id).expect("the job is on disk");
        assert_eq!(stored.status(), JobStatus::Pending, "{stored:?}");
        assert_eq!(
            NodeId::from_wire(&stored.node_id).ok(),
            Some(node_id),
            "the node is on disk when it is asked: {stored:?}"
        );
    }

    /// A manager under `dir` with a job that waits for a CPU no node has.
    async fn a_pending_job(dir: &Path, store: StateStore) -> (Arc<JobManager>, JobId) {
        let (manager, nodes) = manager(dir, store);
        add_node(&nodes, "127.0.0.1:1", 0);
        let binary = binary(&manager, dir).await;
        let id = JobId::random();
        manager.submit(id, spec(binary, 1)).await.unwrap();
        (manager, id)
    }

    #[tokio::test]
    async fn a_pending_job_that_is_stopped_is_stopped_on_disk_before_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state")).unwrap();
        let (manager, id) = a_pending_job(dir.path(), store.clone()).await;
        let stopped = manager.stop(id, Duration::from_secs(1)).await.unwrap();
        assert_eq!(stopped.status(), JobStatus::Stopped, "{stopped:?}");
        let stored = on_disk(&store, id).expect("the job is on disk");
        assert_eq!(stored.status(), JobStatus::Stopped, "{stored:?}");
    }

    #[tokio::test]
    async fn only_an_ended_job_is_deleted_and_then_it_is_gone_from_disk_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state")).unwrap();
        let (manager, id) = a_pending_job(dir.path(), store.clone()).await;
        manager.table.append_output(id, b"first words").unwrap();
        let refused = manager.delete(id).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("is PENDING and cannot be deleted until it ends"),
            "{refused}"
        );
        assert_eq!(refused.code(), Code::FailedPrecondition);
        manager.stop(id, Duration::from_secs(1)).await.unwrap();
        manager.delete(id).await.unwrap();
        assert!(on_disk(&store, id).is_none(), "the record is gone from disk");
        assert!(!dir.path().join(id.to_string()).exists(), "and so is the output");
        let unknown = manager.delete(id).await.unwrap_err();
        assert!(matches!(unknown, JobError::UnknownJob { .. }), "{unknown:?}");
    }

    #[test]
    fn shipped_paths_must_stay_inside_the_job_directory() {
        assert!(check_relative("model/weights.bin").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "./a"] {
            assert!(check_relative(bad).is_err(), "{bad}");
        }
    }
}
