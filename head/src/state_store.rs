//! The head's tables on disk: an embedded redb database in the head's state
//! directory, so that a head started again on the same session recovers the
//! cluster.
//!
//! One thread writes, with group commit. Every change is queued with a
//! oneshot; the writer takes every change that has queued up, commits them
//! in one durable transaction (one fsync for all the writers that came
//! meanwhile), then completes each change's oneshot with that commit's
//! result. A change's [`Committed`] is that answer: a handler awaits it
//! before it answers its client, so every acknowledged write is on disk, and
//! a write that could not be made is answered with the error.
//!
//! A failed commit stops the writer for good (fail-stop): that batch's
//! changes and every later one are answered with the error, and nothing
//! more is written until the head is restarted, which then comes back from
//! the last commit that succeeded. After a failed write or fsync, what the
//! disk holds is not known (redb itself refuses every later operation with
//! `PreviousIo`), and the in-memory tables hold changes that never reached
//! the disk: committing later changes on top would store a state that never
//! was. It is also what makes [`StateStore::flush`] mean something: it
//! succeeds only when every change queued before it is on disk.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

/// Why the head's state could not be read or written. Every variant
/// travels as an internal error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StateError {
    #[error("creating {}: {source}", .dir.display())]
    CreateDir { dir: PathBuf, source: Arc<std::io::Error> },
    /// The database could not be opened or read.
    #[error("the head's state in {}: {reason}", .path.display())]
    Storage { path: PathBuf, reason: String },
    #[error("starting the state writer: {0}")]
    StartWriter(Arc<std::io::Error>),
    #[error("the head's state writer stopped")]
    WriterStopped,
    /// A commit failed: the writer takes no more changes (fail-stop).
    #[error(
        "the head's state in {} could not be written ({reason}); the head takes no more changes until it is \
         restarted, and a restart with --recover comes back from the last change written",
        .path.display()
    )]
    WriteFailed { path: PathBuf, reason: String },
    /// A stored record does not decode: `record` says which.
    #[error("{record} in the head's state store is corrupt: {reason}")]
    Corrupt { record: String, reason: String },
}

impl StateError {
    /// The error for the stored `record` that does not decode.
    pub fn corrupt<E: std::fmt::Display>(record: impl Into<String>) -> impl FnOnce(E) -> StateError {
        let record = record.into();
        move |reason| StateError::Corrupt {
            record,
            reason: reason.to_string(),
        }
    }
}

impl crate::wire::Coded for StateError {
    fn code(&self) -> tonic::Code {
        tonic::Code::Internal
    }
}

crate::wire::on_the_wire!(StateError);

type Result<T, E = StateError> = std::result::Result<T, E>;

/// The file in the head's state directory.
pub const STATE_FILE: &str = "head.redb";

/// The head's persisted tables, each from an id's bytes to a protobuf record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Node incarnations, by node id: the latest one of each node.
    Nodes,
    /// Job records, by job id.
    Jobs,
    /// Build hashes of job binaries to the sha256 of their blob.
    Binaries,
    /// The key-value store's entries, by namespace, a zero byte and key.
    Kv,
    /// Actors, their specs and where they run, by actor id.
    Actors,
    /// Placement groups and where their bundles are, by group id.
    PlacementGroups,
}

impl Table {
    const ALL: [Table; 6] = [
        Table::Nodes,
        Table::Jobs,
        Table::Binaries,
        Table::Kv,
        Table::Actors,
        Table::PlacementGroups,
    ];

    fn definition(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(match self {
            Table::Nodes => "nodes",
            Table::Jobs => "jobs",
            Table::Binaries => "binaries",
            Table::Kv => "kv",
            Table::Actors => "actors",
            Table::PlacementGroups => "placement_groups",
        })
    }
}

enum Change {
    Put {
        table: Table,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        table: Table,
        key: Vec<u8>,
    },
    /// Changes nothing: answered once every change queued before it is.
    Barrier,
}

/// A change on its way to the writer, and where its commit is answered.
struct Queued {
    change: Change,
    committed: oneshot::Sender<Result<()>>,
}

/// Resolves once the transaction that holds a change is committed, with
/// that commit's result. Dropping it leaves the change to be written all
/// the same.
pub struct Committed(Option<oneshot::Receiver<Result<()>>>);

impl Future for Committed {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let Some(answer) = self.0.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        Pin::new(answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(StateError::WriterStopped)))
    }
}

/// Where the head writes its tables; a store made with
/// [`StateStore::in_memory_only`] (the default) keeps nothing.
#[derive(Clone, Default)]
pub struct StateStore {
    inner: Option<Arc<Persisted>>,
}

struct Persisted {
    path: PathBuf,
    database: Arc<Database>,
    /// Unbounded, since changes are queued by callers that hold a table's
    /// lock and cannot wait for room. What bounds it: each acknowledged
    /// change's caller waits for its commit, and the others (node deaths,
    /// actor and job states) come as fast as the cluster changes.
    changes: mpsc::UnboundedSender<Queued>,
    /// How many transactions the writer committed.
    #[cfg(test)]
    commits: Arc<AtomicU64>,
}

impl StateStore {
    /// Opens (or creates) the database in `dir` and starts its writer.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| StateError::CreateDir {
            dir: dir.to_path_buf(),
            source: Arc::new(source),
        })?;
        let path = dir.join(STATE_FILE);
        let database = Database::create(&path).map_err(|e| storage_error(&path, e))?;
        Self::start(database, path)
    }

    /// A store on `backend` instead of a file, as tests make their disks
    /// fail or stall.
    #[cfg(test)]
    pub(crate) fn on_backend(backend: impl redb::StorageBackend) -> Result<Self> {
        let path = PathBuf::from("(test backend)");
        let database = redb::Builder::new()
            .create_with_backend(backend)
            .map_err(|e| storage_error(&path, e))?;
        Self::start(database, path)
    }

    fn start(database: Database, path: PathBuf) -> Result<Self> {
        let database = Arc::new(database);
        let (changes, queued) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        {
            let (database, path, commits) = (database.clone(), path.clone(), commits.clone());
            std::thread::Builder::new()
                .name("raylet-head-state".into())
                .spawn(move || write_changes(&database, &path, queued, &commits))
                .map_err(|e| StateError::StartWriter(Arc::new(e)))?;
        }
        Ok(StateStore {
            inner: Some(Arc::new(Persisted {
                path,
                database,
                changes,
                #[cfg(test)]
                commits,
            })),
        })
    }

    /// A store that keeps nothing, for a head that cannot be restarted
    /// (the embedded one lives and dies with its program).
    pub fn in_memory_only() -> Self {
        StateStore { inner: None }
    }

    /// Every record of `table`, in key order.
    pub fn load(&self, table: Table) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let Some(inner) = &self.inner else {
            return Ok(Vec::new());
        };
        let error = |e: &dyn std::fmt::Display| storage_error(&inner.path, e);
        let read = inner.database.begin_read().map_err(|e| error(&e))?;
        let records = match read.open_table(table.definition()) {
            Ok(records) => records,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(error(&e)),
        };
        let rows = records.iter().map_err(|e| error(&e))?;
        rows.map(|row| {
            let (key, value) = row.map_err(|e| error(&e))?;
            Ok((key.value().to_vec(), value.value().to_vec()))
        })
        .collect()
    }

    /// Writes `value` under `key`, behind the caller; the answer says when
    /// it is on disk.
    pub fn put(&self, table: Table, key: &[u8], value: &impl prost::Message) -> Committed {
        self.send(Change::Put {
            table,
            key: key.to_vec(),
            value: value.encode_to_vec(),
        })
    }

    /// Removes `key`, behind the caller; the answer says when that is on
    /// disk.
    pub fn delete(&self, table: Table, key: &[u8]) -> Committed {
        self.send(Change::Delete {
            table,
            key: key.to_vec(),
        })
    }

    /// Resolves once every change queued so far is on disk, or with the
    /// error that kept one of them (or an earlier one) off it.
    pub fn flush(&self) -> Committed {
        self.send(Change::Barrier)
    }

    fn send(&self, change: Change) -> Committed {
        let Some(inner) = &self.inner else {
            return Committed(None);
        };
        let (committed, answer) = oneshot::channel();
        // A writer that is gone drops the change and its sender: the answer
        // says so.
        let _ = inner.changes.send(Queued { change, committed });
        Committed(Some(answer))
    }

    /// How many transactions the writer committed so far.
    #[cfg(test)]
    pub(crate) fn commits(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |inner| inner.commits.load(Ordering::SeqCst))
    }
}

/// Commits the queued changes in batches until every sender is gone; after
/// a failed commit, answers every change with its error and writes nothing.
fn write_changes(database: &Database, path: &Path, mut queued: mpsc::UnboundedReceiver<Queued>, commits: &AtomicU64) {
    let mut stopped: Option<StateError> = None;
    while let Some(first) = queued.blocking_recv() {
        let mut batch = vec![first];
        while let Ok(more) = queued.try_recv() {
            batch.push(more);
        }
        let only_barriers = batch.iter().all(|queued| matches!(queued.change, Change::Barrier));
        let result = match (&stopped, only_barriers) {
            (Some(error), _) => Err(error.clone()),
            (None, true) => Ok(()),
            (None, false) => commit(database, &batch).map_err(|error| StateError::WriteFailed {
                path: path.to_path_buf(),
                reason: error.to_string(),
            }),
        };
        match &result {
            Ok(()) if !only_barriers => {
                commits.fetch_add(1, Ordering::SeqCst);
            }
            Err(error) if stopped.is_none() => {
                tracing::error!(%error, "cannot write the head's state");
                stopped = Some(error.clone());
            }
            _ => {}
        }
        for queued in batch {
            let _ = queued.committed.send(result.clone());
        }
    }
}

fn commit(database: &Database, batch: &[Queued]) -> std::result::Result<(), redb::Error> {
    let transaction = database.begin_write()?;
    for table in Table::ALL {
        let mut records = transaction.open_table(table.definition())?;
        for queued in batch {
            match &queued.change {
                Change::Put { table: t, key, value } if *t == table => {
                    records.insert(key.as_slice(), value.as_slice())?;
                }
                Change::Delete { table: t, key } if *t == table => {
                    records.remove(key.as_slice())?;
                }
                _ => {}
            }
        }
    }
    transaction.commit()?;
    Ok(())
}

fn storage_error(path: &Path, error: impl std::fmt::Display) -> StateError {
    StateError::Storage {
        path: path.to_path_buf(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Condvar, Mutex};

    use redb::backends::InMemoryBackend;

    use super::*;

    #[tokio::test]
    async fn records_written_behind_are_there_after_a_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            for i in 0..100u32 {
                drop(store.put(Table::Jobs, &i.to_be_bytes(), &format!("job {i}")));
            }
            drop(store.put(Table::Nodes, b"node", &"alive".to_string()));
            store.delete(Table::Jobs, &7u32.to_be_bytes()).await.unwrap();
            store.flush().await.unwrap();
        }
        let store = reopen(dir.path()).await;
        let jobs = store.load(Table::Jobs).unwrap();
        assert_eq!(jobs.len(), 99);
        let first = <String as prost::Message>::decode(jobs[0].1.as_slice()).unwrap();
        assert_eq!(first, "job 0");
        assert!(jobs.iter().all(|(key, _)| key.as_slice() != 7u32.to_be_bytes()));
        assert_eq!(store.load(Table::Nodes).unwrap().len(), 1);
        assert!(store.load(Table::Binaries).unwrap().is_empty());
    }

    /// Opens the store once the writer of the last one let go of it.
    pub(crate) async fn reopen(dir: &Path) -> StateStore {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match StateStore::open(dir) {
                Ok(store) => return store,
                Err(error) => assert!(tokio::time::Instant::now() < deadline, "{error}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_store_in_memory_only_keeps_nothing_and_answers_at_once() {
        let store = StateStore::in_memory_only();
        store.put(Table::Jobs, b"job", &"x".to_string()).await.unwrap();
        store.flush().await.unwrap();
        assert!(store.load(Table::Jobs).unwrap().is_empty());
    }

    /// A disk in memory that a test makes fail or stall.
    #[derive(Debug, Default)]
    pub(crate) struct TestDisk {
        data: InMemoryBackend,
        control: Arc<DiskControl>,
    }

    /// What a [`TestDisk`] does.
    #[derive(Debug, Default)]
    pub(crate) struct DiskControl {
        /// Every write and sync fails with an I/O error.
        failing: AtomicBool,
        /// Syncs wait while this is true.
        stalled: Mutex<bool>,
        unstalled: Condvar,
        /// How many syncs wait now.
        waiting: AtomicU64,
    }

    impl DiskControl {
        pub(crate) fn fail(&self) {
            self.failing.store(true, Ordering::SeqCst);
        }

        pub(crate) fn stall(&self) {
            *self.stalled.lock().unwrap() = true;
        }

        pub(crate) fn resume(&self) {
            *self.stalled.lock().unwrap() = false;
            self.unstalled.notify_all();
        }

        /// Waits until a commit is held at its sync.
        pub(crate) async fn until_a_sync_waits(&self) {
            while self.waiting.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }

        fn check(&self) -> std::io::Result<()> {
            match self.failing.load(Ordering::SeqCst) {
                true => Err(std::io::Error::other("the test disk fails")),
                false => Ok(()),
            }
        }
    }

    impl TestDisk {
        /// A store on a new test disk, and the disk's control.
        pub(crate) fn store() -> (StateStore, Arc<DiskControl>) {
            let disk = TestDisk::default();
            let control = disk.control.clone();
            (StateStore::on_backend(disk).unwrap(), control)
        }
    }

    impl redb::StorageBackend for TestDisk {
        fn len(&self) -> std::io::Result<u64> {
            self.data.len()
        }

        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.data.read(offset, out)
        }

        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.control.check()?;
            self.data.set_len(len)
        }

        fn sync_data(&self) -> std::io::Result<()> {
            let control = &self.control;
            control.waiting.fetch_add(1, Ordering::SeqCst);
            let mut stalled = control.stalled.lock().unwrap();
            while *stalled {
                stalled = control.unstalled.wait(stalled).unwrap();
            }
            drop(stalled);
            control.waiting.fetch_sub(1, Ordering::SeqCst);
            control.check()?;
            self.data.sync_data()
        }

        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.control.check()?;
            self.data.write(offset, data)
        }
    }

    #[tokio::test]
    async fn changes_that_queue_up_while_a_commit_runs_share_the_next_one() {
        let (store, disk) = TestDisk::store();
        disk.stall();
        let first = store.put(Table::Kv, b"first", &"1".to_string());
        disk.until_a_sync_waits().await;
        let queued: Vec<Committed> = (0..50u32)
            .map(|i| store.put(Table::Kv, &i.to_be_bytes(), &format!("value {i}")))
            .collect();
        disk.resume();
        first.await.unwrap();
        for committed in queued {
            committed.await.unwrap();
        }
        assert_eq!(store.commits(), 2, "the 50 changes that queued up went in one commit");
        assert_eq!(store.load(Table::Kv).unwrap().len(), 51);
    }

    #[tokio::test]
    async fn a_failed_commit_is_the_answer_of_its_changes_and_of_every_later_one() {
        let (store, disk) = TestDisk::store();
        store.put(Table::Jobs, b"before", &"kept".to_string()).await.unwrap();
        disk.fail();
        let failed = store.put(Table::Jobs, b"lost", &"x".to_string()).await.unwrap_err();
        assert!(matches!(failed, StateError::WriteFailed { .. }), "{failed:?}");
        let failed = failed.to_string();
        assert!(
            failed.contains("could not be written") && failed.contains("the test disk fails"),
            "{failed}"
        );
        let flushed = store.flush().await.unwrap_err();
        assert_eq!(flushed.to_string(), failed, "a flush after it fails too");
        let after = store.delete(Table::Jobs, b"before").await.unwrap_err();
        assert_eq!(after.to_string(), failed, "the store stopped at the first failure");
    }
}
