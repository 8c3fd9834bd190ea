//! The data-parallel trainer end to end on the embedded cluster: worker
//! actors in a placement group train the digits MLP on their shards, rank
//! 0 reports and checkpoints every epoch, a worker killed with SIGKILL
//! mid-run restarts the group from the latest checkpoint, and bad runs fail
//! with clear errors.

use std::path::Path;
use std::time::{Duration, Instant};

use raylet::{ActorState, Cluster};
use raylet_models::digits::{self, DigitsMlp};
use raylet_train::digits::DigitsTraining;
use raylet_train::{
    Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, TrainContext, TrainError, TrainLoop,
    TrainResult, Trainer, WorkerResources,
};
use serde::{Deserialize, Serialize};

const EPOCHS: u64 = 15;
/// Epochs of the run a worker is killed in once its third checkpoint is
/// on disk: enough that it is still training then (an epoch of the digits
/// takes about 10 ms here, so about a second is left).
const KILLED_RUN_EPOCHS: u64 = 100;

fn run_config(storage: &Path, name: &str, max_failures: u32) -> RunConfig {
    RunConfig {
        name: name.to_string(),
        storage_path: storage.to_path_buf(),
        checkpoint: CheckpointConfig {
            num_to_keep: Some(2),
            score_metric: Some("accuracy".into()),
            ..CheckpointConfig::default()
        },
        failure: FailureConfig {
            max_failures,
            ..FailureConfig::default()
        },
        verbose: false,
    }
}

fn two_workers() -> ScalingConfig {
    ScalingConfig {
        num_workers: 2,
        ..ScalingConfig::default()
    }
}

/// The digits trainer with two workers, `epochs` epochs, its run `name`.
fn digits_trainer(storage: &Path, name: &str, epochs: u64, max_failures: u32) -> Trainer<DigitsTraining> {
    let data = digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs,
        ..DigitsTraining::default()
    };
    Trainer::new(training)
        .scaling(two_workers())
        .run_config(run_config(storage, name, max_failures))
        .dataset("train", data.train)
        .dataset("test", data.test)
}

fn accuracy(result: &TrainResult) -> f64 {
    result
        .metrics
        .get("accuracy")
        .expect("the digits loop reports its accuracy")
}

/// The accuracy of the model in `checkpoint`, computed here on the test
/// rows that two workers' equal shards hold (all but the last of 359).
fn checkpoint_accuracy(checkpoint: &Checkpoint) -> f64 {
    let device = burn::prelude::Device::flex();
    let model = checkpoint.load_model(DigitsMlp::new(DigitsTraining::default().hidden, &device));
    let test = digits::load(0.2, 0).test;
    let sharded = &test[..test.len() / 2 * 2];
    model.unwrap().count_correct(sharded, &device) as f64 / sharded.len() as f64
}

#[test]
fn two_workers_learn_the_digits_and_keep_the_best_checkpoints() {
    let cluster = raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let result = digits_trainer(storage.path(), "digits", EPOCHS, 0).fit().unwrap();
    println!(
        "2 workers, {EPOCHS} epochs: test accuracy {:.2}% in {:.1} s",
        accuracy(&result) * 100.0,
        result.elapsed.as_secs_f64()
    );
    assert!(accuracy(&result) >= 0.95, "accuracy {}", accuracy(&result));
    let indices: Vec<u64> = result.metrics_history.iter().map(|r| r.index).collect();
    assert_eq!(indices, (0..EPOCHS).collect::<Vec<_>>());
    assert_eq!(result.failures, 0);

    let best_accuracy = result
        .metrics_history
        .iter()
        .map(|r| r.metrics.get("accuracy").unwrap());
    let best_accuracy = best_accuracy.fold(0.0, f64::max);
    let (best, best_metrics) = &result.best_checkpoints[0];
    assert_eq!(best_metrics.get("accuracy"), Some(best_accuracy));
    let reloaded = checkpoint_accuracy(best);
    assert!((reloaded - best_accuracy).abs() < 1e-9, "{reloaded} vs {best_accuracy}");

    let on_disk: Vec<String> = std::fs::read_dir(&result.path)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("checkpoint_"))
        .collect();
    assert!(on_disk.len() <= 3, "the best two and the latest stay: {on_disk:?}");
    assert!(
        on_disk.contains(&format!("checkpoint_{:06}", EPOCHS - 1)),
        "{on_disk:?}"
    );
    let lines = std::fs::read_to_string(result.path.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count() as u64, EPOCHS);
    assert_no_train_workers_alive(&cluster);
    cluster.shutdown().unwrap();
}

#[test]
fn a_worker_killed_mid_training_restarts_the_group_from_the_latest_checkpoint() {
    let cluster = raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let uninterrupted = digits_trainer(storage.path(), "uninterrupted", KILLED_RUN_EPOCHS, 0)
        .fit()
        .unwrap();

    let earlier_workers = alive_train_workers(&cluster);
    let run = std::thread::spawn({
        let storage = storage.path().to_path_buf();
        move || digits_trainer(&storage, "killed", KILLED_RUN_EPOCHS, 2).fit()
    });
    wait_for_checkpoint(&storage.path().join("killed"), 2);
    let victim = alive_train_workers(&cluster)
        .into_iter()
        .find(|pid| !earlier_workers.contains(pid))
        .expect("a worker of the run to kill");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let resumed = run.join().unwrap().unwrap();

    println!(
        "uninterrupted {:.2}%, killed and resumed {:.2}%",
        accuracy(&uninterrupted) * 100.0,
        accuracy(&resumed) * 100.0
    );
    assert_eq!(resumed.failures, 1);
    assert!((accuracy(&resumed) - accuracy(&uninterrupted)).abs() <= 0.01);
    let restarted: Vec<&raylet_train::Report> = resumed.metrics_history.iter().filter(|r| r.attempt == 1).collect();
    let last_before: Vec<u64> = resumed
        .metrics_history
        .iter()
        .filter(|r| r.attempt == 0 && r.checkpoint.is_some())
        .map(|r| r.index)
        .collect();
    let resumed_from = *last_before.last().unwrap();
    println!("the second try resumed from checkpoint {resumed_from}");
    assert_eq!(
        restarted[0].index,
        resumed_from + 1,
        "the new group starts after the latest checkpoint"
    );
    assert_eq!(restarted.last().unwrap().index, KILLED_RUN_EPOCHS - 1);
    assert!(!alive_train_workers(&cluster).contains(&victim));
    assert_no_train_workers_alive(&cluster);
    cluster.shutdown().unwrap();
}

#[test]
fn a_run_of_the_same_name_resumes_from_its_latest_checkpoint() {
    let _cluster = raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let first = digits_trainer(storage.path(), "resumed", 3, 0).fit().unwrap();
    assert_eq!(first.metrics_history.len(), 3);
    let second = digits_trainer(storage.path(), "resumed", 5, 0).fit().unwrap();
    let indices: Vec<u64> = second.metrics_history.iter().map(|r| r.index).collect();
    assert_eq!(indices, [3, 4], "epochs 0 to 2 are not trained again");
    let epochs: Vec<f64> = second
        .metrics_history
        .iter()
        .map(|r| r.metrics.get("epoch").unwrap())
        .collect();
    assert_eq!(epochs, [3.0, 4.0]);
}

/// Fails on one rank every time; the others wait at a barrier for it.
#[derive(Serialize, Deserialize)]
struct FailsOnRank {
    rank: usize,
}

raylet_train::register_train_loop!(FailsOnRank);

impl TrainLoop for FailsOnRank {
    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        context.report(raylet_train::Metrics::new().with("attempt", context.attempt()), None)?;
        if context.rank() == self.rank {
            return Err(format!("rank {} gives up on purpose", self.rank).into());
        }
        context.group().barrier()?;
        Ok(())
    }
}

#[test]
fn a_loop_that_always_fails_is_restarted_max_failures_times_then_reported() {
    let _cluster = raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let error = Trainer::new(FailsOnRank { rank: 1 })
        .scaling(two_workers())
        .run_config(run_config(storage.path(), "failing", 2))
        .fit()
        .unwrap_err();
    let message = error.to_string();
    println!("{message}");
    assert!(
        matches!(error, TrainError::TooManyFailures { failures: 3, .. }),
        "{message}"
    );
    assert!(message.contains("rank 1: rank 1 gives up on purpose"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "no try waited out a timeout"
    );
    let lines = std::fs::read_to_string(storage.path().join("failing/metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 3, "one report per try: {lines}");
}

/// Panics on every rank.
#[derive(Serialize, Deserialize)]
struct Panics;

raylet_train::register_train_loop!(Panics);

impl TrainLoop for Panics {
    fn run(self, _context: &mut TrainContext) -> Result<(), TrainError> {
        panic!("the loop's own panic")
    }
}

/// Never registered.
#[derive(Serialize, Deserialize)]
struct Unregistered;

impl TrainLoop for Unregistered {
    fn run(self, _context: &mut TrainContext) -> Result<(), TrainError> {
        Ok(())
    }
}

#[test]
fn bad_runs_fail_with_errors_that_say_why() {
    let _cluster = raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let panicked = Trainer::new(Panics)
        .run_config(run_config(storage.path(), "panics", 0))
        .fit()
        .unwrap_err()
        .to_string();
    assert!(panicked.contains("panicked: the loop's own panic"), "{panicked}");

    let unregistered = Trainer::new(Unregistered).fit().unwrap_err();
    assert!(matches!(unregistered, TrainError::NotRegistered(_)), "{unregistered}");
    assert!(
        unregistered.to_string().contains("register_train_loop!"),
        "{unregistered}"
    );

    let too_big = ScalingConfig {
        num_workers: 2,
        resources_per_worker: WorkerResources {
            num_cpus: 64.0,
            ..WorkerResources::default()
        },
        ..ScalingConfig::default()
    };
    let infeasible = Trainer::new(Panics)
        .scaling(too_big)
        .run_config(run_config(storage.path(), "too-big", 3))
        .fit()
        .unwrap_err();
    println!("{infeasible}");
    assert!(
        matches!(infeasible, TrainError::Cluster(_)),
        "no restarts for a run that cannot fit: {infeasible}"
    );

    let no_workers = ScalingConfig {
        num_workers: 0,
        ..ScalingConfig::default()
    };
    let invalid = Trainer::new(Panics).scaling(no_workers).fit().unwrap_err();
    assert!(matches!(invalid, TrainError::InvalidConfig(_)), "{invalid}");

    let error = Trainer::new(DigitsTraining::default())
        .run_config(run_config(storage.path(), "no-data", 0))
        .fit()
        .unwrap_err()
        .to_string();
    assert!(error.contains("no dataset named `train`"), "{error}");
}

/// Waits until the run in `directory` has reported `count` times.
/// Waits until rank 0 has committed the checkpoint of report `index` (or
/// a later one) in the run `directory`. Rank 0 commits it before the
/// driver hears of the report: a driver that polls late can see reports
/// long after the workers made them (or finished), so the driver's metrics
/// file would be too late a sign that the run is still training.
fn wait_for_checkpoint(directory: &Path, index: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let committed = || {
        let entries = std::fs::read_dir(directory).into_iter().flatten().flatten();
        entries
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                name.strip_prefix("checkpoint_")?.parse::<u64>().ok()
            })
            .any(|committed| committed >= index)
    };
    while !committed() {
        assert!(Instant::now() < deadline, "the run never committed checkpoint {index}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The pids of the train workers alive now.
fn alive_train_workers(cluster: &Cluster) -> Vec<u32> {
    let actors = cluster.list_actors().unwrap();
    actors
        .iter()
        .filter(|actor| actor.class_name.ends_with("TrainWorker") && actor.state == ActorState::Alive)
        .map(|actor| actor.pid)
        .collect()
}

fn assert_no_train_workers_alive(cluster: &Cluster) {
    assert_eq!(
        alive_train_workers(cluster),
        Vec::<u32>::new(),
        "a finished run leaves no worker behind"
    );
}

/// Holds CPUs while it lives.
#[raylet::actor]
#[derive(Default)]
pub struct CpuHog;

#[raylet::actor]
impl CpuHog {
    pub fn new() -> Self {
        CpuHog
    }
}

#[test]
fn workers_wait_for_the_whole_gang_to_fit_then_train() {
    let cluster = raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let hog = CpuHog::remote(&cluster).num_cpus(2.0).spawn().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let freed = std::thread::spawn({
        let cluster = cluster.clone();
        move || {
            std::thread::sleep(Duration::from_secs(2));
            cluster.kill(&hog, true).unwrap();
            Instant::now()
        }
    });
    let result = digits_trainer(storage.path(), "waits", 2, 0).fit().unwrap();
    let freed_at = freed.join().unwrap();
    let finished_at = Instant::now();
    assert!(
        finished_at > freed_at,
        "the run could not start before the hog's CPUs were free"
    );
    assert_eq!(result.metrics_history.len(), 2);
    assert_eq!(result.failures, 0, "waiting for resources is not a failure");
}
