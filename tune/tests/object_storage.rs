//! An experiment kept in object storage, on a real S3-compatible server
//! started by the test: its state, every trial's results and checkpoints
//! are in the bucket in the layout of a local experiment, and read back
//! from there with the local copy gone; an experiment whose driver was
//! killed (a child process, as in `restore.rs`) is restored from the
//! bucket's URL on a fresh local copy, as on another node, and finishes
//! with nothing lost or run twice; a bad URL and a missing bucket fail
//! clearly before any trial runs.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use raylet_storage::testing::S3Server;
use raylet_storage::{Storage, StorageError, StorageOptions};
use raylet_train::RunDirectory;
use raylet_tune::search::{BasicVariant, SearchSpace, grid};
use raylet_tune::{
    Metrics, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TrialStatus, TuneConfig, TuneError, Tuner,
    register_trainable,
};

const TRIALS: usize = 4;
const ITERATIONS: u64 = 6;
const NAME: &str = "counting";
/// What the killed driver is given: the server's options, and the folder of start logs.
const OPTIONS_ENV: &str = "RAYLET_TUNE_TEST_S3_OPTIONS";
const STARTS_ENV: &str = "RAYLET_TUNE_TEST_STARTS";

/// Counts to `ITERATIONS`, a step every `60 + 120 * x` ms, each with a
/// checkpoint holding the count. A run checks that its checkpoint holds
/// the iteration it resumes at, and logs the count it started from in
/// `starts/<trial id>`.
fn counter(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    let starts: String = config.get("starts")?;
    let restored: u64 = match ctx.checkpoint() {
        Some(checkpoint) => checkpoint.load_state()?,
        None => 0,
    };
    if restored != ctx.iteration() {
        return Err(format!("resumed at {} from a checkpoint of {restored}", ctx.iteration()).into());
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(&starts).join(ctx.trial_id()))?;
    writeln!(log, "{restored}")?;
    while ctx.iteration() < ITERATIONS {
        std::thread::sleep(Duration::from_millis(60 + 120 * x as u64));
        let count = ctx.iteration() + 1;
        let checkpoint = ctx.new_checkpoint()?;
        checkpoint.save_state(&count)?;
        ctx.report(Metrics::new().with("score", x * count as f64), Some(checkpoint))?;
    }
    Ok(())
}
register_trainable!(counter);

/// The search over `x` in 0..TRIALS, two trials at a time, that logs its
/// starts in `starts`: of `tuner`, a new one or a restore.
fn search(tuner: Tuner, starts: &Path) -> Tuner {
    tuner
        .param_space(
            SearchSpace::new()
                .with("x", grid((0..TRIALS).map(|x| x as f64)))
                .with("starts", starts.to_str().unwrap()),
        )
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            mode: Mode::Max,
            max_concurrent_trials: Some(2),
            ..TuneConfig::default()
        })
        .searcher(BasicVariant::seeded(1))
}

fn run_config(storage_path: &str) -> RunConfig {
    RunConfig {
        name: NAME.into(),
        storage_path: storage_path.into(),
        verbose: 0,
        ..RunConfig::default()
    }
}

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

/// Every trial ran through once, reporting each iteration in order.
fn assert_complete(results: &raylet_tune::ResultGrid) {
    assert_eq!(results.len(), TRIALS, "no trial lost, none added");
    for result in results.iter() {
        assert_eq!(
            result.status,
            TrialStatus::Terminated,
            "{}: {:?}",
            result.trial_id,
            result.error
        );
        let x: f64 = result.config.get("x").unwrap();
        let scores: Vec<f64> = result.metrics_history.iter().map(|m| m.get("score").unwrap()).collect();
        let expected: Vec<f64> = (1..=ITERATIONS).map(|i| x * i as f64).collect();
        assert_eq!(scores, expected, "{}", result.trial_id);
    }
}

#[test]
fn an_experiment_in_a_bucket_keeps_its_files_there_as_a_local_one_does() {
    let server = S3Server::start();
    init();
    server.create_bucket("experiments");
    let starts = tempfile::tempdir().unwrap();
    let results = search(Tuner::new(counter), starts.path())
        .run_config(run_config("s3://experiments/team"))
        .storage_options(server.options())
        .fit()
        .unwrap();
    assert_complete(&results);
    assert_eq!(results.location(), Path::new("s3://experiments/team/counting"));
    let objects = server.objects("experiments", "team/counting");
    println!("in the bucket: {objects:?}");

    let local = tempfile::tempdir().unwrap();
    let starts = tempfile::tempdir().unwrap();
    let local_results = search(Tuner::new(counter), starts.path())
        .run_config(run_config(local.path().to_str().unwrap()))
        .fit()
        .unwrap();
    let mut local_files: Vec<String> = Storage::Local(local_results.path().to_path_buf())
        .list()
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    local_files.sort();
    assert_eq!(objects, local_files, "the bucket holds what a local experiment does");
    for name in [
        "experiment_state.json",
        "results.csv",
        "trial_00003/params.json",
        "trial_00003/metrics.jsonl",
        "trial_00003/progress.csv",
        "trial_00003/checkpoint_000006/state.json",
        "trial_00003/checkpoint_000006/.raylet_checkpoint.json",
    ] {
        assert!(objects.iter().any(|o| o == name), "{name} in {objects:?}");
    }

    let experiment = Storage::open("s3://experiments/team/counting", &server.options()).unwrap();
    let secret = secret_key(&server);
    for name in &objects {
        let text = String::from_utf8_lossy(&experiment.read(name).unwrap()).into_owned();
        assert!(!text.contains(&secret), "{name} holds the storage credentials");
    }

    // Nothing local is needed to read the results' checkpoints.
    std::fs::remove_dir_all(results.path()).unwrap();
    for result in results.iter() {
        let checkpoint = result.checkpoint.as_ref().unwrap();
        let expected = format!("s3://experiments/team/counting/{}/checkpoint_000006", result.trial_id);
        assert_eq!(checkpoint.remote_location(), Some(expected.as_str()));
        assert_eq!(checkpoint.load_state::<u64>().unwrap(), ITERATIONS);
    }
    std::fs::remove_dir_all(results.path()).unwrap();
}

/// The secret key in the server's options.
fn secret_key(server: &S3Server) -> String {
    let options = serde_json::to_value(server.options()).unwrap();
    let mut pairs = options.as_array().unwrap().iter();
    let secret = pairs.find(|pair| pair[0] == "aws_secret_access_key").unwrap();
    secret[1].as_str().unwrap().to_string()
}

/// The search the child runs until it is killed.
#[test]
#[ignore = "the driver that an_interrupted_experiment_in_a_bucket_... runs in a child process and kills"]
fn interrupted_driver() {
    let options: StorageOptions =
        serde_json::from_str(&std::env::var(OPTIONS_ENV).expect("run by the restore test")).unwrap();
    init();
    search(Tuner::new(counter), Path::new(&std::env::var(STARTS_ENV).unwrap()))
        .run_config(run_config("s3://interrupted/team"))
        .storage_options(options)
        .fit()
        .unwrap();
}

/// The state file in the bucket: each trial's status and the iteration of
/// its latest checkpoint.
fn trials_in(experiment: &Storage) -> BTreeMap<String, (String, Option<u64>)> {
    let Ok(Some(bytes)) = experiment.read_if_present("experiment_state.json") else {
        return BTreeMap::new();
    };
    let Ok(state) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return BTreeMap::new();
    };
    let trials = state["trials"].as_array().into_iter().flatten();
    trials
        .map(|t| {
            let id = t["view"]["id"].as_str().unwrap().to_string();
            let status = t["view"]["status"].as_str().unwrap().to_string();
            (id, (status, t["latest_checkpoint"][1].as_u64()))
        })
        .collect()
}

/// Whether some trial finished and another is part-way, with a checkpoint.
fn worth_restoring(trials: &BTreeMap<String, (String, Option<u64>)>) -> bool {
    let finished = trials.values().any(|(status, _)| status == "Terminated");
    let resumable = trials
        .values()
        .any(|(status, checkpoint)| status != "Terminated" && checkpoint.is_some());
    finished && resumable
}

/// Runs the search in a child driver, with its local copy in a temporary
/// directory of its own, and kills it once it is worth restoring; returns
/// the trials as the bucket has them.
fn run_and_kill(server: &S3Server, experiment: &Storage, starts: &Path) -> BTreeMap<String, (String, Option<u64>)> {
    let child_temp = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "object_storage::interrupted_driver",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(OPTIONS_ENV, serde_json::to_string(&server.options()).unwrap())
        .env(STARTS_ENV, starts)
        .env("TMPDIR", child_temp.path())
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !worth_restoring(&trials_in(experiment)) {
        assert!(
            Instant::now() < deadline,
            "no trial finished with another part-way in 120 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the child driver exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        child_temp.path().join("raylet-runs").exists(),
        "the child kept its local copy in its own temporary directory"
    );
    trials_in(experiment)
}

#[test]
fn an_interrupted_experiment_in_a_bucket_is_restored_from_its_url_on_a_fresh_node() {
    let server = S3Server::start();
    server.create_bucket("interrupted");
    let url = "s3://interrupted/team/counting";
    let experiment = Storage::open(url, &server.options()).unwrap();
    let starts = tempfile::tempdir().unwrap();
    let at_kill = run_and_kill(&server, &experiment, starts.path());
    assert!(worth_restoring(&at_kill), "killed too late: {at_kill:?}");
    let finished: Vec<&String> = at_kill
        .iter()
        .filter(|(_, (s, _))| s == "Terminated")
        .map(|(id, _)| id)
        .collect();
    let metrics_of = |id: &str| experiment.read(&format!("{id}/metrics.jsonl")).unwrap();
    let finished_metrics: Vec<_> = finished.iter().map(|id| metrics_of(id)).collect();

    // This process is the other node: no local copy of the experiment.
    let local = RunDirectory::locate(Path::new("s3://interrupted/team"), NAME, &server.options());
    let _ = std::fs::remove_dir_all(local.root());
    init();
    let results = search(Tuner::restore(url, counter), starts.path())
        .storage_options(server.options())
        .fit()
        .unwrap();
    println!("killed with {at_kill:?}; restored into {} trials", results.len());
    assert_complete(&results);
    let xs: Vec<f64> = results.iter().map(|r| r.config.get("x").unwrap()).collect();
    assert_eq!(
        xs,
        (0..TRIALS).map(|x| x as f64).collect::<Vec<_>>(),
        "each grid point once"
    );
    let started = |id: &str| std::fs::read_to_string(starts.path().join(id)).unwrap();
    for (id, metrics) in finished.iter().zip(finished_metrics) {
        assert_eq!(started(id), "0\n", "{id} finished before the kill and ran once");
        assert_eq!(metrics_of(id), metrics, "{id}'s results are as they were");
    }
    for (id, (status, checkpoint)) in &at_kill {
        if let (false, Some(iteration)) = (status == "Terminated", checkpoint) {
            let resumed = started(id).lines().last().unwrap().to_string();
            assert_eq!(
                resumed,
                iteration.to_string(),
                "{id} resumed from its checkpoint in the bucket"
            );
        }
    }
    let objects = server.objects("interrupted", "team/counting");
    for result in results.iter() {
        let name = format!("{}/checkpoint_000006/.raylet_checkpoint.json", result.trial_id);
        assert!(objects.contains(&name), "{name} in {objects:?}");
    }
    assert!(objects.iter().any(|o| o == "results.jsonl"), "{objects:?}");
    std::fs::remove_dir_all(results.path()).unwrap();
}

#[test]
fn a_bad_url_or_a_missing_bucket_fails_before_any_trial_runs() {
    let server = S3Server::start();
    init();
    server.create_bucket("present");
    let starts = tempfile::tempdir().unwrap();
    let fit = |storage_path: &str| {
        search(Tuner::new(counter), starts.path())
            .run_config(run_config(storage_path))
            .storage_options(server.options())
            .fit()
            .unwrap_err()
    };

    let error = fit("gs://present/team");
    println!("gs://: {error}");
    assert!(
        matches!(error, TuneError::Storage(StorageError::InvalidLocation(_))),
        "{error:?}"
    );
    assert!(error.to_string().contains("unknown storage scheme gs://"), "{error}");

    let error = fit("s3://missing/team");
    println!("a missing bucket: {error}");
    assert!(
        matches!(error, TuneError::Storage(StorageError::Remote { .. })),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.starts_with("s3://missing/team/counting: "), "{message}");
    assert!(message.contains("NoSuchBucket"), "{message}");
    let local = RunDirectory::locate(Path::new("s3://missing/team"), NAME, &server.options());
    assert!(!local.root().exists(), "no local copy is made for it");

    let error = Tuner::restore("s3://present/team/never_ran", counter)
        .storage_options(server.options())
        .fit()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("s3://present/team/never_ran: no experiment to restore here"),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(starts.path()).unwrap().count(), 0, "no trial ran");
    assert!(server.objects("present", "").is_empty(), "nothing was written");
}
