//! The `slurm` provider: each node is a Slurm batch job of one task whose
//! script `exec`s `raylet start --address HEAD --block`. It is submitted
//! with `sbatch --parsable`, the script on stdin and the token in the job's
//! environment (sbatch exports the submitter's), asking for the node
//! type's CPUs, memory and GPUs; the instance id is the job id, which the
//! script puts in the node's instance label.
//!
//! Jobs are named `raylet-<cluster>-<node type>` and carry the comment
//! `raylet-cluster=<cluster>`: `instances()` finds this cluster's jobs in
//! `squeue` by that comment, those an earlier head launched included. A
//! pending job counts as running (its node is launching). A job that ended
//! without `terminate` (it failed, reached its time limit, was cancelled
//! by someone else, or `squeue` no longer lists it) is failed, with its
//! final state and the end of its output file, until it is terminated.
//! `terminate` is `scancel`: Slurm sends SIGTERM, then SIGKILL after the
//! cluster's KillWait.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use raylet_placement::autoscaler::NodeType;
use raylet_proto::ResourceSet;
use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::cluster_name::{ClusterNameError, check_cluster_name};
use crate::command_error::{self, CommandError};
use crate::output_tail::output_tail;
use crate::provider::{
    Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderCall, ProviderError, TOKEN_ENV,
    start_flags,
};

/// How long one `sbatch`, `squeue` or `scancel` may take: they retry on
/// their own while slurmctld does not answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Stands for the job id in the script's words, where the shell puts
/// `$SLURM_JOB_ID` instead.
const JOB_ID_PLACEHOLDER: &str = "\u{0}SLURM_JOB_ID\u{0}";
/// Between the fields `squeue` prints: no job name or comment holds it.
const FIELD_SEPARATOR: &str = "\u{1f}";
/// The states of a job that has ended (or is ending: COMPLETING), whose
/// node is gone; every other state (PENDING, RUNNING, SUSPENDED, ...) is a
/// node launching or running.
const ENDED_STATES: [&str; 12] = [
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "COMPLETING",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "SPECIAL_EXIT",
    "TIMEOUT",
];
const MIB: f64 = 1024.0 * 1024.0;

/// Where and how the nodes' jobs run: the `provider:` section of a cluster
/// config with `type: slurm`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmConfig {
    /// The partition the jobs run in (`sbatch --partition`); by default the
    /// Slurm cluster's default partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The account the jobs are charged to (`--account`); by default the
    /// user's default account.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The jobs' time limit (`--time`), e.g. `"1-00:00:00"`; by default the
    /// partition's. A node whose job reaches it ends and is listed failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// More `sbatch` arguments, after the provider's own, e.g.
    /// `["--qos=long", "--constraint=ib"]`. They must keep the submitter's
    /// environment exported (`--export=ALL`, Slurm's default): the token
    /// travels in it.
    pub sbatch_args: Vec<String>,
    /// The `raylet` binary on the compute nodes; by default this process's
    /// own executable, for compute nodes that share its file system.
    pub binary: PathBuf,
    /// The nodes' `--temp-dir`; by default raylet's own (`/tmp/raylet`, on
    /// each compute node's local disk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temp_dir: Option<PathBuf>,
    /// Where each job writes its output, as
    /// `raylet-<cluster>-<node type>-<job id>.log`: a directory that the
    /// compute nodes and the head share, so that a failed node's reason
    /// can quote its output. A relative path is taken from the head's
    /// working directory; it is made if missing.
    pub output_dir: PathBuf,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            partition: None,
            account: None,
            time_limit: None,
            sbatch_args: Vec::new(),
            binary: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("raylet")),
            temp_dir: None,
            output_dir: PathBuf::from("raylet-slurm-logs"),
        }
    }
}

/// Why a [`SlurmProvider`] cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    ClusterName(#[from] ClusterNameError),
    #[error("the jobs' output directory {path} cannot be made: {source}")]
    OutputDir { path: PathBuf, source: std::io::Error },
}

/// Nodes as Slurm batch jobs of one cluster.
pub struct SlurmProvider {
    cluster: String,
    config: SlurmConfig,
    /// This cluster's jobs that this provider launched or found in
    /// `squeue` and has not terminated, with their node types' names.
    jobs: Mutex<BTreeMap<InstanceId, String>>,
}

impl SlurmProvider {
    /// A provider for the nodes of `cluster_name`; makes the output
    /// directory. Slurm itself is first asked at the first call.
    pub fn new(cluster_name: &str, mut config: SlurmConfig) -> Result<Self, SlurmError> {
        check_cluster_name(cluster_name)?;
        let output_dir_error = |source| SlurmError::OutputDir {
            path: config.output_dir.clone(),
            source,
        };
        let output_dir = std::path::absolute(&config.output_dir).map_err(output_dir_error)?;
        std::fs::create_dir_all(&output_dir).map_err(output_dir_error)?;
        config.output_dir = output_dir;
        Ok(SlurmProvider {
            cluster: cluster_name.to_string(),
            config,
            jobs: Mutex::new(BTreeMap::new()),
        })
    }

    /// The name of the jobs of nodes of type `node_type`.
    fn job_name(&self, node_type: &str) -> String {
        format!("{}{node_type}", self.job_name_prefix())
    }

    /// The file the job `instance` of type `node_type` writes its output to.
    fn output_path(&self, node_type: &str, instance: &InstanceId) -> PathBuf {
        let file = format!("{}-{instance}.log", self.job_name(node_type));
        self.config.output_dir.join(file)
    }

    fn job_name_prefix(&self) -> String {
        format!("raylet-{}-", self.cluster)
    }

    /// The comment that marks this cluster's jobs.
    fn comment(&self) -> String {
        format!("raylet-cluster={}", self.cluster)
    }

    /// Everything `sbatch` is given but the script.
    fn sbatch_args(&self, node_type: &NodeType) -> Vec<String> {
        let name = self.job_name(&node_type.name);
        let output = self.config.output_dir.join(format!("{name}-"));
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name={name}"),
            format!("--comment={}", self.comment()),
            format!("--output={}%j.log", escape_filename_pattern(&output)),
            "--nodes=1".to_string(),
            "--ntasks=1".to_string(),
            "--export=ALL".to_string(),
        ];
        args.extend(allocation_args(&node_type.resources));
        let optional = [
            ("--partition", &self.config.partition),
            ("--account", &self.config.account),
            ("--time", &self.config.time_limit),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                args.push(format!("{flag}={value}"));
            }
        }
        args.extend(self.config.sbatch_args.iter().cloned());
        args
    }

    /// The batch script: `exec` of `raylet start`, whose instance label is
    /// the job's id.
    fn batch_script(&self, request: &LaunchRequest) -> String {
        let mut words = vec![self.config.binary.to_string_lossy().into_owned()];
        words.extend(start_flags(request, &InstanceId(JOB_ID_PLACEHOLDER.into())));
        if let Some(temp_dir) = &self.config.temp_dir {
            words.extend(["--temp-dir".to_string(), temp_dir.to_string_lossy().into_owned()]);
        }
        let command: Vec<String> = words.iter().map(|word| shell_word(word)).collect();
        format!(
            "#!/bin/bash\n# A raylet node launched by the autoscaler; its instance id is this job's id.\nexec {}\n",
            command.join(" ")
        )
    }

    async fn submit(&self, request: &LaunchRequest) -> Result<InstanceId, ProviderError> {
        let node_type = &request.node_type.name;
        let launch_error = |error: &dyn std::error::Error| ProviderError::Launch {
            node_type: node_type.clone(),
            message: error.to_string(),
        };
        let mut sbatch = Command::new("sbatch");
        sbatch
            .args(self.sbatch_args(&request.node_type))
            .env(TOKEN_ENV, &request.token);
        let printed = run(sbatch, Some(&self.batch_script(request)))
            .await
            .map_err(|e| launch_error(&e))?;
        let instance = parse_job_id(&printed).map_err(|e| launch_error(&e))?;
        tracing::info!(%instance, %node_type, cluster = %self.cluster, "submitted a Slurm job for a node");
        self.lock().insert(instance.clone(), node_type.clone());
        Ok(instance)
    }

    /// This cluster's jobs as `squeue` lists them, ended ones included.
    async fn queued_jobs(&self) -> Result<BTreeMap<InstanceId, QueuedJob>, CommandError> {
        let format = ["%i", "%T", "%r", "%k", "%j"].join(FIELD_SEPARATOR);
        let mut squeue = Command::new("squeue");
        squeue.args(["--me", "--noheader", "--states=all", &format!("--format={format}")]);
        let printed = run(squeue, None).await?;
        let comment = self.comment();
        let ours = printed
            .lines()
            .filter_map(QueuedJob::parse)
            .filter(|job| job.comment == comment);
        Ok(ours.map(|job| (job.id.clone(), job)).collect())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let queued = self
            .queued_jobs()
            .await
            .map_err(|e| ProviderError::List(e.to_string()))?;
        let jobs = self.adopt(&queued);
        let listed = jobs.into_iter().map(|(id, node_type)| Instance {
            state: self.state(&id, &node_type, queued.get(&id)),
            id,
            node_type,
        });
        Ok(listed.collect())
    }

    /// Takes on the running jobs of this cluster that an earlier provider
    /// launched; returns every job known.
    fn adopt(&self, queued: &BTreeMap<InstanceId, QueuedJob>) -> BTreeMap<InstanceId, String> {
        let prefix = self.job_name_prefix();
        let mut jobs = self.lock();
        for (id, job) in queued.iter().filter(|(_, job)| !job.has_ended()) {
            if let Some(node_type) = job.name.strip_prefix(&prefix)
                && !jobs.contains_key(id)
            {
                tracing::info!(instance = %id, %node_type, "found a running Slurm job of this cluster");
                jobs.insert(id.clone(), node_type.to_string());
            }
        }
        jobs.clone()
    }

    /// The state of a known job, from its row of `squeue` if it has one.
    fn state(&self, instance: &InstanceId, node_type: &str, queued: Option<&QueuedJob>) -> InstanceState {
        let how = match queued {
            Some(job) if !job.has_ended() => return InstanceState::Running,
            Some(job) => job.describe_end(),
            None => "squeue no longer lists it".to_string(),
        };
        let output = self.output_path(node_type, instance);
        InstanceState::Failed(format!(
            "Slurm job {instance} ended without being terminated ({how}); its output ({}) ends: {}",
            output.display(),
            output_tail(&output)
        ))
    }

    async fn cancel(&self, instance: &InstanceId) -> Result<(), ProviderError> {
        let known = self.lock().remove(instance).is_some();
        if !known && !self.is_queued(instance).await? {
            return Err(ProviderError::NoSuchInstance(instance.clone()));
        }
        let mut scancel = Command::new("scancel");
        scancel.arg(&instance.0);
        run(scancel, None).await.map_err(|e| ProviderError::Terminate {
            instance: instance.clone(),
            message: e.to_string(),
        })?;
        tracing::info!(%instance, cluster = %self.cluster, "cancelled the Slurm job of a node");
        Ok(())
    }

    /// Whether `squeue` lists `instance` as a job of this cluster that has
    /// not ended.
    async fn is_queued(&self, instance: &InstanceId) -> Result<bool, ProviderError> {
        let queued = self.queued_jobs().await.map_err(|e| ProviderError::Terminate {
            instance: instance.clone(),
            message: e.to_string(),
        })?;
        Ok(queued.get(instance).is_some_and(|job| !job.has_ended()))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<InstanceId, String>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl NodeProvider for SlurmProvider {
    fn launch<'a>(&'a self, request: &'a LaunchRequest) -> ProviderCall<'a, InstanceId> {
        Box::pin(self.submit(request))
    }

    fn instances(&self) -> ProviderCall<'_, Vec<Instance>> {
        Box::pin(self.list())
    }

    fn terminate<'a>(&'a self, instance: &'a InstanceId) -> ProviderCall<'a, ()> {
        Box::pin(self.cancel(instance))
    }
}

/// One row of `squeue`.
#[derive(Debug, PartialEq)]
struct QueuedJob {
    id: InstanceId,
    state: String,
    reason: String,
    comment: String,
    name: String,
}

impl QueuedJob {
    /// Reads `id␟state␟reason␟comment␟name`.
    fn parse(line: &str) -> Option<QueuedJob> {
        let mut fields = line.splitn(5, FIELD_SEPARATOR);
        let mut next = || fields.next().map(str::to_string);
        Some(QueuedJob {
            id: InstanceId(next()?),
            state: next()?,
            reason: next()?,
            comment: next()?,
            name: next()?,
        })
    }

    fn has_ended(&self) -> bool {
        ENDED_STATES.contains(&self.state.as_str())
    }

    /// `state FAILED, reason NonZeroExitCode`, without the reason when
    /// Slurm gives none. A job cancelled while it ran is COMPLETING for a
    /// while, then CANCELLED.
    fn describe_end(&self) -> String {
        match self.reason.as_str() {
            "" | "None" => format!("state {}", self.state),
            reason => format!("state {}, reason {reason}", self.state),
        }
    }
}

/// `--cpus-per-task`, `--mem` and `--gres` for a node with `resources`: its
/// CPUs (at least one, which Slurm requires), its memory and object store
/// together in MiB when it names either, and its GPUs when it has any.
fn allocation_args(resources: &ResourceSet) -> Vec<String> {
    let cpus = resources.get(CPU).as_f64().ceil().max(1.0) as u64;
    let mut args = vec![format!("--cpus-per-task={cpus}")];
    let bytes = resources.get(MEMORY).as_f64() + resources.get(OBJECT_STORE_MEMORY).as_f64();
    if bytes > 0.0 {
        args.push(format!("--mem={}M", (bytes / MIB).ceil() as u64));
    }
    let gpus = resources.get(GPU).as_f64().ceil() as u64;
    if gpus > 0 {
        args.push(format!("--gres=gpu:{gpus}"));
    }
    args
}

/// `path` with its `%` doubled, so that Slurm's `--output` takes it as it is.
fn escape_filename_pattern(path: &Path) -> String {
    path.to_string_lossy().replace('%', "%%")
}

/// `word` as one bash word: single-quoted, with [`JOB_ID_PLACEHOLDER`] as
/// `"$SLURM_JOB_ID"`.
fn shell_word(word: &str) -> String {
    let quoted: Vec<String> = word
        .split(JOB_ID_PLACEHOLDER)
        .map(|part| format!("'{}'", part.replace('\'', r"'\''")))
        .collect();
    quoted.join("\"$SLURM_JOB_ID\"")
}

/// What `sbatch --parsable` printed when it printed no job id.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("sbatch printed no job id: `{0}`")]
struct NoJobId(String);

/// The job id from what `sbatch --parsable` printed: `ID` or `ID;CLUSTER`.
fn parse_job_id(printed: &str) -> Result<InstanceId, NoJobId> {
    let id = printed.trim().split(';').next().unwrap_or_default();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return Err(NoJobId(printed.trim().to_string()));
    }
    Ok(InstanceId(id.to_string()))
}

/// Runs `command` (with `stdin` written to it) and returns its output, or
/// says how it failed, with what it wrote to stderr.
async fn run(mut command: Command, stdin: Option<&str>) -> Result<String, CommandError> {
    let program = command.as_std().get_program().to_string_lossy().into_owned();
    command
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| CommandError::Spawn {
        command: program.clone(),
        source,
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .await
            .map_err(|source| CommandError::Stdin {
                command: program.clone(),
                source,
            })?;
    }
    let output = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| CommandError::Timeout {
            command: program.clone(),
            timeout: COMMAND_TIMEOUT,
        })?
        .map_err(|source| CommandError::Wait {
            command: program.clone(),
            source,
        })?;
    command_error::printed(&program, output)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use raylet_proto::{Amount, Labels};

    use super::*;

    fn provider(config: SlurmConfig) -> SlurmProvider {
        SlurmProvider {
            cluster: "prod".into(),
            config,
            jobs: Mutex::new(BTreeMap::new()),
        }
    }

    fn gpu_type() -> NodeType {
        NodeType {
            name: "gpu".into(),
            resources: ResourceSet::new()
                .with(CPU, Amount::whole(8))
                .with(GPU, Amount::whole(2))
                .with(MEMORY, Amount::whole(3 << 30))
                .with(OBJECT_STORE_MEMORY, Amount::whole(1 << 30)),
            labels: Labels::from([("pool".to_string(), "it's".to_string())]),
            min_count: 0,
            max_count: 2,
            idle_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_job_asks_for_the_node_types_resources_and_the_configured_place() {
        let config = SlurmConfig {
            partition: Some("gpu".into()),
            time_limit: Some("2:00:00".into()),
            sbatch_args: vec!["--qos=long".into()],
            output_dir: "/shared/100%/logs".into(),
            ..SlurmConfig::default()
        };
        let args = provider(config).sbatch_args(&gpu_type());
        let expected = [
            "--parsable",
            "--job-name=raylet-prod-gpu",
            "--comment=raylet-cluster=prod",
            "--output=/shared/100%%/logs/raylet-prod-gpu-%j.log",
            "--nodes=1",
            "--ntasks=1",
            "--export=ALL",
            "--cpus-per-task=8",
            "--mem=4096M",
            "--gres=gpu:2",
            "--partition=gpu",
            "--time=2:00:00",
            "--qos=long",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn a_type_without_cpus_or_memory_asks_one_cpu_and_the_default_memory() {
        assert_eq!(allocation_args(&ResourceSet::new()), ["--cpus-per-task=1"]);
    }

    #[test]
    fn the_script_execs_raylet_start_labelled_with_the_job_id_and_no_token() {
        let config = SlurmConfig {
            binary: "/opt/raylet bin/raylet".into(),
            temp_dir: Some("/scratch/raylet".into()),
            ..SlurmConfig::default()
        };
        let request = LaunchRequest {
            node_type: gpu_type(),
            head_address: "10.0.0.1:6380".into(),
            token: "secret-token".into(),
        };
        let script = provider(config).batch_script(&request);
        assert!(script.starts_with("#!/bin/bash\n"), "{script}");
        let exec = script.lines().last().unwrap();
        assert!(
            exec.starts_with("exec '/opt/raylet bin/raylet' 'start' '--address' '10.0.0.1:6380' '--block'"),
            "{exec}"
        );
        assert!(
            exec.contains(r#"'--labels' 'pool=it'\''s,raylet.io/instance='"$SLURM_JOB_ID"''"#),
            "{exec}"
        );
        assert!(exec.ends_with("'--temp-dir' '/scratch/raylet'"), "{exec}");
        assert!(!script.contains("secret-token"), "{script}");
    }

    #[test]
    fn reads_job_ids_and_squeue_rows() {
        assert_eq!(parse_job_id("1234\n"), Ok(InstanceId("1234".into())));
        assert_eq!(parse_job_id("1234;west\n"), Ok(InstanceId("1234".into())));
        assert_eq!(parse_job_id(" x;west\n"), Err(NoJobId("x;west".into())));
        assert!(parse_job_id("").unwrap_err().to_string().contains("no job id"));

        let row = [
            "77",
            "FAILED",
            "NonZeroExitCode",
            "raylet-cluster=prod",
            "raylet-prod-a\u{1f}b",
        ]
        .join(FIELD_SEPARATOR);
        let job = QueuedJob::parse(&row).unwrap();
        assert_eq!(job.id, InstanceId("77".into()));
        assert_eq!(job.name, "raylet-prod-a\u{1f}b");
        assert!(job.has_ended());
        assert_eq!(job.describe_end(), "state FAILED, reason NonZeroExitCode");
        assert_eq!(QueuedJob::parse("77\u{1f}RUNNING"), None);
    }

    #[test]
    fn pending_and_running_jobs_are_running_and_others_of_the_cluster_are_adopted() {
        let slurm = provider(SlurmConfig::default());
        let queued = |id: &str, state: &str, comment: &str, name: &str| QueuedJob {
            id: InstanceId(id.into()),
            state: state.into(),
            reason: "None".into(),
            comment: comment.into(),
            name: name.into(),
        };
        let rows = [
            queued("1", "PENDING", "raylet-cluster=prod", "raylet-prod-cpu2"),
            queued("2", "CANCELLED", "raylet-cluster=prod", "raylet-prod-cpu2"),
            queued("3", "RUNNING", "raylet-cluster=prod", "raylet-prod-gpu-big"),
        ];
        let queued: BTreeMap<_, _> = rows.into_iter().map(|job| (job.id.clone(), job)).collect();
        let adopted = slurm.adopt(&queued);
        let expected = BTreeMap::from([
            (InstanceId("1".into()), "cpu2".to_string()),
            (InstanceId("3".into()), "gpu-big".to_string()),
        ]);
        assert_eq!(adopted, expected, "an ended job it did not launch is not taken on");
        let id = InstanceId("1".into());
        assert_eq!(slurm.state(&id, "cpu2", queued.get(&id)), InstanceState::Running);
        let gone = InstanceId("9".into());
        let InstanceState::Failed(reason) = slurm.state(&gone, "cpu2", None) else {
            panic!("a job squeue no longer lists has failed");
        };
        assert!(
            reason.starts_with("Slurm job 9 ended without being terminated (squeue no longer lists it)"),
            "{reason}"
        );
        assert!(reason.contains("raylet-prod-cpu2-9.log"), "{reason}");
    }

    #[test]
    fn the_config_has_defaults_and_refuses_unknown_fields() {
        let config: SlurmConfig = serde_json::from_str(r#"{"partition": "batch"}"#).unwrap();
        assert_eq!(config.partition.as_deref(), Some("batch"));
        assert_eq!(config.output_dir, PathBuf::from("raylet-slurm-logs"));
        assert_eq!(config.binary, std::env::current_exe().unwrap());
        let unknown = serde_json::from_str::<SlurmConfig>(r#"{"partitions": "batch"}"#).unwrap_err();
        assert!(unknown.to_string().contains("unknown field `partitions`"), "{unknown}");
    }

    #[test]
    fn refuses_a_cluster_name_that_does_not_fit_a_job_name() {
        let refused = SlurmProvider::new("a b", SlurmConfig::default()).err().unwrap();
        assert!(refused.to_string().contains("`a b`"), "{refused}");
    }
}
