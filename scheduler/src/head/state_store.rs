//! The head's tables on disk: an embedded redb database in the head's state
//! directory, so that a head started again on the same session recovers the
//! cluster. Changes are written behind the in-memory tables by one thread
//! that commits whatever has queued up in one durable transaction; `flush`
//! waits until every change made so far is on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use raylet_proto::{Error, Result};

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
    Put { table: Table, key: Vec<u8>, value: Vec<u8> },
    Delete { table: Table, key: Vec<u8> },
    Flush(oneshot::Sender<()>),
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
    changes: mpsc::UnboundedSender<Change>,
}

impl StateStore {
    /// Opens (or creates) the database in `dir` and starts its writer.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Internal(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join(STATE_FILE);
        let database = Database::create(&path).map_err(|e| storage_error(&path, e))?;
        let database = Arc::new(database);
        let (changes, queued) = mpsc::unbounded_channel();
        {
            let (database, path) = (database.clone(), path.clone());
            std::thread::Builder::new()
                .name("raylet-head-state".into())
                .spawn(move || write_changes(&database, &path, queued))
                .map_err(|e| Error::Internal(format!("starting the state writer: {e}")))?;
        }
        Ok(StateStore {
            inner: Some(Arc::new(Persisted {
                path,
                database,
                changes,
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

    /// Writes `value` under `key`, behind the caller.
    pub fn put(&self, table: Table, key: &[u8], value: &impl prost::Message) {
        self.send(Change::Put {
            table,
            key: key.to_vec(),
            value: value.encode_to_vec(),
        });
    }

    /// Removes `key`, behind the caller.
    pub fn delete(&self, table: Table, key: &[u8]) {
        self.send(Change::Delete {
            table,
            key: key.to_vec(),
        });
    }

    /// Waits until every change made so far is on disk.
    pub async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        self.send(Change::Flush(done));
        let _ = flushed.await;
    }

    fn send(&self, change: Change) {
        if let Some(inner) = &self.inner {
            let _ = inner.changes.send(change);
        }
    }
}

/// Commits the queued changes in batches until every sender is gone.
fn write_changes(database: &Database, path: &Path, mut queued: mpsc::UnboundedReceiver<Change>) {
    while let Some(first) = queued.blocking_recv() {
        let mut batch = vec![first];
        while let Ok(more) = queued.try_recv() {
            batch.push(more);
        }
        if let Err(error) = commit(database, &mut batch) {
            tracing::error!(path = %path.display(), %error, "cannot write the head's state");
        }
        for change in batch {
            if let Change::Flush(done) = change {
                let _ = done.send(());
            }
        }
    }
}

fn commit(database: &Database, batch: &mut [Change]) -> std::result::Result<(), redb::Error> {
    let transaction = database.begin_write()?;
    for table in Table::ALL {
        let mut records = transaction.open_table(table.definition())?;
        for change in batch.iter() {
            match change {
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

fn storage_error(path: &Path, error: impl std::fmt::Display) -> Error {
    Error::Internal(format!("the head's state in {}: {error}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[tokio::test]
    async fn records_written_behind_are_there_after_a_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            for i in 0..100u32 {
                store.put(Table::Jobs, &i.to_be_bytes(), &format!("job {i}"));
            }
            store.put(Table::Nodes, b"node", &"alive".to_string());
            store.delete(Table::Jobs, &7u32.to_be_bytes());
            store.flush().await;
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

    #[test]
    fn a_store_in_memory_only_keeps_nothing() {
        let store = StateStore::in_memory_only();
        store.put(Table::Jobs, b"job", &"x".to_string());
        assert!(store.load(Table::Jobs).unwrap().is_empty());
    }
}
