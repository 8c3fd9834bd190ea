//! Jobs on clusters of `raylet start` daemons: this test binary is also the
//! job, run on the cluster with the name of one of its ignored `driver_*`
//! tests as the argument. A job that runs tasks on every node succeeds
//! with their output in its logs, resubmitting uploads nothing, a stopped
//! job frees its resources, a driver that ignores SIGTERM is killed after
//! the grace period while its output streams, a panicking one fails with
//! its exit status and stderr, a binary that cannot run or a driver that
//! can never be placed fails clearly, shipped files land in the working
//! directory, two jobs name actors alike, two jobs at once share no worker
//! and their objects go with them, even from other nodes' stores when the
//! driver is killed, a job's owned actors end with it
//! while detached ones live on, the CLI does all of it, and a corrupt
//! upload is refused.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use raylet::prelude::*;
use raylet::resource_names::CPU;
use raylet::{Error, Job, JobClient, JobHandle, JobId, JobInfo, JobStatus, NodeId};
use raylet_proto::blob::blob_of_file;
use serde_bytes::ByteBuf;

use crate::common;

use common::ZonedCluster;

const PATIENCE: Duration = Duration::from_secs(60);

/// The pid of the node manager that runs this task, after a pause that
/// keeps the spread tasks apart; printed so that it reaches the job's logs.
#[raylet::remote]
fn report_node(pause_ms: u64) -> u32 {
    std::thread::sleep(Duration::from_millis(pause_ms));
    let node_manager = std::os::unix::process::parent_id();
    println!("task ran under node manager {node_manager}");
    node_manager
}

#[raylet::remote]
fn sleep_long() -> u32 {
    std::thread::sleep(Duration::from_secs(600));
    0
}

#[test]
#[ignore = "a job driver: `a_job_runs_tasks_on_every_node...` runs it on the cluster"]
fn driver_spread_over_nodes() {
    let cluster = raylet::init().unwrap();
    let refs: Vec<ObjectRef<u32>> = (0..3)
        .map(|_| {
            report_node::options()
                .scheduling_strategy(SchedulingStrategy::Spread)
                .remote(&cluster, 2000)
                .unwrap()
        })
        .collect();
    let nodes = cluster.get_all(&refs).unwrap();
    println!("the driver saw node managers {nodes:?}");
    cluster.shutdown().unwrap();
}

#[test]
#[ignore = "a job driver: `a_stopped_job...` runs it on the cluster"]
fn driver_runs_until_stopped() {
    let cluster = raylet::init().unwrap();
    let task = sleep_long::remote(&cluster).unwrap();
    println!("the driver waits for a task that sleeps");
    task.get().unwrap();
}

#[test]
#[ignore = "a job driver: `a_panicking_job...` runs it on the cluster"]
fn driver_panics() {
    eprintln!("about to give up");
    panic!("the driver gave up: out of ideas");
}

#[test]
#[ignore = "a job driver: `shipped_files...` runs it on the cluster"]
fn driver_reads_shipped_files() {
    for path in ["inputs/config.txt", "inputs/nested/data.txt", "notes.md"] {
        let text = std::fs::read_to_string(path).unwrap();
        println!("{path}: {text}");
    }
    println!("GREETING={}", std::env::var("GREETING").unwrap());
}

#[test]
#[ignore = "a job driver: `a_driver_that_ignores_sigterm...` runs it on the cluster"]
fn driver_ignores_sigterm() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.unwrap();
    println!("ready, ignoring SIGTERM");
    for tick in 0.. {
        println!("tick {tick}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Remembers the job that created it.
#[raylet::actor]
pub struct JobTag {
    job: String,
}

#[raylet::actor]
impl JobTag {
    pub fn new(job: String) -> Self {
        JobTag { job }
    }

    pub fn job(&self) -> String {
        self.job.clone()
    }
}

#[test]
#[ignore = "a job driver: `two_jobs_...` runs it on the cluster"]
fn driver_names_an_actor() {
    let cluster = raylet::init().unwrap();
    let job = std::env::var("RAYLET_JOB_ID").unwrap();
    JobTag::remote(&cluster, job.clone()).name("tag").spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let found = cluster.get_actor::<JobTag>("tag").unwrap();
    println!("the actor named tag holds job {}", found.job().get().unwrap());
    assert_eq!(found.job().get().unwrap(), job);
    cluster.shutdown().unwrap();
}

#[test]
#[ignore = "a job driver: `a_jobs_owned_actors_end_with_it...` runs it on the cluster"]
fn driver_leaves_actors_behind() {
    let cluster = raylet::init().unwrap();
    let job = std::env::var("RAYLET_JOB_ID").unwrap();
    let owned = JobTag::remote(&cluster, job.clone())
        .name("owned")
        .namespace("shared")
        .spawn()
        .unwrap();
    let detached = JobTag::remote(&cluster, job)
        .name("detached")
        .namespace("shared")
        .detached()
        .spawn()
        .unwrap();
    println!(
        "actors ready: {} {}",
        owned.job().get().unwrap(),
        detached.job().get().unwrap()
    );
}

/// The pid of the worker that runs it and the job id at the front of the
/// block it reads.
#[raylet::remote]
fn read_block(block: ByteBuf) -> (u32, String) {
    let job = String::from_utf8_lossy(&block[..32]).into_owned();
    (std::process::id(), job)
}

#[test]
#[ignore = "a job driver: `two_jobs_at_once_keep_their_objects...` runs it on the cluster"]
fn driver_keeps_its_objects() {
    let cluster = raylet::init().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while cluster
        .jobs()
        .unwrap()
        .iter()
        .filter(|job| job.status == JobStatus::Running)
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the other job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (block, workers) = put_a_block_read_on_every_node(&cluster);
    println!("workers {}", serde_json::to_string(&workers).unwrap());
    println!("block {}", serde_json::to_string(&block).unwrap());
    cluster.shutdown().unwrap();
}

#[test]
#[ignore = "a job driver: `a_killed_drivers_objects...` runs it on the cluster"]
fn driver_holds_a_block_until_killed() {
    let cluster = raylet::init().unwrap();
    let (block, _) = put_a_block_read_on_every_node(&cluster);
    println!("block {}", serde_json::to_string(&block).unwrap());
    std::thread::sleep(Duration::from_secs(600));
}

/// Puts a 4 MiB block that starts with the job's id and has two tasks on
/// each node with CPUs read it, so that every such node stores a copy;
/// returns the block and the pids of the workers that read it.
fn put_a_block_read_on_every_node(cluster: &Cluster) -> (ObjectRef<ByteBuf>, Vec<u32>) {
    let job = std::env::var("RAYLET_JOB_ID").unwrap();
    let mut bytes = job.clone().into_bytes();
    bytes.resize(4 << 20, 7);
    let block = cluster.put(&ByteBuf::from(bytes)).unwrap();
    let status = cluster.status().unwrap();
    let reads: Vec<ObjectRef<(u32, String)>> = status
        .alive()
        .filter(|node| node.total.get(CPU).as_f64() > 0.0)
        .flat_map(|node| [node.node_id; 2])
        .map(|node_id| {
            read_block::options()
                .scheduling_strategy(SchedulingStrategy::NodeAffinity { node_id, soft: false })
                .remote(cluster, &block)
                .unwrap()
        })
        .collect();
    let seen = cluster.get_all(&reads).unwrap();
    assert!(seen.iter().all(|(_, owner)| *owner == job), "{seen:?}");
    (block, seen.iter().map(|(pid, _)| *pid).collect())
}

/// A job that runs this test binary's `driver` test.
fn job(driver: &str) -> Job {
    Job::new(std::env::current_exe().unwrap()).args([driver, "--exact", "--ignored", "--nocapture"])
}

fn wait_for_status(handle: &JobHandle, status: JobStatus) -> JobInfo {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let info = handle.status().unwrap();
        if info.status == status {
            return info;
        }
        assert!(
            Instant::now() < deadline && !info.status.is_ended(),
            "job {} is {} ({}), not {status}; logs:\n{}",
            info.id,
            info.status,
            info.message,
            handle.logs().unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_cpus(cluster: &Cluster) -> f64 {
    cluster.status().unwrap().available().get(CPU).as_f64()
}

#[test]
fn a_job_runs_tasks_on_every_node_succeeds_and_its_logs_hold_their_output() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b", "c"]);
    let node_managers: Vec<u32> = ["a", "b", "c"].iter().map(|zone| nodes.node(zone).1).collect();
    let cluster = nodes.driver();

    let handle = cluster
        .submit(
            job("jobs::driver_spread_over_nodes")
                .name("spread")
                .metadata("owner", "tests"),
        )
        .unwrap();
    assert!(handle.uploaded_bytes() > 0, "the first submission uploads the binary");
    let done = handle.wait().unwrap();
    let logs = handle.logs().unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}\n{logs}");
    assert_eq!(done.exit_code, Some(0));
    for pid in &node_managers {
        assert!(
            logs.contains(&format!("task ran under node manager {pid}")),
            "node manager {pid} is missing from the logs:\n{logs}"
        );
    }
    let listed = cluster.jobs().unwrap();
    let entry = listed
        .iter()
        .find(|info| info.id == handle.id())
        .expect("the job is listed");
    assert_eq!((entry.name.as_str(), entry.status), ("spread", JobStatus::Succeeded));
    assert_eq!(entry.metadata.get("owner").map(String::as_str), Some("tests"));

    let again = cluster.submit(job("jobs::driver_spread_over_nodes")).unwrap();
    assert_eq!(again.uploaded_bytes(), 0, "the head has the binary already");
    assert_eq!(again.wait().unwrap().status, JobStatus::Succeeded);
    cluster.shutdown().unwrap();
}

#[test]
fn a_stopped_job_is_stopped_and_its_resources_come_back() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    let total = free_cpus(&cluster);

    let handle = cluster
        .submit(job("jobs::driver_runs_until_stopped").num_cpus(1.0))
        .unwrap();
    wait_for_status(&handle, JobStatus::Running);
    let deadline = Instant::now() + PATIENCE;
    while free_cpus(&cluster) > total - 2.0 {
        assert!(Instant::now() < deadline, "the driver and its task hold 2 CPUs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = Instant::now();
    handle.stop_with_grace(Duration::from_secs(1)).unwrap();
    let stopped = handle.wait().unwrap();
    assert_eq!(stopped.status, JobStatus::Stopped, "{stopped:?}");
    assert!(stopped.message.contains("stopped on request"), "{}", stopped.message);
    while free_cpus(&cluster) < total {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "every CPU is free again within seconds"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = handle.logs().unwrap();
    assert!(logs.contains("the driver waits for a task that sleeps"), "{logs}");
    cluster.shutdown().unwrap();
}

#[test]
fn a_panicking_job_fails_with_its_exit_status_and_stderr_tail() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a"]);
    let cluster = nodes.driver();
    let failed = cluster.submit(job("jobs::driver_panics")).unwrap().wait().unwrap();
    assert_eq!(failed.status, JobStatus::Failed, "{failed:?}");
    assert_eq!(failed.exit_code, Some(101), "a failed test binary exits with 101");
    assert!(failed.message.contains("exit code 101"), "{}", failed.message);
    assert!(
        failed.stderr_tail.contains("the driver gave up: out of ideas"),
        "{}",
        failed.stderr_tail
    );

    let not_a_binary = temp.path().join("notes.txt");
    std::fs::write(&not_a_binary, "not a program").unwrap();
    let refused = cluster.submit(Job::new(&not_a_binary)).unwrap().wait().unwrap();
    assert_eq!(refused.status, JobStatus::Failed, "{refused:?}");
    assert!(
        refused.message.contains("not an executable this node"),
        "{}",
        refused.message
    );
    cluster.shutdown().unwrap();
}

#[test]
fn shipped_files_and_directories_land_in_the_drivers_working_directory() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a"]);
    let cluster = nodes.driver();
    let inputs = temp.path().join("inputs");
    std::fs::create_dir_all(inputs.join("nested")).unwrap();
    std::fs::write(inputs.join("config.txt"), "epochs=3").unwrap();
    std::fs::write(inputs.join("nested/data.txt"), "1,2,3").unwrap();
    let notes = temp.path().join("notes.md");
    std::fs::write(&notes, "read me").unwrap();
    let job = job("jobs::driver_reads_shipped_files")
        .files([inputs, notes])
        .env("GREETING", "hello");
    let handle = cluster.submit(job).unwrap();
    let done = handle.wait().unwrap();
    let logs = handle.logs().unwrap();
    assert_eq!(done.status, JobStatus::Succeeded, "{done:?}\n{logs}");
    for line in [
        "inputs/config.txt: epochs=3",
        "inputs/nested/data.txt: 1,2,3",
        "notes.md: read me",
        "GREETING=hello",
    ] {
        assert!(logs.contains(line), "{line} is missing:\n{logs}");
    }
    assert!(handle.logs_tail(1).unwrap().len() < logs.len());
    let work = temp.path().join("session_latest/work");
    for node in std::fs::read_dir(&work).unwrap() {
        let job_dir = node.unwrap().path().join("jobs").join(handle.id().to_string());
        assert!(
            !job_dir.exists(),
            "{} is removed once the driver ended",
            job_dir.display()
        );
    }
    cluster.shutdown().unwrap();
}

#[test]
fn two_jobs_at_once_name_an_actor_alike_without_colliding() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    for (id, logs) in run_twice_at_once(&cluster, "jobs::driver_names_an_actor") {
        let own = format!("the actor named tag holds job {id}");
        assert!(logs.contains(&own), "{own} is missing:\n{logs}");
    }
    let Err(error) = cluster.get_actor::<JobTag>("tag") else {
        panic!("the jobs' actors died with them, and none was in this driver's namespace");
    };
    assert!(error.to_string().contains("tag"), "{error}");
    cluster.shutdown().unwrap();
}

/// Submits two jobs that run `driver` at once; returns their ids and logs
/// once both succeeded.
fn run_twice_at_once(cluster: &Cluster, driver: &str) -> Vec<(JobId, String)> {
    let handles: Vec<JobHandle> = (0..2).map(|_| cluster.submit(job(driver)).unwrap()).collect();
    let finished = |handle: &JobHandle| {
        let done = handle.wait().unwrap();
        let logs = handle.logs().unwrap();
        assert_eq!(done.status, JobStatus::Succeeded, "{done:?}\n{logs}");
        (handle.id(), logs)
    };
    handles.iter().map(finished).collect()
}

/// The JSON after `label ` on a line of the logs.
fn logged<T: serde::de::DeserializeOwned>(logs: &str, label: &str) -> T {
    let prefix = format!("{label} ");
    let line = logs
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no '{label}' line in:\n{logs}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn two_jobs_at_once_keep_their_objects_and_workers_apart_and_free_them_at_the_end() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    let mut workers = Vec::new();
    let mut blocks = Vec::new();
    for (_, logs) in run_twice_at_once(&cluster, "jobs::driver_keeps_its_objects") {
        workers.push(logged::<Vec<u32>>(&logs, "workers"));
        blocks.push(logged::<ObjectRef<ByteBuf>>(&logs, "block"));
    }
    assert!(
        workers[0].iter().all(|pid| !workers[1].contains(pid)),
        "no worker served both jobs: {workers:?}"
    );
    for block in &blocks {
        let Err(error) = block.get_timeout(Duration::from_secs(10)) else {
            panic!("a job's object is gone with its driver");
        };
        assert!(error.to_string().contains("unreachable"), "{error}");
    }
    let owners: Vec<&str> = blocks.iter().map(|block| block.owner_address()).collect();
    wait_until_no_store_holds_objects_of(&cluster, &owners);
    cluster.shutdown().unwrap();
}

/// The nodes whose stores hold objects that one of `owners` owns.
fn nodes_holding_objects_of(cluster: &Cluster, owners: &[&str]) -> Vec<NodeId> {
    let memory = cluster.memory().unwrap();
    let holds = |node: &&raylet::NodeMemory| {
        node.objects
            .iter()
            .any(|object| owners.contains(&object.owner.as_str()))
    };
    memory.iter().filter(holds).map(|node| node.node_id).collect()
}

fn wait_until_no_store_holds_objects_of(cluster: &Cluster, owners: &[&str]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let holding = nodes_holding_objects_of(cluster, owners);
        if holding.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nodes {holding:?} still store objects of {owners:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_drivers_objects_are_freed_on_every_node_that_stored_a_copy() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    let handle = cluster.submit(job("jobs::driver_holds_a_block_until_killed")).unwrap();
    let mut streamed = String::new();
    let mut output = handle.follow_logs();
    while !streamed.lines().any(|line| line.starts_with("block ")) {
        let chunk = output.next().expect("the driver prints its block").unwrap();
        streamed.push_str(&String::from_utf8_lossy(&chunk));
    }
    let block = logged::<ObjectRef<ByteBuf>>(&streamed, "block");
    let owners = [block.owner_address()];
    assert_eq!(
        nodes_holding_objects_of(&cluster, &owners).len(),
        2,
        "both nodes store a copy"
    );
    handle.stop_with_grace(Duration::ZERO).unwrap();
    assert_eq!(handle.wait().unwrap().status, JobStatus::Stopped);
    wait_until_no_store_holds_objects_of(&cluster, &owners);
    cluster.shutdown().unwrap();
}

#[test]
fn a_driver_that_ignores_sigterm_is_killed_after_the_grace_period_while_its_logs_stream() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a"]);
    let cluster = nodes.driver();
    let handle = cluster.submit(job("jobs::driver_ignores_sigterm")).unwrap();
    let mut streamed = String::new();
    let mut output = handle.follow_logs();
    while !streamed.contains("tick 3") {
        let chunk = output.next().expect("the output streams while the job runs").unwrap();
        streamed.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(streamed.contains("ready, ignoring SIGTERM"), "{streamed}");
    let asked = Instant::now();
    handle.stop_with_grace(Duration::from_secs(1)).unwrap();
    let rest: Vec<u8> = output.flat_map(Result::unwrap).collect();
    let stopped = handle.wait().unwrap();
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "SIGTERM alone did not end it"
    );
    assert_eq!(stopped.status, JobStatus::Stopped, "{stopped:?}");
    assert_eq!(stopped.signal, Some(9), "ended by SIGKILL: {stopped:?}");
    assert!(!rest.is_empty(), "the stream went on until the job ended");

    let too_big = cluster
        .submit(job("jobs::driver_panics").num_cpus(64.0))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(too_big.status, JobStatus::Failed, "{too_big:?}");
    assert!(too_big.message.contains("can never be placed"), "{}", too_big.message);
    cluster.shutdown().unwrap();
}

#[test]
fn a_jobs_owned_actors_end_with_it_and_detached_ones_live_on() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a", "b"]);
    let cluster = nodes.driver();
    let handle = cluster.submit(job("jobs::driver_leaves_actors_behind")).unwrap();
    let done = handle.wait().unwrap();
    assert_eq!(
        done.status,
        JobStatus::Succeeded,
        "{done:?}\n{}",
        handle.logs().unwrap()
    );
    let detached = cluster.get_actor_in::<JobTag>("shared", "detached").unwrap();
    assert_eq!(detached.job().get().unwrap(), handle.id().to_string());
    let deadline = Instant::now() + PATIENCE;
    while cluster.get_actor_in::<JobTag>("shared", "owned").is_ok() {
        assert!(Instant::now() < deadline, "the job's owned actor ends with its driver");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.shutdown().unwrap();
}

#[test]
fn a_corrupt_or_overlong_upload_is_refused_and_a_good_one_is_stored_once() {
    let temp = tempfile::tempdir().unwrap();
    let nodes = ZonedCluster::start(temp.path(), &["a"]);
    let token = raylet::session::TempRoot::new(temp.path())
        .require_latest()
        .unwrap()
        .read_token()
        .unwrap()
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(JobClient::connect(&nodes.head, &token)).unwrap();
    let file: PathBuf = temp.path().join("model.bin");
    std::fs::write(&file, vec![7u8; 3 << 20]).unwrap();
    let honest = blob_of_file(&file).unwrap();
    let lying = "0".repeat(64);
    let error = runtime.block_on(client.upload(&file, &lying, honest.size)).unwrap_err();
    assert!(
        matches!(&error, Error::Cluster(raylet::ClusterError::InvalidArgument(m)) if m.contains("does not match")),
        "{error}"
    );
    let short = runtime.block_on(client.upload(&file, &honest.sha256, honest.size - 1));
    let error = short.unwrap_err();
    assert!(error.to_string().contains("more than the"), "{error}");
    let upload = || runtime.block_on(client.upload(&file, &honest.sha256, honest.size));
    assert_eq!(upload().unwrap(), 3 << 20);
    assert_eq!(upload().unwrap(), 0, "a blob the head has is not stored twice");
}

/// Runs `raylet job ARGS` against the cluster in `temp`, with `entrypoint`
/// after `--`; returns its exit code, stdout and stderr.
fn raylet_job(temp: &std::path::Path, args: &[&str], entrypoint: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(common::RAYLET);
    command.arg("job").args(args).arg("--temp-dir").arg(temp);
    if !entrypoint.is_empty() {
        command.arg("--").args(entrypoint);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_cli_submits_and_follows_a_job_exits_with_its_status_and_lists_it() {
    let temp = tempfile::tempdir().unwrap();
    let _nodes = ZonedCluster::start(temp.path(), &["a", "b", "c"]);
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let driver = |name| [exe, name, "--exact", "--ignored", "--nocapture"];

    let (code, stdout, stderr) = raylet_job(
        temp.path(),
        &["submit", "--name", "cli"],
        &driver("jobs::driver_spread_over_nodes"),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("task ran under node manager").count(), 3, "{stdout}");
    assert!(stderr.contains("SUCCEEDED"), "{stderr}");

    let (code, stdout, stderr) = raylet_job(temp.path(), &["submit"], &driver("jobs::driver_panics"));
    assert_eq!(code, 101, "the driver's exit code: {stdout}\n{stderr}");
    let failed_id = stderr
        .split_whitespace()
        .nth(1)
        .expect("the first line names the job")
        .to_string();
    let (code, status, _) = raylet_job(temp.path(), &["status", &failed_id], &[]);
    assert_eq!(code, 0);
    assert!(status.contains("FAILED") && status.contains("out of ideas"), "{status}");

    let (code, listed, _) = raylet_job(temp.path(), &["list", "--format", "json"], &[]);
    assert_eq!(code, 0);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let jobs = listed.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{listed}");
    assert_eq!(
        (jobs[0]["name"].as_str(), jobs[0]["status"].as_str()),
        (Some("cli"), Some("SUCCEEDED"))
    );
    assert_eq!(jobs[1]["status"], "FAILED");
    let failed: serde_json::Value = serde_json::from_str(&common::raylet(
        temp.path(),
        &["list", "jobs", "--filter", "status=failed", "--format", "json"],
    ))
    .unwrap();
    assert_eq!(failed.as_array().unwrap().len(), 1, "{failed}");
    assert_eq!(failed[0]["id"], jobs[1]["id"]);

    let (code, id, stderr) = raylet_job(
        temp.path(),
        &["submit", "--no-wait"],
        &driver("jobs::driver_runs_until_stopped"),
    );
    assert_eq!(code, 0, "{stderr}");
    let id = id.trim().to_string();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (code, logs, stderr) = raylet_job(temp.path(), &["logs", &id], &[]);
        assert_eq!(code, 0, "{stderr}");
        if logs.contains("the driver waits") {
            break;
        }
        assert!(Instant::now() < deadline, "the driver never started: {logs}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let follower = std::process::Command::new(common::RAYLET)
        .args(["job", "logs", "--follow", &id, "--temp-dir"])
        .arg(temp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (code, stopped, stderr) = raylet_job(temp.path(), &["stop", &id, "--grace-period", "1s"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stopped.contains("STOPPED"), "{stopped}");
    let followed = follower.wait_with_output().unwrap();
    assert!(followed.status.success(), "`job logs --follow` ends with the job");
    let followed = String::from_utf8_lossy(&followed.stdout);
    assert!(followed.contains("the driver waits"), "{followed}");
}

#[test]
fn a_job_waits_for_room_for_its_driver_and_uploads_over_the_limit_are_refused() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = common::Daemons(temp.path());
    common::raylet(
        temp.path(),
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--num-cpus",
            "2",
            "--max-upload-bytes",
            "1000000000",
        ],
    );
    let head = common::head_address(temp.path());
    let cluster = raylet::init_with(raylet::Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let too_big = temp.path().join("big.bin");
    std::fs::File::create(&too_big).unwrap().set_len(1_000_000_001).unwrap();
    let error = cluster
        .submit(Job::new(&too_big))
        .err()
        .expect("an upload over the limit is refused");
    assert!(
        matches!(&error, Error::Cluster(raylet::ClusterError::ResourceExhausted(m)) if m.contains("more than the limit")),
        "{error}"
    );

    let first = cluster
        .submit(job("jobs::driver_runs_until_stopped").num_cpus(1.5))
        .unwrap();
    wait_for_status(&first, JobStatus::Running);
    let second = cluster
        .submit(job("jobs::driver_runs_until_stopped").num_cpus(1.5))
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let waiting = second.status().unwrap();
    assert_eq!(
        waiting.status,
        JobStatus::Pending,
        "no room for a second driver: {waiting:?}"
    );
    first.stop_with_grace(Duration::from_secs(1)).unwrap();
    wait_for_status(&second, JobStatus::Running);
    second.stop_with_grace(Duration::from_secs(1)).unwrap();
    assert_eq!(second.wait().unwrap().status, JobStatus::Stopped);
    cluster.shutdown().unwrap();
}
