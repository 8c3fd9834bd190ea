//! Where the controller keeps what should run: one key per application in
//! the head's key-value store (namespace `_raylet_serve`, key
//! `apps/<name>`, the [`Application`] postcard-encoded). The head persists
//! it, so a restarted controller or head finds it again; the CLI deletes a
//! key to delete an application.

use raylet::Cluster;

use crate::config::Application;
use crate::error::{Result, ServeError};

/// The key-value namespace of Serve's state.
pub(crate) const KV_NAMESPACE: &str = "_raylet_serve";
/// The prefix of application keys.
const APPS: &str = "apps/";

/// Records `app` as what should run.
pub(super) fn save(cluster: &Cluster, app: &Application) -> Result<()> {
    let encoded = raylet::codec::encode(app).map_err(|e| ServeError::Encode {
        what: format!("application `{}`", app.name),
        message: e.to_string(),
    })?;
    cluster.kv_namespace(KV_NAMESPACE).put(key(&app.name), encoded)?;
    Ok(())
}

/// Forgets application `name`; returns whether it was recorded.
pub(super) fn remove(cluster: &Cluster, name: &str) -> Result<bool> {
    Ok(cluster.kv_namespace(KV_NAMESPACE).delete(key(name))?)
}

/// The names of the recorded applications.
pub(super) fn names(cluster: &Cluster) -> Result<Vec<String>> {
    let keys = cluster.kv_namespace(KV_NAMESPACE).keys(APPS)?;
    Ok(keys
        .into_iter()
        .filter_map(|key| String::from_utf8(key).ok())
        .filter_map(|key| key.strip_prefix(APPS).map(str::to_string))
        .collect())
}

/// Every recorded application; one that no longer decodes (written by an
/// older build) is skipped with a warning.
pub(super) fn load_all(cluster: &Cluster) -> Result<Vec<Application>> {
    let kv = cluster.kv_namespace(KV_NAMESPACE);
    let mut apps = Vec::new();
    for name in names(cluster)? {
        let Some(bytes) = kv.get(key(&name))? else {
            continue;
        };
        match raylet::codec::decode::<Application>(&bytes) {
            Ok(app) => apps.push(app),
            Err(e) => tracing::warn!(app = %name, "skipping a recorded application that does not decode: {e}"),
        }
    }
    Ok(apps)
}

fn key(name: &str) -> String {
    format!("{APPS}{name}")
}
