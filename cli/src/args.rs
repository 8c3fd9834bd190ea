//! The CLI's clap structs, and their conversion into the library's config types.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use raylet::session::{DEFAULT_TEMP_DIR, Session, TempRoot};
use raylet_common::auth::AuthToken;
use raylet_common::tls::TlsFiles;
use raylet_head::HeadConfig;
use raylet_node::{MemoryMonitorConfig, NodeConfig, NvmlDetector, ResourceOverrides};
use raylet_placement::LaunchableNodes;
use raylet_proto::{ActorId, JobId, Labels, NodeId, ResourceSet, TaskId, WorkerId};

use crate::flag_values::{parse_duration, parse_duration_or_zero, parse_key_value, parse_labels};
use crate::row_filter::RowFilter;

/// raylet: a Ray-like distributed runtime for ML workloads, in Rust.
///
/// Start a head with `raylet start --head`, join other machines to it with
/// `raylet start --address HEAD:PORT`, look at the cluster with
/// `raylet status`, and end it with `raylet stop`.
#[derive(Debug, Parser)]
#[command(name = "raylet", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS for every connection of the cluster: gRPC, task streams and HTTP.
/// Give all three files to every `raylet` command and driver of a TLS
/// cluster (or set the variables); workers and jobs' drivers inherit them.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// This process's certificate (PEM), signed by --tls-ca. A node's must
    /// name the address others reach it at, as an IP or DNS subject
    /// alternative name.
    #[arg(
        long,
        global = true,
        env = "RAYLET_TLS_CERT",
        value_name = "PEM",
        help_heading = "TLS"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "RAYLET_TLS_KEY",
        value_name = "PEM",
        help_heading = "TLS"
    )]
    pub tls_key: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must show a certificate
    /// it signed, in both directions.
    #[arg(long, global = true, env = "RAYLET_TLS_CA", value_name = "PEM", help_heading = "TLS")]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// Makes every connection of this process use TLS, if the files are given.
    pub fn configure(&self) -> anyhow::Result<()> {
        let files = TlsFiles::from_options(self.tls_cert.clone(), self.tls_key.clone(), self.tls_ca.clone())?;
        Ok(raylet_common::tls::configure(files)?)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the head of a new cluster (--head), or join this machine to one (--address).
    ///
    /// Without --block, the daemon is started in the background and this
    /// command returns once it is ready, printing how to join and connect.
    /// Pid files, the cluster token and logs go to the session directory,
    /// <temp-dir>/session_latest.
    Start(Box<StartArgs>),
    /// Show the cluster's nodes (alive and dead), their resources and utilization.
    Status(StatusArgs),
    /// Show each node's object store: memory used and spilled, and every
    /// object with its size, state, owner and the processes holding refs.
    Memory(StatusArgs),
    /// List the cluster's nodes, jobs, actors, tasks, placement groups or objects.
    #[command(subcommand)]
    List(ListCommand),
    /// Count the recorded tasks and actor calls by function and state.
    #[command(subcommand)]
    Summary(SummaryCommand),
    /// Write the recorded task runs as a Chrome trace (chrome://tracing, Perfetto).
    ///
    /// Every task and actor call that ran is drawn on its node and worker
    /// process. Jobs run with the timeline on (RAYLET_TIMELINE=1 in the
    /// driver's environment, or Config::timeline) also show the phases
    /// inside each run, such as a Train allreduce's steps.
    Timeline(TimelineArgs),
    /// Print what a worker process, an actor or a task wrote to stdout (or
    /// stderr), from the log file its worker keeps on its node.
    ///
    /// Examples: raylet logs --actor ID; raylet logs --task ID --err;
    /// raylet logs --worker ID; raylet logs --pid 4242 --node NODE_ID.
    Logs(LogsArgs),
    /// Print every thread's backtrace of the cluster's workers, to see
    /// where a hung job waits (as `ray stack` does with py-spy).
    ///
    /// The workers run on: each thread stops only for the microseconds it
    /// takes to record its return addresses. Examples: raylet stack;
    /// raylet stack --node NODE_ID; raylet stack --worker 4242.
    Stack(StackArgs),
    /// Submit jobs and follow, stop and list them.
    ///
    /// A job is a binary that links raylet, run as a driver on a node of the
    /// cluster. Its binary and --files are uploaded to the head once
    /// (content-addressed by sha256: what the head has is not sent again).
    #[command(subcommand)]
    Job(JobCommand),
    /// Deploy, inspect and delete Serve applications (online inference).
    ///
    /// The Serve controller keeps each application's desired state in the
    /// head's key-value store and publishes its status; these commands work
    /// through both.
    #[command(subcommand)]
    Serve(ServeCommand),
    /// Stop every raylet process that this machine's sessions started.
    Stop(StopArgs),
    /// Start a cluster from a cluster config: its head, with the autoscaler
    /// that launches the config's node types through its provider (local
    /// processes, network namespaces, Slurm jobs or Kubernetes pods).
    ///
    /// The config (YAML) names the cluster, the provider and its settings,
    /// extra `raylet start --head` flags, and the node types with their
    /// resources, labels, min/max counts and idle timeouts:
    ///
    ///   cluster_name: demo
    ///   provider: {type: local}
    ///   head: {args: ["--num-cpus", "0"]}
    ///   autoscaler:
    ///     max_nodes: 4
    ///     node_types:
    ///       - {name: cpu2, resources: {CPU: 2}, max_count: 4, idle_timeout_s: 60}
    ///
    /// `raylet status` shows what the autoscaler does and why.
    Up(UpArgs),
    /// Stop a cluster started with `raylet up`: its head first (which
    /// terminates every node it launched), then this machine's other
    /// raylet processes, then whatever the provider still lists.
    Down(DownArgs),
    /// Measure task, object and wait throughput the way `ray microbenchmark` does.
    ///
    /// Runs an embedded cluster (or joins RAYLET_ADDRESS) and prints each
    /// metric as `NAME per second MEAN +- STDDEV`, over 4 trials of 2 s
    /// after a 1 s warm-up.
    Microbenchmark(MicrobenchmarkArgs),
}

#[derive(Debug, Subcommand)]
pub enum ListCommand {
    /// Every node incarnation, dead ones included: id, address, host,
    /// state (ALIVE, DEAD), whether it is the head, labels and resources.
    Nodes(ListArgs),
    /// Every job, ended ones included: id, name, status, exit code and
    /// entrypoint.
    Jobs(ListArgs),
    /// Every actor, dead ones included: id, type, name, state (PENDING,
    /// ALIVE, RESTARTING, DEAD), node, pid, restarts and why it died.
    Actors(ListArgs),
    /// Every placement group, removed ones included: id, strategy, state
    /// (PENDING, CREATED, RESCHEDULING, INFEASIBLE, REMOVED), bundle count,
    /// the node of each bundle, and why it waits.
    PlacementGroups(ListArgs),
    /// Every object in the nodes' stores: id, node, size, state, owner and
    /// the processes that hold references.
    Objects(ListArgs),
    /// The newest recorded attempts of tasks and actor calls: id, attempt,
    /// name, state (PENDING_ARGS_AVAIL, PENDING_NODE_ASSIGNMENT,
    /// SUBMITTED_TO_WORKER, RUNNING, FINISHED, FAILED), job, node, worker
    /// pid, run time and error.
    Tasks(ListTasksArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ListTasksArgs {
    #[command(flatten)]
    pub list: ListArgs,
    /// Only the tasks of this job (as `raylet list jobs` or Cluster::job_id shows it).
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<JobId>,
    /// Print at most this many rows, the newest, after filtering.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Subcommand)]
pub enum SummaryCommand {
    /// Recorded task and actor-call attempts of each function, by state,
    /// with the mean run time of the finished ones.
    Tasks(SummaryArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub status: StatusArgs,
    /// Only the tasks of this job.
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<JobId>,
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["worker", "pid", "actor", "task"])))]
pub struct LogsArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// A worker process, by its id (`raylet list tasks` shows it).
    #[arg(long, value_name = "WORKER_ID")]
    pub worker: Option<WorkerId>,
    /// A worker process, by its pid.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// With --worker or --pid: the node to look on [default: every alive node].
    #[arg(long, value_name = "NODE_ID")]
    pub node: Option<NodeId>,
    /// The worker that hosts (or hosted last) this actor.
    #[arg(long, value_name = "ACTOR_ID")]
    pub actor: Option<ActorId>,
    /// The lines this task printed, in its latest attempt that ran.
    #[arg(long, value_name = "TASK_ID")]
    pub task: Option<TaskId>,
    /// Print stderr instead of stdout.
    #[arg(long)]
    pub err: bool,
    /// Print only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Keep printing what the log gets, across its rotations, until
    /// interrupted.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Only the workers of this node [default: every alive node].
    #[arg(long, value_name = "NODE_ID")]
    pub node: Option<NodeId>,
    /// Only the worker process with this pid (`raylet list tasks` shows
    /// them).
    #[arg(long, value_name = "PID")]
    pub worker: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub status: StatusArgs,
    /// Only the tasks of this job.
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<JobId>,
    /// Where the trace goes.
    #[arg(short, long, default_value = "timeline.json", value_name = "FILE")]
    pub output: PathBuf,
}

/// A `raylet list`: which cluster, which rows and in what form.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub status: StatusArgs,
    /// Keep only the rows whose field KEY is VALUE (KEY!=VALUE: is not);
    /// strings compare without case. Repeat it to require several. The
    /// fields are those that --format json prints, e.g. --filter state=ALIVE.
    #[arg(long = "filter", value_name = "KEY=VALUE", value_parser = RowFilter::parse)]
    pub filters: Vec<RowFilter>,
}

#[derive(Debug, Clone, Args)]
pub struct MicrobenchmarkArgs {
    /// Run only the metrics whose name contains this text.
    #[arg(long, value_name = "NAME")]
    pub filter: Option<String>,
    /// Short trials, to check that every metric runs.
    #[arg(long)]
    pub quick: bool,
}

/// Where sessions live and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct SessionArgs {
    /// Directory that holds the session directories.
    #[arg(long, env = "RAYLET_TEMP_DIR", default_value = DEFAULT_TEMP_DIR, value_name = "DIR")]
    pub temp_dir: PathBuf,
    /// The cluster token. By default it is read from <temp-dir>/session_latest/token.
    #[arg(long, env = "RAYLET_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
}

impl SessionArgs {
    pub fn root(&self) -> TempRoot {
        TempRoot::new(&self.temp_dir)
    }

    /// The token from --token / RAYLET_TOKEN, else from the latest session.
    pub fn resolve_token(&self) -> anyhow::Result<AuthToken> {
        match &self.token {
            Some(text) => parse_token(text),
            None => self.token_for(&self.root().require_latest()?),
        }
    }

    /// The token from --token / RAYLET_TOKEN, else from `session`.
    pub fn token_for(&self, session: &Session) -> anyhow::Result<AuthToken> {
        if let Some(text) = &self.token {
            return parse_token(text);
        }
        match session.read_token()? {
            Some(token) => Ok(token),
            None => bail!(
                "no cluster token: {} does not exist; pass --token or set RAYLET_TOKEN \
                 (the head keeps it in <temp-dir>/session_latest/token on its machine)",
                session.token_path().display()
            ),
        }
    }

    /// Extra flags to repeat in printed commands when the temp dir is not the default.
    pub fn temp_dir_flag(&self) -> String {
        if self.temp_dir == std::path::Path::new(DEFAULT_TEMP_DIR) {
            String::new()
        } else {
            format!(" --temp-dir '{}'", self.temp_dir.display())
        }
    }
}

fn parse_token(text: &str) -> anyhow::Result<AuthToken> {
    AuthToken::parse(text).context("--token / RAYLET_TOKEN")
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// The cluster config (YAML).
    pub config: PathBuf,
    /// Directory that holds the session directories.
    #[arg(long, env = "RAYLET_TEMP_DIR", default_value = DEFAULT_TEMP_DIR, value_name = "DIR")]
    pub temp_dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    /// The cluster config (YAML) the cluster was started with.
    pub config: PathBuf,
    /// Directory that holds the session directories.
    #[arg(long, env = "RAYLET_TEMP_DIR", default_value = DEFAULT_TEMP_DIR, value_name = "DIR")]
    pub temp_dir: PathBuf,
    /// How long the head gets to terminate its nodes and exit before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub grace_period: Duration,
}

#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("role").required(true).args(["head", "address"])))]
pub struct StartArgs {
    /// Start the head of a new cluster on this machine. The head starts
    /// this machine's node manager (with the node flags below) as a daemon
    /// of its own, which outlives a head that dies.
    #[arg(long)]
    pub head: bool,
    /// (head) Start the head of this machine's latest session again, after
    /// it died or was stopped: on the same address, with the same token,
    /// recovering its nodes, jobs and binaries from the session's state.
    /// Nodes and running job drivers carry on and attach again.
    #[arg(long, requires = "head")]
    pub recover: bool,
    /// Join the cluster whose head listens at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub address: Option<String>,
    /// (head) Run the autoscaler of this cluster config (YAML; see
    /// `raylet up --help`): it launches nodes of the config's types when
    /// work waits and removes idle ones. Work that only a configured node
    /// type fits waits for a launch instead of failing as infeasible.
    #[arg(long, requires = "head", value_name = "CLUSTER_YAML")]
    pub autoscaler: Option<PathBuf>,
    /// Port of the head's gRPC service; 0 picks a free one.
    #[arg(long, default_value_t = 6380)]
    pub port: u16,
    /// Port of the head's HTTP server (`/metrics`, `/api/...`), on the
    /// head's IP; 0 picks a free one. Its address is written to
    /// <session>/dashboard_address. A port in use is reported and skipped.
    #[arg(long, default_value_t = 8265, value_name = "PORT")]
    pub dashboard_port: u16,
    /// Port of the node's Prometheus `/metrics` (its lease, object store,
    /// RPC and worker metrics), on its IP; 0 picks a free one. With --head,
    /// the port of the head machine's node; the head serves its own metrics
    /// on --dashboard-port, and lists its own and every node's at
    /// /api/prometheus_targets.
    #[arg(long, default_value_t = 0, value_name = "PORT")]
    pub metrics_port: u16,
    /// IP address to bind to and advertise [default: 127.0.0.1, or for a
    /// joining node the local address that routes to the head].
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<IpAddr>,
    /// CPUs this node offers [default: detected].
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub num_cpus: Option<f64>,
    /// GPUs this node offers [default: counted through NVML, the NVIDIA driver's library].
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub num_gpus: Option<f64>,
    /// Bytes of memory for tasks and actors [default: 70% of RAM].
    #[arg(long, allow_negative_numbers = true, value_name = "BYTES")]
    pub memory: Option<f64>,
    /// Bytes of object store [default: 30% of RAM].
    #[arg(long, allow_negative_numbers = true, value_name = "BYTES")]
    pub object_store_memory: Option<f64>,
    /// Where the object store spills objects when memory runs short
    /// [default: spill/ in the session directory].
    #[arg(long, value_name = "DIR", conflicts_with = "spill_to")]
    pub spill_dir: Option<PathBuf>,
    /// Spill to a bucket of object storage instead, under
    /// `<prefix>/<node id>/`: `s3://bucket/prefix`, with the endpoint and
    /// credentials in the usual AWS_* variables. Checked at start.
    #[arg(long, value_name = "URL")]
    pub spill_to: Option<String>,
    /// Bytes of disk that spilled objects may use; past it, `put` waits and
    /// then fails with ObjectStoreFull [default: 90% of the free space].
    #[arg(long, value_name = "BYTES")]
    pub max_spill_bytes: Option<u64>,
    /// The largest binary or file a job may upload to the head, in bytes
    /// (with `--head`).
    #[arg(long, value_name = "BYTES", default_value_t = HeadConfig::DEFAULT_MAX_BLOB_BYTES)]
    pub max_upload_bytes: u64,
    /// Custom resources as a JSON object, e.g. '{"TPU": 4}'.
    #[arg(long, value_name = "JSON")]
    pub resources: Option<String>,
    /// Labels of this node that tasks and actors select with
    /// `label_selector`, e.g. `zone=us-east,disk=ssd`.
    #[arg(long, value_name = "K=V,..", value_parser = parse_labels, default_value = "")]
    pub labels: Labels,
    /// The share of the machine's memory in use above which the node ends
    /// the newest task's worker (retriable work first) so that it survives;
    /// the task is retried.
    #[arg(long, value_name = "SHARE", default_value_t = 0.95)]
    pub memory_usage_threshold: f64,
    /// How often the out-of-memory monitor reads memory use; 0s turns it off.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "250ms")]
    pub memory_monitor_interval: Duration,
    /// Stay in the foreground instead of starting a daemon.
    #[arg(long)]
    pub block: bool,
    /// (head) Mark a node dead when its heartbeats stop for this long.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub heartbeat_timeout: Duration,
    /// How often this node sends a heartbeat to the head.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub heartbeat_interval: Duration,
    /// (node) How long to retry an unreachable head before giving up.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
    /// (node) How long the workers of the head's actors live on after the
    /// head goes away, for a restarted head (`--recover`) to take them
    /// over; then they are killed.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub actor_adoption_grace: Duration,
    #[command(flatten)]
    pub session: SessionArgs,
    /// The session directory the daemon uses; set by the starting process.
    #[arg(long, hide = true)]
    pub session_dir: Option<PathBuf>,
    /// Where the daemon reports that it is ready; set by the starting process.
    #[arg(long, hide = true)]
    pub ready_file: Option<PathBuf>,
    /// The log the daemon writes its output to, rotating it by size; set
    /// by the starting process.
    #[arg(long, hide = true)]
    pub log_file: Option<PathBuf>,
    /// This node manager is the one of the head's machine; set by the head.
    #[arg(long, hide = true, requires = "address")]
    pub head_node: bool,
    /// The node id to come back as (a new incarnation of a node that died);
    /// set by a head that recovers after its machine's node manager died.
    #[arg(long, hide = true, requires = "head_node")]
    pub node_id: Option<NodeId>,
}

impl StartArgs {
    /// The node's total resources: the flags, then detection. Validates them.
    pub fn resolve_resources(&self) -> anyhow::Result<ResourceSet> {
        let custom = match &self.resources {
            Some(json) => ResourceSet::parse_custom_json(json)?,
            None => ResourceSet::new(),
        };
        let overrides = ResourceOverrides {
            num_cpus: self.num_cpus,
            num_gpus: self.num_gpus,
            memory: self.memory,
            object_store_memory: self.object_store_memory,
            custom,
        };
        Ok(raylet_node::resolve_resources(&overrides, &NvmlDetector::new())?)
    }

    pub fn head_config(&self, token: AuthToken, session_dir: &Path, launchable: LaunchableNodes) -> HeadConfig {
        HeadConfig::new(token)
            .launchable(launchable)
            .heartbeat_timeout(self.heartbeat_timeout)
            .state_dir(session_dir.join("head"))
            .max_blob_bytes(self.max_upload_bytes)
            .persistent(true)
    }

    pub fn node_config(
        &self,
        head_address: &str,
        token: AuthToken,
        resources: ResourceSet,
        session_dir: &Path,
    ) -> NodeConfig {
        let spill_root = self.spill_dir.clone().unwrap_or_else(|| session_dir.join("spill"));
        let config = NodeConfig::new(head_address, token, resources)
            .spill_root(spill_root)
            .work_root(session_dir.join("work"))
            .spill_limit(self.max_spill_bytes)
            .head_node(self.head_node)
            .labels(self.labels.clone())
            .memory_monitor(MemoryMonitorConfig {
                threshold: self.memory_usage_threshold,
                interval: self.memory_monitor_interval,
            })
            .heartbeat_interval(self.heartbeat_interval)
            .connect_timeout(self.connect_timeout)
            .adoption_grace(self.actor_adoption_grace);
        match self.node_id {
            Some(node_id) => config.node_id(node_id),
            None => config,
        }
    }

    /// The node flags of a head's command line, for the node manager it
    /// starts on its machine: resources, labels, spilling, memory monitor,
    /// heartbeats and the metrics port, as the head was given them.
    pub fn head_node_flags(&self) -> Vec<OsString> {
        let mut flags: Vec<(&str, String)> = Vec::new();
        let optional = [
            ("--num-cpus", self.num_cpus),
            ("--num-gpus", self.num_gpus),
            ("--memory", self.memory),
            ("--object-store-memory", self.object_store_memory),
        ];
        flags.extend(
            optional
                .into_iter()
                .filter_map(|(flag, value)| Some((flag, value?.to_string()))),
        );
        if let Some(dir) = &self.spill_dir {
            flags.push(("--spill-dir", dir.display().to_string()));
        }
        if let Some(url) = &self.spill_to {
            flags.push(("--spill-to", url.clone()));
        }
        if let Some(bytes) = self.max_spill_bytes {
            flags.push(("--max-spill-bytes", bytes.to_string()));
        }
        if let Some(json) = &self.resources {
            flags.push(("--resources", json.clone()));
        }
        if let Some(ip) = self.node_ip {
            flags.push(("--node-ip", ip.to_string()));
        }
        if !self.labels.is_empty() {
            let labels: Vec<String> = self
                .labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            flags.push(("--labels", labels.join(",")));
        }
        let duration = |duration: Duration| humantime::format_duration(duration).to_string();
        flags.extend([
            ("--metrics-port", self.metrics_port.to_string()),
            ("--memory-usage-threshold", self.memory_usage_threshold.to_string()),
            ("--memory-monitor-interval", duration(self.memory_monitor_interval)),
            ("--heartbeat-interval", duration(self.heartbeat_interval)),
            ("--connect-timeout", duration(self.connect_timeout)),
            ("--actor-adoption-grace", duration(self.actor_adoption_grace)),
            ("--temp-dir", self.session.temp_dir.display().to_string()),
        ]);
        flags
            .into_iter()
            .flat_map(|(flag, value)| [OsString::from(flag), OsString::from(value)])
            .collect()
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    /// A table, as `ray list` prints one.
    #[value(alias = "table")]
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Upload and start a job, then print its output until it ends and exit
    /// with its status (the driver's exit code when it failed with one).
    ///
    /// Example: raylet job submit --files model/ -- ./target/release/my_job --epochs 3
    Submit(JobSubmitArgs),
    /// Show a job's status, exit code or signal, and for a failure the end of its stderr.
    Status(JobStatusArgs),
    /// Print a job's output (stdout and stderr as they came).
    Logs(JobLogsArgs),
    /// Stop a job: SIGTERM to its driver, then SIGKILL after the grace period.
    Stop(JobStopArgs),
    /// Forget an ended job: the head drops its record and its output. A job
    /// that has not ended is refused; stop it first.
    Delete(JobIdArgs),
    /// List every job of the cluster, ended ones included.
    List(StatusArgs),
}

#[derive(Debug, Clone, Args)]
pub struct JobSubmitArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Return once the job is submitted instead of following it.
    #[arg(long)]
    pub no_wait: bool,
    /// A name to list the job under.
    #[arg(long)]
    pub name: Option<String>,
    /// Files or directories to ship into the driver's working directory.
    #[arg(long, value_name = "PATH", num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Environment variables of the driver.
    #[arg(long, value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Metadata to keep with the job.
    #[arg(long, value_name = "K=V", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
    /// CPUs the driver holds on its node.
    #[arg(long, default_value_t = 0.0)]
    pub num_cpus: f64,
    /// GPUs the driver holds on its node.
    #[arg(long, default_value_t = 0.0)]
    pub num_gpus: f64,
    /// The binary to run, then its arguments.
    #[arg(last = true, required = true, value_name = "BINARY [ARGS]")]
    pub entrypoint: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct JobIdArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The job's id, as `raylet job list` shows it.
    pub job_id: JobId,
}

#[derive(Debug, Clone, Args)]
pub struct JobStatusArgs {
    #[command(flatten)]
    pub job: JobIdArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct JobLogsArgs {
    #[command(flatten)]
    pub job: JobIdArgs,
    /// Keep printing new output until the job ends.
    #[arg(long, short)]
    pub follow: bool,
}

#[derive(Debug, Clone, Args)]
pub struct JobStopArgs {
    #[command(flatten)]
    pub job: JobIdArgs,
    /// How long the driver gets to exit after SIGTERM before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub grace_period: Duration,
}

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Deploy (or update) an application described by a YAML file, then
    /// print the deploy job's output and exit with its status.
    ///
    /// The file names `binary` (a build of your crate that registers the
    /// deployments and links raylet-serve; relative to the file's
    /// directory), the application's `name`, `route_prefix` and
    /// `deployments`. The binary runs as a job with the file shipped into
    /// its working directory and named in RAYLET_SERVE_DEPLOY_FILE; it
    /// deploys the application through the Serve controller and exits once
    /// it is RUNNING, or fails with the reason.
    Deploy(ServeDeployArgs),
    /// Show each application with its route and state, each deployment's
    /// replicas by state, load, requests and autoscaling decision, and the
    /// HTTP proxies.
    Status(StatusArgs),
    /// Delete an application: the controller stops its replicas and drops
    /// its routes; this waits until the application is gone.
    Delete(ServeDeleteArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeDeployArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The application's YAML file.
    #[arg(value_name = "FILE.yaml")]
    pub file: PathBuf,
    /// How long to wait for the application to be RUNNING, in seconds;
    /// past it the deploy job is left running and this fails.
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

#[derive(Debug, Clone, Args)]
pub struct ServeDeleteArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The application's name, as `raylet serve status` shows it.
    pub app: String,
    /// How long to wait for the controller to tear the application down, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// Which cluster a command talks to.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// The head's HOST:PORT [default: read from the latest session].
    #[arg(long, env = "RAYLET_ADDRESS", value_name = "HOST:PORT")]
    pub address: Option<String>,
    #[command(flatten)]
    pub session: SessionArgs,
}

impl ClusterArgs {
    /// The head's address (`--address`, or the latest session's head) and the token.
    pub fn head(&self) -> anyhow::Result<(String, AuthToken)> {
        let token = self.session.resolve_token()?;
        if let Some(address) = &self.address {
            return Ok((address.clone(), token));
        }
        let session = self.session.root().require_latest()?;
        let address = session.read_head_address()?.with_context(|| {
            format!(
                "{} has no head_address: no head runs in this session; pass --address",
                session.dir().display()
            )
        })?;
        Ok((address, token))
    }
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct StopArgs {
    /// Directory that holds the session directories.
    #[arg(long, env = "RAYLET_TEMP_DIR", default_value = DEFAULT_TEMP_DIR, value_name = "DIR")]
    pub temp_dir: PathBuf,
    /// Kill with SIGKILL at once instead of asking processes to exit.
    #[arg(long)]
    pub force: bool,
    /// How long processes get to exit after SIGTERM before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub grace_period: Duration,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([&["raylet"][..], args].concat())
    }

    #[test]
    fn durations_that_would_overflow_are_refused_not_panicked_on() {
        for (args, flag) in [
            (&["stop", "--grace-period", "300000000000y"][..], "--grace-period"),
            (
                &["start", "--head", "--heartbeat-interval", "300000000000y"],
                "--heartbeat-interval",
            ),
            (
                &["start", "--head", "--heartbeat-timeout", "11years"],
                "--heartbeat-timeout",
            ),
            (
                &["start", "--head", "--memory-monitor-interval", "300000000000y"],
                "--memory-monitor-interval",
            ),
            (
                &[
                    "job",
                    "stop",
                    "00000000000000000000000000000000",
                    "--grace-period",
                    "18446744073709551615s",
                ],
                "--grace-period",
            ),
        ] {
            let error = parse(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} was accepted"))
                .to_string();
            assert!(error.contains(flag), "{error}");
            assert!(error.contains("too long") || error.contains("overflow"), "{error}");
            println!("{args:?}: {}", error.lines().next().unwrap_or_default());
        }
        assert!(
            parse(&["stop", "--grace-period", "10years"]).is_ok(),
            "the longest allowed"
        );
    }

    #[test]
    fn a_zero_memory_monitor_interval_turns_it_off_and_other_zeros_are_refused() {
        let Ok(Cli {
            command: Command::Start(start),
            ..
        }) = parse(&["start", "--head", "--memory-monitor-interval", "0s"])
        else {
            panic!("--memory-monitor-interval 0s is refused");
        };
        assert!(start.memory_monitor_interval.is_zero());
        let error = parse(&["start", "--head", "--heartbeat-interval", "0s"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("longer than zero"), "{error}");
    }
}
