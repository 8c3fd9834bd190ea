//! How `raylet::init` starts or joins a cluster.

use std::path::PathBuf;
use std::time::Duration;

use raylet_common::tls::TlsFiles;
use raylet_proto::JobId;

#[cfg(feature = "embedded")]
use crate::cluster::embedded::EmbeddedNode;
use crate::cluster::session::DEFAULT_TEMP_DIR;

/// Settings for [`crate::init_with`]. `Config::from_env()` reads
/// `RAYLET_ADDRESS`, `RAYLET_TOKEN`, `RAYLET_NODE_MANAGER` and
/// `RAYLET_NAMESPACE` and `RAYLET_JOB_ID` (which a node manager sets for the
/// job drivers it starts), `RAYLET_TEMP_DIR`, `RAYLET_LOG_TO_DRIVER`,
/// `RAYLET_TIMELINE`, `RAYLET_TASK_EVENTS` and `RAYLET_MAX_PENDING_TASKS`.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) address: Option<String>,
    pub(crate) node_manager: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) temp_dir: PathBuf,
    pub(crate) namespace: String,
    pub(crate) log_to_driver: bool,
    pub(crate) object_store_full_timeout: Duration,
    pub(crate) io_threads: usize,
    pub(crate) job_id: Option<JobId>,
    pub(crate) timeline: bool,
    pub(crate) task_events: bool,
    pub(crate) max_pending_tasks: usize,
    pub(crate) tls: Option<TlsFiles>,
    /// The embedded cluster's node, when there is no address to join.
    #[cfg(feature = "embedded")]
    pub(crate) embedded_node: EmbeddedNode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            address: None,
            node_manager: None,
            token: None,
            temp_dir: PathBuf::from(DEFAULT_TEMP_DIR),
            namespace: Self::DEFAULT_NAMESPACE.to_string(),
            log_to_driver: true,
            object_store_full_timeout: Self::DEFAULT_OBJECT_STORE_FULL_TIMEOUT,
            io_threads: 1,
            job_id: None,
            timeline: false,
            task_events: true,
            max_pending_tasks: crate::submitter::pending_gate::DEFAULT_MAX_PENDING_TASKS,
            tls: None,
            #[cfg(feature = "embedded")]
            embedded_node: EmbeddedNode::default(),
        }
    }
}

impl Config {
    pub const DEFAULT_OBJECT_STORE_FULL_TIMEOUT: Duration = Duration::from_secs(10);
    /// The namespace of named actors when none is set.
    pub const DEFAULT_NAMESPACE: &'static str = "default";

    /// An embedded cluster with detected resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults, overridden by the `RAYLET_*` environment variables.
    pub fn from_env() -> Self {
        let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let switch = |name: &str, default: bool| {
            variable(name).map_or(default, |value| !matches!(value.as_str(), "0" | "false" | "no"))
        };
        let defaults = Config::default();
        Config {
            address: variable("RAYLET_ADDRESS"),
            token: variable("RAYLET_TOKEN"),
            node_manager: variable("RAYLET_NODE_MANAGER"),
            namespace: variable("RAYLET_NAMESPACE").unwrap_or(defaults.namespace.clone()),
            temp_dir: variable("RAYLET_TEMP_DIR").map_or(defaults.temp_dir.clone(), PathBuf::from),
            log_to_driver: switch("RAYLET_LOG_TO_DRIVER", true),
            job_id: variable("RAYLET_JOB_ID").and_then(|id| id.parse().ok()),
            timeline: switch("RAYLET_TIMELINE", false),
            task_events: switch("RAYLET_TASK_EVENTS", true),
            io_threads: variable("RAYLET_IO_THREADS")
                .and_then(|value| value.parse().ok())
                .unwrap_or(defaults.io_threads),
            max_pending_tasks: variable("RAYLET_MAX_PENDING_TASKS")
                .and_then(|value| value.parse().ok())
                .unwrap_or(defaults.max_pending_tasks),
            ..defaults
        }
    }

    /// Connect over TLS with this certificate, key and cluster CA (as
    /// `raylet start --tls-cert/--tls-key/--tls-ca` do), instead of what
    /// `RAYLET_TLS_CERT/KEY/CA` name. TLS is set once per process: every
    /// connection of the process, an embedded cluster's included, uses it.
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Join the running cluster whose head is at `HOST:PORT`.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// When joining, the node manager (HOST:PORT) this driver attaches to:
    /// its tasks are leased there first and its large objects stored there
    /// [default: a node on this machine, else the head's].
    pub fn node_manager(mut self, address: impl Into<String>) -> Self {
        self.node_manager = Some(address.into());
        self
    }

    /// The namespace in which this program and its workers create and find
    /// named actors [default: `RAYLET_NAMESPACE`, which a job's driver gets
    /// set to `job-<job id>`, else "default"].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The cluster token when joining; by default from `RAYLET_TOKEN` or the session directory.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = dir.into();
        self
    }

    /// How long `put` waits for room in a full object store (spilling and
    /// freeing make room) before it fails with `ObjectStoreFull` [default: 10 s].
    pub fn object_store_full_timeout(mut self, timeout: Duration) -> Self {
        self.object_store_full_timeout = timeout;
        self
    }

    /// Threads that run this driver's networking, and an embedded cluster's
    /// head and node manager [default: 1, or `RAYLET_IO_THREADS`]. One
    /// thread, as Ray's core worker has, answers a synchronous call fastest:
    /// a second one mostly wakes up to steal work that the first would have
    /// run at once.
    pub fn io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads.max(1);
        self
    }

    /// Whether this driver's tasks, and the tasks they submit, record
    /// timeline spans for `raylet timeline`: each run and the phases inside
    /// it [default: false, or `RAYLET_TIMELINE=1`].
    pub fn timeline(mut self, enabled: bool) -> Self {
        self.timeline = enabled;
        self
    }

    /// Whether the states of this driver's tasks go to the head, for
    /// `raylet list tasks`, `raylet summary tasks` and `/metrics`
    /// [default: true, or `RAYLET_TASK_EVENTS=0`].
    pub fn task_events(mut self, enabled: bool) -> Self {
        self.task_events = enabled;
        self
    }

    /// How many tasks and actor calls this driver may have submitted and
    /// not finished; past it, `remote()` and actor calls wait until some
    /// finish, so a driver that submits faster than the cluster runs keeps
    /// its memory bounded [default: 2,000,000, or
    /// `RAYLET_MAX_PENDING_TASKS`]. Async tasks and methods, which run on the
    /// cluster's threads, are never made to wait.
    pub fn max_pending_tasks(mut self, tasks: usize) -> Self {
        self.max_pending_tasks = tasks;
        self
    }

    /// The job this driver's tasks are recorded under [default:
    /// `RAYLET_JOB_ID` for a submitted job's driver, else a new id].
    pub fn job_id(mut self, job: JobId) -> Self {
        self.job_id = Some(job);
        self
    }

    /// Whether workers' output is printed by the driver (default true).
    pub fn log_to_driver(mut self, enabled: bool) -> Self {
        self.log_to_driver = enabled;
        self
    }
}
