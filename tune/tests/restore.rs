//! Restoring an experiment whose driver was killed: a child process (this
//! test binary, running the ignored `interrupted_driver`) runs the search
//! and is SIGKILLed with its workers once some trials finished; then
//! `Tuner::restore` finishes it here without running a finished trial again,
//! and replays every result reported before the kill to the scheduler.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use raylet_tune::schedulers::{Decision, SchedulerContext, TrialScheduler};
use raylet_tune::search::{BasicVariant, SearchSpace, grid};
use raylet_tune::{
    Metrics, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TrialStatus, TuneConfig, TuneError, Tuner,
    register_trainable,
};

const EXPERIMENT_DIR: &str = "RAYLET_TUNE_TEST_EXPERIMENT";
const TRIALS: usize = 8;
const ITERATIONS: u64 = 6;

/// Counts up slowly, checkpointing each step, and logs every start of
/// itself in `starts.log`.
fn slow_counter(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    let mut starts = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ctx.trial_dir().join("starts.log"))?;
    writeln!(starts, "start at iteration {}", ctx.iteration())?;
    while ctx.iteration() < ITERATIONS {
        std::thread::sleep(Duration::from_millis(150));
        let checkpoint = ctx.new_checkpoint()?;
        checkpoint.save_state(&ctx.iteration())?;
        ctx.report(
            Metrics::new().with("score", x * ctx.iteration() as f64),
            Some(checkpoint),
        )?;
    }
    Ok(())
}
register_trainable!(slow_counter);

fn space() -> SearchSpace {
    SearchSpace::new().with("x", grid((0..TRIALS).map(|x| x as f64)))
}

fn tune_config() -> TuneConfig {
    TuneConfig {
        metric: Some("score".into()),
        mode: Mode::Max,
        max_concurrent_trials: Some(2),
        ..TuneConfig::default()
    }
}

/// FIFO that logs each result a restore replays to it: trial and iteration.
struct ReplayLog(Arc<Mutex<Vec<(String, f64)>>>);

impl TrialScheduler for ReplayLog {
    fn setup(&mut self, _metric: Option<&str>, _mode: Mode) -> Result<(), TuneError> {
        Ok(())
    }

    fn on_trial_result(&mut self, _context: &mut SchedulerContext<'_>, _trial: &str, _result: &Metrics) -> Decision {
        Decision::Continue
    }

    fn restore_result(&mut self, trial: &str, result: &Metrics) {
        let iteration = result.get("training_iteration").unwrap();
        self.0.lock().unwrap().push((trial.to_string(), iteration));
    }
}

/// The search the child runs until it is killed.
#[test]
#[ignore = "the driver that restore_finishes_an_interrupted_experiment runs in a child process and kills"]
fn interrupted_driver() {
    let directory = PathBuf::from(std::env::var(EXPERIMENT_DIR).expect("run by the restore test"));
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    Tuner::new(slow_counter)
        .param_space(space())
        .tune_config(tune_config())
        .searcher(BasicVariant::seeded(1))
        .run_config(RunConfig {
            name: directory.file_name().unwrap().to_string_lossy().into_owned(),
            storage_path: directory.parent().unwrap().to_path_buf(),
            verbose: 0,
            ..RunConfig::default()
        })
        .fit()
        .unwrap();
}

/// Each trial's status in the experiment's state file.
fn statuses(directory: &Path) -> BTreeMap<String, String> {
    let Ok(text) = std::fs::read_to_string(directory.join("experiment_state.json")) else {
        return BTreeMap::new();
    };
    let Ok(state) = serde_json::from_str::<serde_json::Value>(&text) else {
        return BTreeMap::new();
    };
    state["trials"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["view"]["id"].as_str().unwrap().to_string(),
                t["view"]["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn restore_finishes_an_interrupted_experiment_without_rerunning_finished_trials() {
    let storage = tempfile::tempdir().unwrap();
    let directory = storage.path().join("interrupted");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["restore::interrupted_driver", "--exact", "--ignored", "--nocapture"])
        .env(EXPERIMENT_DIR, &directory)
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished_before = loop {
        let finished: Vec<String> = statuses(&directory)
            .into_iter()
            .filter(|(_, status)| status == "Terminated")
            .map(|(id, _)| id)
            .collect();
        if finished.len() >= 3 {
            break finished;
        }
        assert!(Instant::now() < deadline, "the child finished no 3 trials in 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the child driver exited early");
        std::thread::sleep(Duration::from_millis(20));
    };
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let state_at_kill = statuses(&directory);
    let unfinished = state_at_kill.values().filter(|s| *s != "Terminated").count();
    assert!(
        unfinished > 0 || state_at_kill.len() < TRIALS,
        "killed too late: {state_at_kill:?}"
    );
    let finished_files: Vec<(String, String)> = finished_before
        .iter()
        .map(|id| {
            let trial = directory.join(id);
            let metrics = std::fs::read_to_string(trial.join("metrics.jsonl")).unwrap();
            (std::fs::read_to_string(trial.join("starts.log")).unwrap(), metrics)
        })
        .collect();

    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let replayed = Arc::new(Mutex::new(Vec::new()));
    let results = Tuner::restore(&directory, slow_counter)
        .param_space(space())
        .tune_config(tune_config())
        .searcher(BasicVariant::seeded(1))
        .scheduler(ReplayLog(replayed.clone()))
        .fit()
        .unwrap();
    for id in &finished_before {
        let iterations: Vec<f64> = replayed
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t == id)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(
            iterations,
            (1..=ITERATIONS).map(|i| i as f64).collect::<Vec<_>>(),
            "{id}'s results replayed to the scheduler"
        );
    }
    println!("killed with {state_at_kill:?}; restored into {} trials", results.len());
    assert_eq!(results.len(), TRIALS, "no trial lost, none added");
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{}", result.trial_id);
        let steps: Vec<f64> = result
            .metrics_history
            .iter()
            .map(|m| m.get("training_iteration").unwrap())
            .collect();
        assert_eq!(
            steps,
            (1..=ITERATIONS).map(|i| i as f64).collect::<Vec<_>>(),
            "{}",
            result.trial_id
        );
    }
    for (id, (starts, metrics)) in finished_before.iter().zip(finished_files) {
        let trial = directory.join(id);
        assert_eq!(
            std::fs::read_to_string(trial.join("starts.log")).unwrap(),
            starts,
            "{id} ran again"
        );
        assert_eq!(std::fs::read_to_string(trial.join("metrics.jsonl")).unwrap(), metrics);
    }
    let xs: Vec<f64> = results.iter().map(|r| r.config.get("x").unwrap()).collect();
    assert_eq!(
        xs,
        (0..TRIALS).map(|x| x as f64).collect::<Vec<_>>(),
        "each grid point once"
    );
}
