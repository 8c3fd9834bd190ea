//! The head's key-value store: namespaced keys with byte values, for small
//! shared state such as the address where a group of workers meets.
//!
//! Every change is on disk in the head's state store before it is answered,
//! so a restarted head has it, even after `kill -9`; a change the store
//! could not write is answered with the error. Reads see only what is on
//! disk: a change becomes visible once the commit that holds it succeeded,
//! before its caller is answered (so a caller reads its own writes). Whether
//! a put adds a key, or a delete removes one, is decided against the latest
//! change queued for it, in the order changes are queued, which is the order
//! they commit in; an answer that rests on a change not yet on disk waits for
//! it. So of several callers racing to put a key that is absent, exactly one
//! adds it, and the answer of each is on disk when it is given.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use prost::Message;
use raylet_proto::v1::kv_service_server::KvService;
use raylet_proto::v1::{
    KvDeleteReply, KvDeleteRequest, KvEntry, KvGetReply, KvGetRequest, KvKeysReply, KvKeysRequest, KvPutReply,
    KvPutRequest,
};
use tonic::{Code, Request, Response, Status};

use super::state_store::{Committed, StateError, StateStore, Table};
use crate::wire::{Coded, on_the_wire};

/// The longest key, in bytes.
const MAX_KEY_BYTES: usize = 4096;
/// The largest value, in bytes: the store is for small state, not data.
const MAX_VALUE_BYTES: usize = 16 << 20;
/// The largest request the service decodes: a largest key and value.
pub(crate) const MAX_REQUEST_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + 4096;

/// What the key-value service answers a refused or failed call with.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("a namespace cannot hold a zero byte")]
    ZeroInNamespace,
    #[error("a key is 1 to {MAX_KEY_BYTES} bytes long, not {len}")]
    KeyLength { len: usize },
    #[error("the value is {len} bytes; the key-value store takes at most {MAX_VALUE_BYTES}")]
    ValueTooLarge { len: usize },
    /// The change could not be written to the head's state.
    #[error(transparent)]
    State(#[from] StateError),
    /// The task that waited for the change's commit ended abruptly.
    #[error("settling a key-value change: {0}")]
    Settling(#[from] tokio::task::JoinError),
}

impl Coded for KvError {
    fn code(&self) -> Code {
        match self {
            KvError::ZeroInNamespace | KvError::KeyLength { .. } | KvError::ValueTooLarge { .. } => {
                Code::InvalidArgument
            }
            KvError::State(_) | KvError::Settling(_) => Code::Internal,
        }
    }
}

on_the_wire!(KvError);

type Result<T, E = KvError> = std::result::Result<T, E>;

/// A namespace and a key.
type Slot = (String, Vec<u8>);

/// A change queued to the state store, not yet known to be on disk: the
/// slot's new value, or `None` for a delete.
struct QueuedChange {
    seq: u64,
    slot: Slot,
    value: Option<Vec<u8>>,
}

/// What an answer waits for: the commit of the changes queued before
/// `upto`, or nothing when it rests on what is on disk already.
#[must_use = "an answer is given once the changes it rests on are on disk"]
pub struct Settle {
    upto: u64,
    committed: Option<Committed>,
}

/// Every entry, in key order within each namespace.
pub struct KvTable {
    /// What reads see: the entries as the last commit left them.
    committed: BTreeMap<Slot, Vec<u8>>,
    /// The changes queued and not yet visible, oldest first. It holds about
    /// one change per write in flight, so a scan of it is short.
    queued: VecDeque<QueuedChange>,
    /// The number the next queued change gets.
    next_seq: u64,
    store: StateStore,
}

impl KvTable {
    /// The entries `store` holds; changes from here on are written to it.
    pub fn recover(store: StateStore) -> Result<Self, StateError> {
        let mut committed = BTreeMap::new();
        for (_, bytes) in store.load(Table::Kv)? {
            let entry = KvEntry::decode(bytes.as_slice()).map_err(StateError::corrupt("a key-value entry"))?;
            committed.insert((entry.namespace, entry.key), entry.value);
        }
        Ok(KvTable {
            committed,
            queued: VecDeque::new(),
            next_seq: 0,
            store,
        })
    }

    /// Sets the key's value unless it exists and `overwrite` is false;
    /// returns whether the key was new, which holds once the answer settled
    /// (see [`KvTable::settled`]).
    pub fn put(&mut self, namespace: &str, key: &[u8], value: Vec<u8>, overwrite: bool) -> Result<(bool, Settle)> {
        check_slot(namespace, key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(KvError::ValueTooLarge { len: value.len() });
        }
        let slot = (namespace.to_string(), key.to_vec());
        let (latest, queued) = self.latest(&slot);
        let added = latest.is_none();
        if !added && !overwrite {
            return Ok((false, self.settle_unchanged(queued)));
        }
        let entry = KvEntry {
            namespace: namespace.to_string(),
            key: key.to_vec(),
            value,
        };
        let committed = self.store.put(Table::Kv, &stored_key(namespace, key), &entry);
        Ok((added, self.queue(slot, Some(entry.value), committed)))
    }

    /// The value on disk.
    pub fn get(&self, namespace: &str, key: &[u8]) -> Option<&[u8]> {
        let slot = (namespace.to_string(), key.to_vec());
        self.committed.get(&slot).map(Vec::as_slice)
    }

    /// Removes the key; returns whether it was there, which holds once the
    /// answer settled.
    pub fn delete(&mut self, namespace: &str, key: &[u8]) -> (bool, Settle) {
        let slot = (namespace.to_string(), key.to_vec());
        let (latest, queued) = self.latest(&slot);
        if latest.is_none() {
            return (false, self.settle_unchanged(queued));
        }
        let committed = self.store.delete(Table::Kv, &stored_key(namespace, key));
        (true, self.queue(slot, None, committed))
    }

    /// The namespace's keys on disk that start with `prefix`, in order.
    pub fn keys(&self, namespace: &str, prefix: &[u8]) -> Vec<Vec<u8>> {
        let start = (namespace.to_string(), prefix.to_vec());
        self.committed
            .range(start..)
            .take_while(|((space, key), _)| space == namespace && key.starts_with(prefix))
            .map(|((_, key), _)| key.clone())
            .collect()
    }

    /// The changes an answer rested on are on disk: they become visible.
    /// The store commits in the order changes were queued and stops at its
    /// first failure, so every change queued before is on disk too.
    pub fn settled(&mut self, upto: u64) {
        while let Some(change) = self.pop_queued_before(upto) {
            match change.value {
                Some(value) => self.committed.insert(change.slot, value),
                None => self.committed.remove(&change.slot),
            };
        }
    }

    /// The changes an answer rested on could not be written: they never
    /// will be, nor any later one, so they are dropped.
    pub fn failed(&mut self, upto: u64) {
        while self.pop_queued_before(upto).is_some() {}
    }

    fn pop_queued_before(&mut self, upto: u64) -> Option<QueuedChange> {
        match self.queued.front() {
            Some(change) if change.seq < upto => self.queued.pop_front(),
            _ => None,
        }
    }

    /// The slot's latest value, queued or on disk, and whether a queued
    /// change set it.
    fn latest(&self, slot: &Slot) -> (Option<&[u8]>, bool) {
        match self.queued.iter().rev().find(|change| &change.slot == slot) {
            Some(change) => (change.value.as_deref(), true),
            None => (self.committed.get(slot).map(Vec::as_slice), false),
        }
    }

    fn queue(&mut self, slot: Slot, value: Option<Vec<u8>>, committed: Committed) -> Settle {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queued.push_back(QueuedChange { seq, slot, value });
        Settle {
            upto: seq + 1,
            committed: Some(committed),
        }
    }

    /// The settling of an answer that changes nothing: it waits for the
    /// changes queued so far when it rests on one of them.
    fn settle_unchanged(&self, rests_on_queued: bool) -> Settle {
        Settle {
            upto: self.next_seq,
            committed: rests_on_queued.then(|| self.store.flush()),
        }
    }
}

fn check_slot(namespace: &str, key: &[u8]) -> Result<()> {
    if namespace.contains('\0') {
        return Err(KvError::ZeroInNamespace);
    }
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(KvError::KeyLength { len: key.len() });
    }
    Ok(())
}

/// The state store's key of an entry: the namespace, a zero byte, the key.
fn stored_key(namespace: &str, key: &[u8]) -> Vec<u8> {
    [namespace.as_bytes(), &[0], key].concat()
}

/// Serves [`KvService`] over a shared [`KvTable`].
pub(crate) struct KvServiceImpl {
    pub(crate) table: Arc<Mutex<KvTable>>,
}

impl KvServiceImpl {
    fn table(&self) -> MutexGuard<'_, KvTable> {
        lock(&self.table)
    }

    /// Waits until the changes the answer rests on are on disk and makes
    /// them visible, or returns why they could not be written. That runs to
    /// its end even when the caller goes away meanwhile.
    async fn settle(&self, settle: Settle) -> Result<()> {
        let Some(committed) = settle.committed else {
            return Ok(());
        };
        let table = self.table.clone();
        let settling = tokio::spawn(async move {
            let result = committed.await;
            match &result {
                Ok(()) => lock(&table).settled(settle.upto),
                Err(_) => lock(&table).failed(settle.upto),
            }
            result
        });
        Ok(settling.await??)
    }
}

fn lock(table: &Mutex<KvTable>) -> MutexGuard<'_, KvTable> {
    table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[tonic::async_trait]
impl KvService for KvServiceImpl {
    async fn kv_put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutReply>, Status> {
        let request = request.into_inner();
        let (added, settle) = self
            .table()
            .put(&request.namespace, &request.key, request.value, request.overwrite)?;
        self.settle(settle).await?;
        Ok(Response::new(KvPutReply { added }))
    }

    async fn kv_get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetReply>, Status> {
        let request = request.into_inner();
        let value = self.table().get(&request.namespace, &request.key).map(<[u8]>::to_vec);
        Ok(Response::new(KvGetReply { value }))
    }

    async fn kv_delete(&self, request: Request<KvDeleteRequest>) -> Result<Response<KvDeleteReply>, Status> {
        let request = request.into_inner();
        let (deleted, settle) = self.table().delete(&request.namespace, &request.key);
        self.settle(settle).await?;
        Ok(Response::new(KvDeleteReply { deleted }))
    }

    async fn kv_keys(&self, request: Request<KvKeysRequest>) -> Result<Response<KvKeysReply>, Status> {
        let request = request.into_inner();
        let keys = self.table().keys(&request.namespace, &request.prefix);
        Ok(Response::new(KvKeysReply { keys }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_store::tests::{TestDisk, reopen};

    fn table() -> KvTable {
        KvTable::recover(StateStore::in_memory_only()).unwrap()
    }

    /// Puts and settles: a store in memory answers at once.
    fn put(kv: &mut KvTable, namespace: &str, key: &[u8], value: &[u8], overwrite: bool) -> bool {
        let (added, settle) = kv.put(namespace, key, value.to_vec(), overwrite).unwrap();
        kv.settled(settle.upto);
        added
    }

    fn delete(kv: &mut KvTable, namespace: &str, key: &[u8]) -> bool {
        let (deleted, settle) = kv.delete(namespace, key);
        kv.settled(settle.upto);
        deleted
    }

    #[test]
    fn a_put_without_overwrite_keeps_the_first_value() {
        let mut kv = table();
        assert!(put(&mut kv, "ns", b"leader", b"a", false));
        assert!(!put(&mut kv, "ns", b"leader", b"b", false));
        assert_eq!(kv.get("ns", b"leader"), Some(&b"a"[..]));
        assert!(!put(&mut kv, "ns", b"leader", b"c", true));
        assert_eq!(kv.get("ns", b"leader"), Some(&b"c"[..]));
    }

    #[test]
    fn namespaces_keep_keys_apart_and_keys_list_by_prefix_in_order() {
        let mut kv = table();
        for key in ["rank/1", "rank/0", "other", "rank/2"] {
            put(&mut kv, "job-a", key.as_bytes(), &[1], true);
        }
        put(&mut kv, "job-b", b"rank/9", &[2], true);
        let keys: Vec<Vec<u8>> = ["rank/0", "rank/1", "rank/2"].map(|k| k.as_bytes().to_vec()).into();
        assert_eq!(kv.keys("job-a", b"rank/"), keys);
        assert_eq!(kv.get("job-b", b"rank/0"), None);
        assert!(delete(&mut kv, "job-a", b"rank/1"));
        assert!(!delete(&mut kv, "job-a", b"rank/1"));
        assert_eq!(kv.keys("job-a", b"rank/").len(), 2);
    }

    #[test]
    fn empty_or_huge_keys_and_huge_values_are_refused_saying_why() {
        let mut kv = table();
        let empty = kv.put("ns", b"", vec![], true).err().unwrap().to_string();
        assert!(empty.contains("1 to 4096 bytes"), "{empty}");
        let huge = kv.put("ns", b"k", vec![0; MAX_VALUE_BYTES + 1], true).err().unwrap();
        assert!(huge.to_string().contains("at most"), "{huge}");
        assert!(matches!(
            kv.put("a\0b", b"k", vec![], true),
            Err(KvError::ZeroInNamespace)
        ));
    }

    #[tokio::test]
    async fn a_reopened_store_has_every_entry_but_the_deleted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let service = KvServiceImpl {
            table: Arc::new(Mutex::new(KvTable::recover(store.clone()).unwrap())),
        };
        put_request(&service, "kept", b"value", true).await.unwrap();
        put_request(&service, "gone", b"x", true).await.unwrap();
        delete_request(&service, "gone").await.unwrap();
        drop((service, store));
        let kv = KvTable::recover(reopen(dir.path()).await).unwrap();
        assert_eq!(kv.get("ns", b"kept"), Some(&b"value"[..]));
        assert_eq!(kv.get("ns", b"gone"), None);
    }

    async fn put_request(service: &KvServiceImpl, key: &str, value: &[u8], overwrite: bool) -> Result<bool, Status> {
        let request = KvPutRequest {
            namespace: "ns".into(),
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            overwrite,
        };
        Ok(service.kv_put(Request::new(request)).await?.into_inner().added)
    }

    async fn delete_request(service: &KvServiceImpl, key: &str) -> Result<bool, Status> {
        let request = KvDeleteRequest {
            namespace: "ns".into(),
            key: key.as_bytes().to_vec(),
        };
        Ok(service.kv_delete(Request::new(request)).await?.into_inner().deleted)
    }

    async fn get_request(service: &KvServiceImpl, key: &str) -> Option<Vec<u8>> {
        let request = KvGetRequest {
            namespace: "ns".into(),
            key: key.as_bytes().to_vec(),
        };
        service.kv_get(Request::new(request)).await.unwrap().into_inner().value
    }

    async fn keys_request(service: &KvServiceImpl) -> Vec<Vec<u8>> {
        let request = KvKeysRequest {
            namespace: "ns".into(),
            prefix: Vec::new(),
        };
        service.kv_keys(Request::new(request)).await.unwrap().into_inner().keys
    }

    fn service_on(store: StateStore) -> Arc<KvServiceImpl> {
        Arc::new(KvServiceImpl {
            table: Arc::new(Mutex::new(KvTable::recover(store).unwrap())),
        })
    }

    #[tokio::test]
    async fn a_put_is_read_only_once_it_is_on_disk_and_then_by_its_caller_too() {
        let (store, disk) = TestDisk::store();
        let service = service_on(store);
        disk.stall();
        let putting = {
            let service = service.clone();
            tokio::spawn(async move { put_request(&service, "leader", b"10.0.0.7", true).await })
        };
        disk.until_a_sync_waits().await;
        assert_eq!(get_request(&service, "leader").await, None, "not on disk, not read");
        assert!(keys_request(&service).await.is_empty());
        assert!(!putting.is_finished(), "not on disk, not answered");
        disk.resume();
        assert!(putting.await.unwrap().unwrap(), "the key was new");
        assert_eq!(get_request(&service, "leader").await.as_deref(), Some(&b"10.0.0.7"[..]));
    }

    #[tokio::test]
    async fn of_puts_racing_for_an_absent_key_exactly_one_adds_it_while_the_disk_is_slow() {
        let (store, disk) = TestDisk::store();
        let service = service_on(store);
        disk.stall();
        let first = {
            let service = service.clone();
            tokio::spawn(async move { put_request(&service, "epoch", b"1", false).await })
        };
        disk.until_a_sync_waits().await;
        let racing: Vec<_> = (2..6)
            .map(|value: u8| {
                let service = service.clone();
                tokio::spawn(async move { put_request(&service, "epoch", &[b'0' + value], false).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            racing.iter().all(|put| !put.is_finished()),
            "an answer that rests on a change not yet on disk waits for it"
        );
        disk.resume();
        assert!(first.await.unwrap().unwrap());
        for put in racing {
            assert!(!put.await.unwrap().unwrap(), "only the first adds it");
        }
        assert_eq!(get_request(&service, "epoch").await.as_deref(), Some(&b"1"[..]));
    }

    #[tokio::test]
    async fn a_write_the_disk_refuses_is_an_error_answer_and_is_never_read() {
        let (store, disk) = TestDisk::store();
        let service = service_on(store);
        put_request(&service, "kept", b"on disk", true).await.unwrap();
        disk.fail();
        let refused = put_request(&service, "lost", b"x", true).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Internal, "{refused}");
        assert!(refused.message().contains("could not be written"), "{refused}");
        assert_eq!(get_request(&service, "lost").await, None);
        let refused = delete_request(&service, "kept").await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Internal, "{refused}");
        assert_eq!(
            get_request(&service, "kept").await.as_deref(),
            Some(&b"on disk"[..]),
            "a delete that failed leaves the value"
        );
        assert_eq!(keys_request(&service).await, [b"kept".to_vec()]);
    }
}
