//! The cluster config `raylet up` reads: the cluster's name, the provider
//! that makes its nodes (with that provider's settings), the flags of its
//! head, and the autoscaler's node types and limits.
//!
//! ```yaml
//! cluster_name: demo
//! provider:
//!   type: local
//! head:
//!   args: ["--num-cpus", "0"]
//! autoscaler:
//!   max_nodes: 4
//!   node_types:
//!     - {name: cpu2, resources: {CPU: 2}, max_count: 4, idle_timeout_s: 60}
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use raylet_placement::autoscaler::{Autoscaler, AutoscalerConfig};
use raylet_placement::{LaunchableNode, LaunchableNodes};
use serde::{Deserialize, Serialize};

use crate::cluster_name::{ClusterNameError, check_cluster_name};
use crate::provider::NodeProvider;
use crate::{LocalProvider, NetnsConfig, NetnsProvider, SlurmConfig, SlurmProvider};

/// How often the autoscaler runs a round, unless the config says.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// The longest time between the autoscaler's rounds.
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// A cluster as its YAML file describes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Scopes the provider's instances: two clusters never see each
    /// other's nodes. ASCII letters, digits, `-`, `_` and `.`.
    pub cluster_name: String,
    pub provider: ProviderConfig,
    #[serde(default)]
    pub head: HeadSettings,
    pub autoscaler: AutoscalerConfig,
}

/// Which provider makes the nodes, with its settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ProviderConfig {
    /// `raylet start` processes on this machine.
    Local(LocalConfig),
    /// Hosts in network namespaces on this machine.
    Netns(NetnsConfig),
    /// Slurm batch jobs.
    Slurm(SlurmConfig),
    /// Pods made through the Kubernetes API.
    #[cfg(feature = "kubernetes")]
    Kubernetes(crate::KubernetesConfig),
}

/// The `local` provider's settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// The `raylet` binary the nodes run; by default this process's own.
    pub binary: Option<PathBuf>,
}

/// How the head runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeadSettings {
    /// More `raylet start --head` flags, e.g. `["--port", "6380", "--num-cpus", "0"]`.
    pub args: Vec<String>,
    /// Seconds between the autoscaler's rounds (5 by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
}

/// Why a cluster config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid cluster config: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    ClusterName { path: PathBuf, source: ClusterNameError },
    #[error("{path}: {source}")]
    Interval { path: PathBuf, source: IntervalError },
}

/// `head.interval_s` is not a number of seconds above 0 and at most a day.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("head.interval_s must be a number of seconds above 0 and at most a day, not {0}")]
pub struct IntervalError(pub f64);

/// Why the config's provider cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error("finding this executable, the local nodes' default binary: {0}")]
    CurrentExe(std::io::Error),
    #[error(transparent)]
    Netns(#[from] crate::NetnsError),
    #[error(transparent)]
    Slurm(#[from] crate::SlurmError),
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Kubernetes(#[from] crate::ConnectError),
}

impl ClusterConfig {
    /// Reads and checks the config at `path`.
    pub fn load(path: &Path) -> Result<Self, ClusterConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: ClusterConfig = serde_yaml_ng::from_str(&text).map_err(|e| ClusterConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let invalid = |message: String| ClusterConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let path = path.to_path_buf();
        check_cluster_name(&config.cluster_name).map_err(|source| ClusterConfigError::ClusterName {
            path: path.clone(),
            source,
        })?;
        config.autoscaler.validate().map_err(|e| invalid(e.to_string()))?;
        config
            .interval()
            .map_err(|source| ClusterConfigError::Interval { path, source })?;
        Ok(config)
    }

    /// The autoscaler's decision over the config's node types.
    pub fn autoscaler(&self) -> Autoscaler {
        Autoscaler::new(self.autoscaler.clone()).expect("the config was checked when loaded")
    }

    /// The node types as placement sees them: work only they fit waits.
    pub fn launchable(&self) -> LaunchableNodes {
        let types = self.autoscaler.node_types.iter().map(|node_type| LaunchableNode {
            name: node_type.name.clone(),
            total: node_type.resources.clone(),
            labels: node_type.labels.clone(),
        });
        LaunchableNodes::new(types.collect())
    }

    /// Seconds between rounds.
    pub fn interval(&self) -> Result<Duration, IntervalError> {
        let seconds = self.head.interval_s.unwrap_or(DEFAULT_INTERVAL.as_secs_f64());
        match Duration::try_from_secs_f64(seconds) {
            Ok(interval) if !interval.is_zero() && interval <= MAX_INTERVAL => Ok(interval),
            _ => Err(IntervalError(seconds)),
        }
    }

    /// The provider's kind, as the config names it.
    pub fn provider_kind(&self) -> &'static str {
        match &self.provider {
            ProviderConfig::Local(_) => "local",
            ProviderConfig::Netns(_) => "netns",
            ProviderConfig::Slurm(_) => "slurm",
            #[cfg(feature = "kubernetes")]
            ProviderConfig::Kubernetes(_) => "kubernetes",
        }
    }

    /// Makes the provider; local nodes keep their sessions under `temp_dir`.
    pub async fn provider(&self, temp_dir: &Path) -> Result<Arc<dyn NodeProvider>, ProviderSetupError> {
        let name = &self.cluster_name;
        Ok(match &self.provider {
            ProviderConfig::Local(local) => {
                let binary = match &local.binary {
                    Some(binary) => binary.clone(),
                    None => std::env::current_exe().map_err(ProviderSetupError::CurrentExe)?,
                };
                Arc::new(LocalProvider::new(binary, temp_dir))
            }
            ProviderConfig::Netns(netns) => Arc::new(NetnsProvider::new(name, netns.clone())?),
            ProviderConfig::Slurm(slurm) => Arc::new(SlurmProvider::new(name, slurm.clone())?),
            #[cfg(feature = "kubernetes")]
            ProviderConfig::Kubernetes(kubernetes) => {
                Arc::new(crate::KubernetesProvider::connect(name, kubernetes.clone()).await?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads a local cluster's config whose rounds are `interval_s` apart,
    /// and whose node type goes idle after `idle_timeout_s`.
    fn load(interval_s: &str, idle_timeout_s: &str) -> Result<ClusterConfig, ClusterConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        let text = format!(
            "cluster_name: c\nprovider:\n  type: local\nhead:\n  interval_s: {interval_s}\nautoscaler:\n  max_nodes: 1\n  \
             node_types:\n    - {{name: cpu2, resources: {{CPU: 2}}, max_count: 1, idle_timeout_s: {idle_timeout_s}}}\n"
        );
        std::fs::write(&path, text).unwrap();
        ClusterConfig::load(&path)
    }

    #[test]
    fn durations_past_their_bound_are_refused_with_the_bound_named() {
        let config = load("0.5", "600").expect("a valid config");
        assert_eq!(config.interval(), Ok(Duration::from_millis(500)));
        for interval in ["0", "-1", "1e12", ".nan"] {
            let error = load(interval, "600").unwrap_err();
            assert!(matches!(error, ClusterConfigError::Interval { .. }), "{error}");
            assert!(
                error.to_string().contains("at most a day"),
                "interval_s {interval}: {error}"
            );
        }
        let error = load("1", "1e18").unwrap_err().to_string();
        assert!(error.contains("ten years"), "{error}");
    }
}
