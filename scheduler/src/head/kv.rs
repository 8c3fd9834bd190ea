//! The head's key-value store: namespaced keys with byte values, for small
//! shared state such as the address where a group of workers meets. Every
//! change is on disk in the head's state store before it is answered, so a
//! restarted head has it, even after `kill -9`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use prost::Message;
use raylet_proto::v1::kv_service_server::KvService;
use raylet_proto::v1::{
    KvDeleteReply, KvDeleteRequest, KvEntry, KvGetReply, KvGetRequest, KvKeysReply, KvKeysRequest, KvPutReply,
    KvPutRequest,
};
use raylet_proto::{Error, Result};
use tonic::{Request, Response, Status};

use super::state_store::{StateStore, Table};

/// The longest key, in bytes.
const MAX_KEY_BYTES: usize = 4096;
/// The largest value, in bytes: the store is for small state, not data.
const MAX_VALUE_BYTES: usize = 16 << 20;
/// The largest request the service decodes: a largest key and value.
pub(crate) const MAX_REQUEST_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + 4096;

/// A namespace and a key.
type Slot = (String, Vec<u8>);

/// Every entry, in key order within each namespace.
pub struct KvTable {
    entries: BTreeMap<Slot, Vec<u8>>,
    store: StateStore,
}

impl KvTable {
    /// The entries `store` holds; changes from here on are written to it.
    pub fn recover(store: StateStore) -> Result<Self> {
        let mut entries = BTreeMap::new();
        for (_, bytes) in store.load(Table::Kv)? {
            let entry = KvEntry::decode(bytes.as_slice())
                .map_err(|e| Error::Internal(format!("a stored key-value entry is corrupt: {e}")))?;
            entries.insert((entry.namespace, entry.key), entry.value);
        }
        Ok(KvTable { entries, store })
    }

    /// Sets the key's value unless it exists and `overwrite` is false;
    /// returns whether the key was new.
    pub fn put(&mut self, namespace: &str, key: &[u8], value: Vec<u8>, overwrite: bool) -> Result<bool> {
        check_slot(namespace, key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "the value is {} bytes; the key-value store takes at most {MAX_VALUE_BYTES}",
                value.len()
            )));
        }
        let slot = (namespace.to_string(), key.to_vec());
        let added = !self.entries.contains_key(&slot);
        if added || overwrite {
            let entry = KvEntry {
                namespace: namespace.to_string(),
                key: key.to_vec(),
                value,
            };
            self.store.put(Table::Kv, &stored_key(namespace, key), &entry);
            self.entries.insert(slot, entry.value);
        }
        Ok(added)
    }

    pub fn get(&self, namespace: &str, key: &[u8]) -> Option<&[u8]> {
        let slot = (namespace.to_string(), key.to_vec());
        self.entries.get(&slot).map(Vec::as_slice)
    }

    /// Removes the key; returns whether it was there.
    pub fn delete(&mut self, namespace: &str, key: &[u8]) -> bool {
        let removed = self.entries.remove(&(namespace.to_string(), key.to_vec())).is_some();
        if removed {
            self.store.delete(Table::Kv, &stored_key(namespace, key));
        }
        removed
    }

    /// The namespace's keys that start with `prefix`, in order.
    pub fn keys(&self, namespace: &str, prefix: &[u8]) -> Vec<Vec<u8>> {
        let start = (namespace.to_string(), prefix.to_vec());
        self.entries
            .range(start..)
            .take_while(|((space, key), _)| space == namespace && key.starts_with(prefix))
            .map(|((_, key), _)| key.clone())
            .collect()
    }
}

fn check_slot(namespace: &str, key: &[u8]) -> Result<()> {
    if namespace.contains('\0') {
        return Err(Error::InvalidArgument("a namespace cannot hold a zero byte".into()));
    }
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "a key is 1 to {MAX_KEY_BYTES} bytes long, not {}",
            key.len()
        )));
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
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the table's changes so far are on disk.
    async fn flush(&self) {
        let store = self.table().store.clone();
        store.flush().await;
    }
}

#[tonic::async_trait]
impl KvService for KvServiceImpl {
    async fn kv_put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutReply>, Status> {
        let request = request.into_inner();
        let added = self
            .table()
            .put(&request.namespace, &request.key, request.value, request.overwrite)?;
        self.flush().await;
        Ok(Response::new(KvPutReply { added }))
    }

    async fn kv_get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetReply>, Status> {
        let request = request.into_inner();
        let value = self.table().get(&request.namespace, &request.key).map(<[u8]>::to_vec);
        Ok(Response::new(KvGetReply { value }))
    }

    async fn kv_delete(&self, request: Request<KvDeleteRequest>) -> Result<Response<KvDeleteReply>, Status> {
        let request = request.into_inner();
        let deleted = self.table().delete(&request.namespace, &request.key);
        self.flush().await;
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
    use crate::head::state_store::tests::reopen;

    fn table() -> KvTable {
        KvTable::recover(StateStore::in_memory_only()).unwrap()
    }

    #[test]
    fn a_put_without_overwrite_keeps_the_first_value() {
        let mut kv = table();
        assert!(kv.put("ns", b"leader", b"a".to_vec(), false).unwrap());
        assert!(!kv.put("ns", b"leader", b"b".to_vec(), false).unwrap());
        assert_eq!(kv.get("ns", b"leader"), Some(&b"a"[..]));
        assert!(!kv.put("ns", b"leader", b"c".to_vec(), true).unwrap());
        assert_eq!(kv.get("ns", b"leader"), Some(&b"c"[..]));
    }

    #[test]
    fn namespaces_keep_keys_apart_and_keys_list_by_prefix_in_order() {
        let mut kv = table();
        for key in ["rank/1", "rank/0", "other", "rank/2"] {
            kv.put("job-a", key.as_bytes(), vec![1], true).unwrap();
        }
        kv.put("job-b", b"rank/9", vec![2], true).unwrap();
        let keys: Vec<Vec<u8>> = ["rank/0", "rank/1", "rank/2"].map(|k| k.as_bytes().to_vec()).into();
        assert_eq!(kv.keys("job-a", b"rank/"), keys);
        assert_eq!(kv.get("job-b", b"rank/0"), None);
        assert!(kv.delete("job-a", b"rank/1"));
        assert!(!kv.delete("job-a", b"rank/1"));
        assert_eq!(kv.keys("job-a", b"rank/").len(), 2);
    }

    #[test]
    fn empty_or_huge_keys_and_huge_values_are_refused_saying_why() {
        let mut kv = table();
        let empty = kv.put("ns", b"", vec![], true).unwrap_err().to_string();
        assert!(empty.contains("1 to 4096 bytes"), "{empty}");
        let huge = kv.put("ns", b"k", vec![0; MAX_VALUE_BYTES + 1], true).unwrap_err();
        assert!(huge.to_string().contains("at most"), "{huge}");
        assert!(kv.put("a\0b", b"k", vec![], true).is_err());
    }

    #[tokio::test]
    async fn a_reopened_store_has_every_entry_but_the_deleted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let mut kv = KvTable::recover(store.clone()).unwrap();
        kv.put("ns", b"kept", b"value".to_vec(), true).unwrap();
        kv.put("ns", b"gone", b"x".to_vec(), true).unwrap();
        kv.delete("ns", b"gone");
        store.flush().await;
        drop((kv, store));
        let kv = KvTable::recover(reopen(dir.path()).await).unwrap();
        assert_eq!(kv.get("ns", b"kept"), Some(&b"value"[..]));
        assert_eq!(kv.get("ns", b"gone"), None);
    }
}
