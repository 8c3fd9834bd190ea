//! The head's job records and their output. Each record lives in memory
//! behind a watch channel and in the head's state store, written at every
//! change; the driver's output is appended to `<dir>/<job id>/output.log`,
//! so both outlast the job and a restart of the head.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use prost::Message;
use raylet_proto::JobId;
use raylet_proto::v1::{JobRecord, JobSpec, JobStatus};
use tokio::sync::watch;

use super::error::JobError;
use crate::state_store::{Committed, StateError, StateStore, Table};

type Result<T, E = JobError> = std::result::Result<T, E>;

/// What a pending job waits for, until a node takes its driver.
pub const WAITING_FOR_A_NODE: &str = "waiting for a node to run the driver";

/// One job: its record and how much output it has.
struct JobEntry {
    record: watch::Sender<JobRecord>,
    output_bytes: watch::Sender<u64>,
    /// The output file, open for appending once output came.
    output: Option<std::fs::File>,
}

/// Every job the head knows, ended ones included.
pub struct JobTable {
    dir: PathBuf,
    jobs: Mutex<BTreeMap<JobId, JobEntry>>,
    store: StateStore,
}

impl JobTable {
    /// The jobs `store` holds, with their output under `dir`.
    pub fn recover(dir: &Path, store: StateStore) -> Result<Self, StateError> {
        let mut jobs = BTreeMap::new();
        for (key, bytes) in store.load(Table::Jobs)? {
            let id = JobId::from_wire(&key).map_err(StateError::corrupt(format!("job key {key:02x?}")))?;
            let record =
                JobRecord::decode(bytes.as_slice()).map_err(StateError::corrupt(format!("the record of job {id}")))?;
            let output = std::fs::metadata(output_path(dir, id)).map_or(0, |m| m.len());
            let entry = JobEntry {
                record: watch::channel(record).0,
                output_bytes: watch::channel(output).0,
                output: None,
            };
            jobs.insert(id, entry);
        }
        Ok(JobTable {
            dir: dir.to_path_buf(),
            jobs: Mutex::new(jobs),
            store,
        })
    }

    fn jobs(&self) -> MutexGuard<'_, BTreeMap<JobId, JobEntry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn job_dir(&self, id: JobId) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// Registers a pending job; its record is on disk once the returned
    /// commit resolves.
    pub fn create(&self, id: JobId, spec: JobSpec, now_ms: u64) -> Result<(JobRecord, Committed)> {
        let mut jobs = self.jobs();
        if jobs.contains_key(&id) {
            return Err(JobError::Exists { job_id: id });
        }
        let dir = self.job_dir(id);
        std::fs::create_dir_all(&dir).map_err(JobError::io("creating", &dir))?;
        let record = JobRecord {
            job_id: id.as_bytes().to_vec(),
            spec: Some(spec),
            status: JobStatus::Pending as i32,
            message: WAITING_FOR_A_NODE.into(),
            submitted_unix_ms: now_ms,
            ..JobRecord::default()
        };
        let committed = self.store.put(Table::Jobs, id.as_bytes(), &record);
        let entry = JobEntry {
            record: watch::channel(record.clone()).0,
            output_bytes: watch::channel(0).0,
            output: None,
        };
        jobs.insert(id, entry);
        Ok((record, committed))
    }

    /// Forgets a job whose record could not be written: it was never
    /// accepted.
    pub fn forget(&self, id: JobId) {
        self.jobs().remove(&id);
    }

    /// Forgets an ended job and removes its output; its record is gone from
    /// disk once the returned commit resolves. Followers of the job see
    /// their streams end.
    pub fn delete(&self, id: JobId) -> Result<Committed> {
        let mut jobs = self.jobs();
        let entry = jobs.get(&id).ok_or_else(|| unknown(id))?;
        let status = entry.record.borrow().status();
        if !is_ended(status) {
            return Err(JobError::NotEnded {
                job_id: id,
                status: status.as_str_name().trim_start_matches("JOB_STATUS_"),
            });
        }
        jobs.remove(&id);
        drop(jobs);
        let dir = self.job_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!("removing the output of deleted job {id} at {}: {error}", dir.display());
            }
            _ => {}
        }
        Ok(self.store.delete(Table::Jobs, id.as_bytes()))
    }

    /// Resolves once every change so far is on disk.
    pub fn flushed(&self) -> Committed {
        self.store.flush()
    }

    pub fn record(&self, id: JobId) -> Result<JobRecord> {
        let jobs = self.jobs();
        let entry = jobs.get(&id).ok_or_else(|| unknown(id))?;
        Ok(entry.record.borrow().clone())
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<JobRecord> {
        let mut records: Vec<JobRecord> = self.jobs().values().map(|e| e.record.borrow().clone()).collect();
        records.sort_by_key(|r| r.submitted_unix_ms);
        records
    }

    /// Changes the record, unless it has ended, and writes it to disk.
    /// Returns the record as it is after.
    /// The output file closes once the job ended.
    pub fn update(&self, id: JobId, change: impl FnOnce(&mut JobRecord)) -> Result<JobRecord> {
        let mut jobs = self.jobs();
        let entry = jobs.get_mut(&id).ok_or_else(|| unknown(id))?;
        let mut record = entry.record.borrow().clone();
        if is_ended(record.status()) {
            return Ok(record);
        }
        change(&mut record);
        record.log_bytes = *entry.output_bytes.borrow();
        if is_ended(record.status()) {
            entry.output = None;
        }
        self.store.put(Table::Jobs, id.as_bytes(), &record);
        entry.record.send_replace(record.clone());
        Ok(record)
    }

    /// Follows the job's record.
    pub fn watch(&self, id: JobId) -> Result<watch::Receiver<JobRecord>> {
        let jobs = self.jobs();
        Ok(jobs.get(&id).ok_or_else(|| unknown(id))?.record.subscribe())
    }

    /// How many bytes of output the job has.
    pub fn output_bytes(&self, id: JobId) -> Result<u64> {
        let jobs = self.jobs();
        Ok(*jobs.get(&id).ok_or_else(|| unknown(id))?.output_bytes.borrow())
    }

    /// Follows how many bytes of output the job has.
    pub fn watch_output(&self, id: JobId) -> Result<watch::Receiver<u64>> {
        let jobs = self.jobs();
        Ok(jobs.get(&id).ok_or_else(|| unknown(id))?.output_bytes.subscribe())
    }

    /// Appends the driver's output.
    pub fn append_output(&self, id: JobId, data: &[u8]) -> Result<()> {
        let mut jobs = self.jobs();
        let entry = jobs.get_mut(&id).ok_or_else(|| unknown(id))?;
        let path = output_path(&self.dir, id);
        let file = match &mut entry.output {
            Some(file) => file,
            None => entry.output.insert(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(JobError::io("opening", &path))?,
            ),
        };
        file.write_all(data).map_err(JobError::io("writing", &path))?;
        entry.output_bytes.send_modify(|bytes| *bytes += data.len() as u64);
        Ok(())
    }

    /// Up to `max` bytes of the job's output from `offset`.
    pub fn read_output(&self, id: JobId, offset: u64, max: usize) -> Result<Vec<u8>> {
        self.record(id)?;
        let path = output_path(&self.dir, id);
        let Ok(mut file) = std::fs::File::open(&path) else {
            return Ok(Vec::new());
        };
        file.seek(SeekFrom::Start(offset))
            .map_err(JobError::io("reading", &path))?;
        let mut data = Vec::new();
        file.take(max as u64)
            .read_to_end(&mut data)
            .map_err(JobError::io("reading", &path))?;
        Ok(data)
    }
}

/// Whether a job in `status` has ended for good.
pub fn is_ended(status: JobStatus) -> bool {
    matches!(status, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Stopped)
}

fn output_path(dir: &Path, id: JobId) -> PathBuf {
    dir.join(id.to_string()).join("output.log")
}

fn unknown(id: JobId) -> JobError {
    JobError::UnknownJob { job_id: id }
}
