//! The `slurm` node provider against a real Slurm (`.ci/slurm.sh` runs a
//! one-machine one) and a real `raylet start` head: a node launched as a
//! batch job joins with its type's resources and labels and its job id as
//! its instance, is listed running (by a restarted provider too, and by no
//! other cluster's), and terminating cancels the job and the node leaves
//! (a provider that did not cancel it lists it failed until it terminates
//! it too); a job whose binary does not exist is listed failed with the
//! reason from its output, and a node larger than Slurm can give fails to
//! launch with sbatch's error. Through `raylet up`, waiting tasks make the
//! autoscaler submit jobs whose nodes run them, and idle ones are
//! cancelled. Under CI it must run; elsewhere it is skipped without Slurm.

use std::process::Command;
use std::time::Duration;

use raylet_autoscaler::{Instance, InstanceState, LaunchRequest, NodeProvider, SlurmConfig, SlurmProvider};
use raylet_proto::Amount;
use raylet_test_support::Need;
use tokio::runtime::Runtime;

use crate::autoscaler_cluster::UpCluster;
use crate::common::http::session_file;
use crate::common::providers::{assert_cpu2_node, cpu2_node_type, instance_node, wait_for};
use crate::common::{Daemons, RAYLET, head_address, raylet};

/// How long a job may take to be scheduled and join, or to leave.
const PATIENCE: Duration = Duration::from_secs(60);

/// Whether a Slurm controller answers here; `false` only where none does
/// and the run leaves Slurm out (else the test fails, saying why).
fn slurm_available() -> bool {
    let ping = Command::new("scontrol").arg("ping").output();
    let reason = match ping {
        Ok(output) if String::from_utf8_lossy(&output.stdout).contains("is UP") => return true,
        Ok(output) => format!(
            "`scontrol ping` says: {}",
            String::from_utf8_lossy(&output.stdout).trim()
        ),
        Err(e) => format!("`scontrol` cannot be run ({e}): Slurm is not installed"),
    };
    raylet_test_support::missing(Need::Slurm, &reason);
    false
}

/// The ids of the jobs of the cluster `cluster` that `squeue` lists: those
/// not yet ended (and completing), or with `ended`, ended ones too.
fn cluster_jobs(cluster: &str, ended: bool) -> Vec<String> {
    let mut squeue = Command::new("squeue");
    squeue.args(["--me", "--noheader", "--format=%i %k"]);
    if ended {
        squeue.arg("--states=all");
    }
    let output = squeue.output().unwrap();
    let comment = format!("raylet-cluster={cluster}");
    let listed = String::from_utf8_lossy(&output.stdout).into_owned();
    let ours = listed.lines().filter_map(|line| line.split_once(' '));
    ours.filter(|(_, job_comment)| *job_comment == comment)
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Cancels the test's jobs even when an assertion fails.
struct CancelJobs {
    cluster: String,
}

impl Drop for CancelJobs {
    fn drop(&mut self) {
        let jobs = cluster_jobs(&self.cluster, true);
        if !jobs.is_empty() {
            let _ = Command::new("scancel").args(jobs).output();
        }
    }
}

#[test]
fn a_slurm_job_joins_as_a_node_with_its_types_resources_and_is_cancelled_when_terminated() {
    if !slurm_available() {
        return;
    }
    let cluster = format!("rls{}", std::process::id());
    let _jobs = CancelJobs {
        cluster: cluster.clone(),
    };
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "0"]);
    let config = SlurmConfig {
        binary: RAYLET.into(),
        temp_dir: Some(temp.path().into()),
        output_dir: temp.path().join("slurm"),
        ..SlurmConfig::default()
    };
    let provider = SlurmProvider::new(&cluster, config.clone()).unwrap();
    let request = LaunchRequest {
        node_type: cpu2_node_type(),
        head_address: head_address(temp.path()),
        token: session_file(temp.path(), "token"),
    };
    let runtime = Runtime::new().unwrap();

    let instance = runtime.block_on(provider.launch(&request)).unwrap();
    assert!(instance.0.chars().all(|c| c.is_ascii_digit()), "a job id: {instance}");
    assert_eq!(
        cluster_jobs(&cluster, true),
        vec![instance.0.clone()],
        "its job is in squeue"
    );
    let node = wait_for("the job's node to join", PATIENCE, || {
        instance_node(temp.path(), &instance)
    });
    assert_cpu2_node(&node);
    let running = vec![Instance {
        id: instance.clone(),
        node_type: "cpu2".into(),
        state: InstanceState::Running,
    }];
    assert_eq!(runtime.block_on(provider.instances()).unwrap(), running);
    let restarted = SlurmProvider::new(&cluster, config.clone()).unwrap();
    assert_eq!(
        runtime.block_on(restarted.instances()).unwrap(),
        running,
        "a restarted head's provider finds the job in squeue"
    );
    let other = SlurmProvider::new(&format!("{cluster}-other"), config.clone()).unwrap();
    assert!(runtime.block_on(other.instances()).unwrap().is_empty());

    runtime.block_on(provider.terminate(&instance)).unwrap();
    assert!(runtime.block_on(provider.instances()).unwrap().is_empty());
    let cancelled_elsewhere = runtime.block_on(restarted.instances()).unwrap();
    assert!(
        matches!(&cancelled_elsewhere[..], [Instance { state: InstanceState::Failed(reason), .. }]
            if reason.starts_with(&format!("Slurm job {instance} ended without being terminated")) && reason.contains("CANCELLED")),
        "a job cancelled by another is failed: {cancelled_elsewhere:?}"
    );
    runtime.block_on(restarted.terminate(&instance)).unwrap();
    assert!(runtime.block_on(restarted.instances()).unwrap().is_empty());
    wait_for("the cancelled job to leave squeue", PATIENCE, || {
        cluster_jobs(&cluster, false).is_empty().then_some(())
    });
    wait_for("the terminated node to leave", PATIENCE, || {
        instance_node(temp.path(), &instance).is_none().then_some(())
    });

    let missing = SlurmProvider::new(
        &cluster,
        SlurmConfig {
            binary: "/nonexistent/raylet".into(),
            ..config
        },
    )
    .unwrap();
    let broken = runtime.block_on(missing.launch(&request)).unwrap();
    let reason = wait_for("the job without a binary to fail", PATIENCE, || {
        let instances = runtime.block_on(missing.instances()).unwrap();
        instances.into_iter().find_map(|instance| match instance.state {
            InstanceState::Failed(reason) if instance.id == broken => Some(reason),
            _ => None,
        })
    });
    // FAILED, or COMPLETING for the moment Slurm cleans up after it.
    let ended = format!("Slurm job {broken} ended without being terminated (state ");
    assert!(
        reason.starts_with(&ended) && reason.contains("reason NonZeroExitCode"),
        "{reason}"
    );
    assert!(
        reason.contains("/nonexistent/raylet") && reason.contains("No such file"),
        "says why from its output: {reason}"
    );
    runtime.block_on(missing.terminate(&broken)).unwrap();
    assert!(runtime.block_on(missing.instances()).unwrap().is_empty());

    let mut huge = request.clone();
    huge.node_type.resources.set("CPU", Amount::whole(100_000));
    let refused = runtime.block_on(provider.launch(&huge)).unwrap_err().to_string();
    assert!(
        refused.contains("`sbatch` failed") && refused.contains("Batch job submission failed"),
        "names sbatch and quotes its error: {refused}"
    );
    wait_for("no job of the cluster to be left in squeue", PATIENCE, || {
        cluster_jobs(&cluster, false).is_empty().then_some(())
    });
}

#[test]
fn waiting_tasks_make_the_autoscaler_submit_jobs_that_join_run_them_and_are_cancelled_once_idle() {
    if !slurm_available() {
        return;
    }
    let name = format!("up{}", std::process::id());
    let _cancel = CancelJobs { cluster: name.clone() };
    let provider =
        format!("  type: slurm\n  binary: {RAYLET}\n  temp_dir: {{temp}}\n  output_dir: {{temp}}/slurm-output");
    let cluster = UpCluster::up_with(&name, &provider, &["--num-cpus", "0"], &UpCluster::cpu2_types(2, 3));
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    cluster.run_on_launched_nodes(&driver, 4, "cpu2", PATIENCE);
    let jobs = cluster_jobs(&name, false);
    let report = cluster.report();
    for node in report["nodes"].as_array().unwrap() {
        let instance = node["instance"].as_str().unwrap();
        assert!(
            jobs.iter().any(|job| job == instance),
            "instance {instance} is one of the jobs {jobs:?}"
        );
    }
    assert!((1..=2).contains(&jobs.len()), "{jobs:?}");

    crate::autoscaler_cluster::wait_for(PATIENCE, "the idle nodes' jobs to be cancelled", || {
        cluster_jobs(&name, false).is_empty().then_some(())
    });
    let events = cluster.report()["events"].to_string();
    assert!(
        events.contains("draining node") && events.contains("removing node"),
        "{events}"
    );
    drop(driver);
    cluster.down();
}
