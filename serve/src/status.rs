//! What the controller reports: [`ServeStatus`], returned by
//! [`status`](crate::status) and published about once a second to the
//! dashboard's `serve` section (entry `status`), where `raylet serve
//! status` and the dashboard's Serve page read it as JSON.

use serde::{Deserialize, Serialize};

use crate::figures::Figure;

/// Every application, its deployments and replicas, and the proxies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServeStatus {
    /// When the controller wrote this, in milliseconds since the epoch.
    pub updated_at_ms: u64,
    /// The version of the routing table, and whether every proxy and
    /// running replica has installed it.
    pub routes_version: u64,
    pub routes_installed: bool,
    pub controller: ControllerStatus,
    /// The proxies that run.
    pub proxies: Vec<ProxyStatus>,
    /// The nodes whose proxy failed to start, in a row, and when it is
    /// tried again.
    #[serde(default)]
    pub proxy_failures: Vec<ProxyFailureStatus>,
    pub apps: Vec<AppStatus>,
}

/// Where the controller runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControllerStatus {
    pub node_id: String,
    pub pid: u32,
}

/// One node's HTTP proxy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyStatus {
    pub node_id: String,
    pub address: String,
}

/// A node whose proxy fails to start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProxyFailureStatus {
    pub node_id: String,
    /// Failed starts in a row.
    pub failures: u32,
    pub last_error: String,
    /// Milliseconds until the next start.
    pub retry_in_ms: u64,
}

/// One application.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppStatus {
    pub name: String,
    pub route_prefix: String,
    pub public: bool,
    pub state: AppState,
    /// Why the deploy failed, or why it is unhealthy; empty otherwise.
    pub message: String,
    pub deployments: Vec<DeploymentStatus>,
}

/// Where an application is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AppState {
    /// Replicas of its current version are starting, or old ones stopping.
    Deploying,
    /// Every deployment has its target count of current replicas.
    Running,
    /// Replicas of a deployment failed to start again and again; see the
    /// message. Nothing more is started until the next deploy.
    DeployFailed,
    /// A deployment that has run lacks replicas that fail to start (see
    /// the message); they are started again after a back-off.
    Unhealthy,
    /// Deleted; its replicas are stopping.
    Deleting,
}

/// One deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeploymentStatus {
    pub name: String,
    pub class: String,
    /// A hash of what the replicas run (class, `Init`, resources).
    pub version: String,
    pub target_replicas: u32,
    pub max_ongoing_requests: u32,
    pub replicas: Vec<ReplicaStatus>,
    pub requests: RequestCounts,
    pub autoscaling: Option<AutoscalingStatus>,
    /// The deployment's own figures, combined over its running replicas
    /// (see [`Deployment::figures`](crate::Deployment::figures)).
    #[serde(default)]
    pub figures: Vec<Figure>,
}

/// One replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub name: String,
    pub state: ReplicaState,
    pub version: String,
    pub node_id: String,
    /// 0 while unknown.
    pub pid: u32,
    /// Requests it ran at its last check.
    pub ongoing: u32,
    /// What it waits for before it can be placed, e.g. `waits for {CPU:
    /// 1}: no node has it free (CPU: 0 of 2 free in the cluster)`; empty
    /// when it does not wait.
    #[serde(default)]
    pub waiting: String,
}

/// Where a replica is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReplicaState {
    /// Created; being built, not yet healthy. It gets no traffic.
    Starting,
    /// Healthy and in every router.
    Running,
    /// Out of every router, finishing its requests.
    Draining,
    /// Being killed.
    Stopping,
}

/// Requests answered by a deployment's replicas since the controller
/// started, as they reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub errors: u64,
}

/// The autoscaler's inputs and decision for one deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoscalingStatus {
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub target_ongoing_requests: f64,
    /// The replicas it aims at now.
    pub current: u32,
    /// What the load asks for.
    pub desired: u32,
    /// Requests at replicas plus in router queues, averaged over the look
    /// back period.
    pub average_ongoing: f64,
    /// Requests waiting in routers at the last sample.
    pub queued: u32,
    /// The decision in words.
    pub decision: String,
}

impl ServeStatus {
    /// The application called `name`.
    pub fn app(&self, name: &str) -> Option<&AppStatus> {
        self.apps.iter().find(|app| app.name == name)
    }

    /// What keeps application `name` from running as it should, a line
    /// each: its replicas that wait and what for, why it is unhealthy, and
    /// the nodes whose proxy fails to start.
    pub fn problems(&self, name: &str) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(app) = self.app(name) {
            if app.state == AppState::Unhealthy {
                lines.push(format!("application `{name}` is unhealthy: {}", app.message));
            }
            let replicas = app.deployments.iter().flat_map(|deployment| &deployment.replicas);
            for replica in replicas.filter(|replica| !replica.waiting.is_empty()) {
                lines.push(format!("{} {}", replica.name, replica.waiting));
            }
        }
        lines.extend(self.proxy_failures.iter().map(ProxyFailureStatus::describe));
        lines
    }
}

impl ProxyFailureStatus {
    /// E.g. `the HTTP proxy on node ab12cd34 failed to start 3 times in a
    /// row: Address already in use (os error 98)`; the same until another
    /// start fails.
    pub fn describe(&self) -> String {
        let node: String = self.node_id.chars().take(8).collect();
        let times = match self.failures {
            1 => "once".to_string(),
            failures => format!("{failures} times in a row"),
        };
        format!(
            "the HTTP proxy on node {node} failed to start {times}: {}",
            self.last_error
        )
    }
}

impl AppStatus {
    /// The deployment called `name`.
    pub fn deployment(&self, name: &str) -> Option<&DeploymentStatus> {
        self.deployments.iter().find(|deployment| deployment.name == name)
    }
}

impl DeploymentStatus {
    /// Its replicas in `state`.
    pub fn replicas_in(&self, state: ReplicaState) -> impl Iterator<Item = &ReplicaStatus> {
        self.replicas.iter().filter(move |replica| replica.state == state)
    }
}
