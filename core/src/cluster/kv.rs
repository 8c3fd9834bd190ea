//! The cluster's key-value store from the user's side: small shared state
//! (a rendezvous address, a flag) kept by the head across its restarts, in
//! this program's namespace. Calls wait out a restart of the head.

use std::future::Future;

use raylet_proto::channel::AuthedChannel;
use raylet_proto::v1::kv_service_client::KvServiceClient;
use raylet_proto::v1::{KvDeleteRequest, KvGetRequest, KvKeysRequest, KvPutRequest};

use raylet_common::auth::AuthToken;
use serde::Serialize;

use crate::core_worker::CoreWorker;
use crate::links::head_retry::retrying;
use crate::{Cluster, Error, Result};

/// The head's key-value namespace of what programs publish for the dashboard.
const DASHBOARD_NAMESPACE: &str = "_raylet_dashboard";
/// How long the dashboard waits to reach the head.
const DASHBOARD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

impl Cluster {
    /// Sets `key` to `value` (at most 16 MiB).
    pub fn kv_put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        self.own_kv().put(key, value)
    }

    /// Sets `key` to `value` unless the key has a value already; returns
    /// whether it was set. Of several callers racing, exactly one wins.
    pub fn kv_put_if_absent(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<bool> {
        self.own_kv().put_if_absent(key, value)
    }

    /// The value of `key`, if it has one.
    pub fn kv_get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        self.own_kv().get(key)
    }

    /// Removes `key`; returns whether it had a value.
    pub fn kv_delete(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        self.own_kv().delete(key)
    }

    /// The keys that start with `prefix`, in byte order.
    pub fn kv_keys(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<Vec<u8>>> {
        self.own_kv().keys(prefix)
    }

    /// The key-value store of `namespace` rather than this program's: a
    /// library keeps state there that every program (and the CLI) finds
    /// under one name, whatever namespace the program runs in.
    pub fn kv_namespace(&self, namespace: &str) -> KvNamespace<'_> {
        KvNamespace {
            cluster: self,
            namespace: namespace.to_string(),
        }
    }

    fn own_kv(&self) -> KvNamespace<'_> {
        self.kv_namespace(&self.core().ctx().binary.namespace)
    }

    /// Publishes `entry` as what the dashboard shows in `section` ("train"
    /// and "tune" have pages) under `id`, replacing what was there: Train
    /// runs and Tune experiments publish their progress this way. It lives
    /// in the head's key-value store, outside every program's namespace.
    /// The dashboard is a view: this tries once, for at most 2 s, and does
    /// not wait out a restart of the head.
    pub fn publish_to_dashboard(&self, section: &str, id: &str, entry: &impl Serialize) -> Result<()> {
        let request = KvPutRequest {
            namespace: DASHBOARD_NAMESPACE.to_string(),
            key: format!("{section}/{id}").into_bytes(),
            value: serde_json::to_vec(entry).map_err(|e| {
                Error::Cluster(raylet_proto::Error::InvalidArgument(format!(
                    "a dashboard entry is not JSON: {e}"
                )))
            })?,
            overwrite: true,
        };
        let core = self.core().clone();
        core.clone().block_on(async move {
            let put = async {
                let mut kv = kv_client(&core).await?;
                kv.kv_put(request).await.map_err(raylet_proto::Error::from)?;
                Ok(())
            };
            let late =
                || raylet_proto::Error::DeadlineExceeded("the head did not take a dashboard entry in time".into());
            tokio::time::timeout(DASHBOARD_PATIENCE, put)
                .await
                .map_err(|_| Error::Cluster(late()))?
        })
    }
}

/// One namespace of the head's key-value store, from
/// [`Cluster::kv_namespace`]. Calls wait out a restart of the head.
pub struct KvNamespace<'a> {
    cluster: &'a Cluster,
    namespace: String,
}

impl KvNamespace<'_> {
    /// Sets `key` to `value` (at most 16 MiB).
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        self.put_entry(key.as_ref(), value.as_ref(), true).map(|_| ())
    }

    /// Sets `key` to `value` unless the key has a value already; returns
    /// whether it was set.
    pub fn put_if_absent(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<bool> {
        self.put_entry(key.as_ref(), value.as_ref(), false)
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let request = KvGetRequest {
            namespace: self.namespace.clone(),
            key: key.as_ref().to_vec(),
        };
        self.with_kv(move |mut kv| {
            let request = request.clone();
            async move { Ok(kv.kv_get(request).await?.into_inner().value) }
        })
    }

    /// Removes `key`; returns whether it had a value.
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        let request = KvDeleteRequest {
            namespace: self.namespace.clone(),
            key: key.as_ref().to_vec(),
        };
        self.with_kv(move |mut kv| {
            let request = request.clone();
            async move { Ok(kv.kv_delete(request).await?.into_inner().deleted) }
        })
    }

    /// The keys that start with `prefix`, in byte order.
    pub fn keys(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<Vec<u8>>> {
        let request = KvKeysRequest {
            namespace: self.namespace.clone(),
            prefix: prefix.as_ref().to_vec(),
        };
        self.with_kv(move |mut kv| {
            let request = request.clone();
            async move { Ok(kv.kv_keys(request).await?.into_inner().keys) }
        })
    }

    fn put_entry(&self, key: &[u8], value: &[u8], overwrite: bool) -> Result<bool> {
        let request = KvPutRequest {
            namespace: self.namespace.clone(),
            key: key.to_vec(),
            value: value.to_vec(),
            overwrite,
        };
        self.with_kv(move |mut kv| {
            let request = request.clone();
            async move { Ok(kv.kv_put(request).await?.into_inner().added) }
        })
    }

    /// Runs `call` on the head's key-value service, again while the head
    /// is away (up to the restart patience).
    fn with_kv<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(KvServiceClient<AuthedChannel>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, tonic::Status>> + Send,
    {
        let core = self.cluster.core().clone();
        core.clone().block_on(async move {
            let attempt = || async {
                let kv = kv_client(&core).await?;
                Ok(call(kv).await.map_err(raylet_proto::Error::from)?)
            };
            retrying(attempt).await
        })
    }
}

/// What programs published (with [`Cluster::publish_to_dashboard`]) for
/// the dashboard's `section`, in key order; entries that are not JSON are
/// skipped. The dashboard's Train and Tune pages read them.
pub async fn dashboard_entries(head: &str, token: &AuthToken, section: &str) -> Result<Vec<serde_json::Value>> {
    let channel = raylet_proto::channel::connect(head, token, DASHBOARD_PATIENCE).await?;
    let mut kv = KvServiceClient::new(channel);
    let keys = KvKeysRequest {
        namespace: DASHBOARD_NAMESPACE.to_string(),
        prefix: format!("{section}/").into_bytes(),
    };
    let keys = kv
        .kv_keys(keys)
        .await
        .map_err(raylet_proto::Error::from)?
        .into_inner()
        .keys;
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        let request = KvGetRequest {
            namespace: DASHBOARD_NAMESPACE.to_string(),
            key,
        };
        let value = kv
            .kv_get(request)
            .await
            .map_err(raylet_proto::Error::from)?
            .into_inner()
            .value;
        entries.extend(value.and_then(|bytes| serde_json::from_slice(&bytes).ok()));
    }
    Ok(entries)
}

async fn kv_client(core: &CoreWorker) -> Result<KvServiceClient<AuthedChannel>> {
    Ok(KvServiceClient::new(core.channel(&core.ctx().head_address).await?))
}
