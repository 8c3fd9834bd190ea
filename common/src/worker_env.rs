//! What a node manager hands a worker process it starts, in one environment
//! variable that the worker's pre-`main` hook reads and removes.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The environment variable that turns a process into a raylet worker.
pub const WORKER_ENV: &str = "RAYLET_WORKER_BOOTSTRAP_V1";

/// Everything a worker needs to join its node manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerBootstrap {
    pub node_manager_address: String,
    /// The cluster's head, where actors are created and found.
    pub head_address: String,
    pub node_id: String,
    pub worker_id: String,
    pub token: String,
    /// The content hash of the binary, as the node manager checked it.
    pub binary_hash: String,
    /// The IP the worker binds its service to.
    pub bind_ip: String,
    /// The GPUs leased to the worker, also in its `CUDA_VISIBLE_DEVICES`.
    pub gpu_ids: Vec<u32>,
    /// The namespace of the session's owner, for named actors.
    pub namespace: String,
    /// Where the worker writes its output, `worker-<id>-<pid>.out|.err`.
    #[serde(default)]
    pub log_dir: String,
}

impl WorkerBootstrap {
    pub fn to_env_value(&self) -> String {
        serde_json::to_string(self).expect("a bootstrap of strings always encodes")
    }

    pub fn from_env_value(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::InvalidArgument(format!("{WORKER_ENV} is malformed: {e}")))
    }
}
