//! Tuner end to end on the embedded cluster: trials run in trial actors
//! (worker processes of this test binary), report through their context,
//! and are searched, scheduled, stopped, failed and exported for real.

use std::path::Path;

use raylet_tune::schedulers::Asha;
use raylet_tune::search::{SearchSpace, Tpe, choice, grid, uniform};
use raylet_tune::stopper::MaxIterations;
use raylet_tune::{
    Metrics, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TrialResources, TrialStatus, TuneConfig,
    TuneError, Tuner, register_trainable,
};

/// Reports `score = -(x - 3)^2 + iteration / 100` ten times.
fn quadratic(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    let iterations: u64 = config.get("iterations").unwrap_or(10);
    for i in 1..=iterations {
        ctx.report(
            Metrics::new().with("score", -(x - 3.0).powi(2) + i as f64 / 100.0),
            None,
        )?;
    }
    Ok(())
}
register_trainable!(quadratic);

/// Fails at its second report, every time.
fn flaky(_config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    ctx.report(Metrics::new().with("score", 1.0), None)?;
    Err("the trainable gives up on purpose".into())
}
register_trainable!(flaky);

/// An error of the trainable's own type, which displays and is nothing more.
struct Diverged {
    at: u64,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the loss diverged at step {}", self.at)
    }
}

/// Fails with an error of its own type once it has reported once.
fn diverging(_config: &TrialConfig, ctx: &mut TrialContext) -> Result<(), Diverged> {
    ctx.report(Metrics::new().with("score", 1.0), None)
        .map_err(|_| Diverged { at: 0 })?;
    Err(Diverged { at: 1 })
}
register_trainable!(diverging);

/// Counts to 6 with a checkpoint per step; the first run of each trial
/// SIGKILLs its own actor process after 3 reports.
fn dies_once(_config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let marker = ctx.trial_dir().join("killed_once");
    let mut value: u64 = match ctx.checkpoint() {
        Some(checkpoint) => checkpoint.load_state()?,
        None => 0,
    };
    while ctx.iteration() < 6 {
        if ctx.iteration() == 3 && !marker.exists() {
            std::fs::write(&marker, b"")?;
            nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL)?;
        }
        value += 1;
        let checkpoint = ctx.new_checkpoint()?;
        checkpoint.save_state(&value)?;
        ctx.report(Metrics::new().with("value", value as f64), Some(checkpoint))?;
    }
    Ok(())
}
register_trainable!(dies_once);

fn unregistered(_config: &TrialConfig, _ctx: &mut TrialContext) -> TrainableResult {
    Ok(())
}

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

fn run_config(storage: &Path, name: &str) -> RunConfig {
    RunConfig {
        name: name.into(),
        storage_path: storage.to_path_buf(),
        verbose: 1,
        ..RunConfig::default()
    }
}

#[test]
fn a_grid_runs_every_trial_to_its_end_and_exports_its_results() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let space = SearchSpace::new()
        .with("x", grid([0.0, 1.0, 2.0, 3.0, 4.0]))
        .with("noise", uniform(0.0, 1.0));
    let results = Tuner::new(quadratic)
        .param_space(space)
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            mode: Mode::Max,
            num_samples: 2,
            ..TuneConfig::default()
        })
        .run_config(run_config(storage.path(), "grid"))
        .fit()
        .unwrap();
    assert_eq!(results.len(), 10, "5 grid points x 2 samples");
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{result:?}");
        assert_eq!(result.metrics_history.len(), 10);
        let iterations: Vec<f64> = result
            .metrics_history
            .iter()
            .map(|m| m.get("training_iteration").unwrap())
            .collect();
        assert_eq!(iterations, (1..=10).map(f64::from).collect::<Vec<_>>());
        assert!(result.path.join("params.json").exists() && result.path.join("progress.csv").exists());
    }
    let best = results.best().unwrap();
    assert_eq!(best.config.get::<f64>("x").unwrap(), 3.0);
    assert_eq!(best.metrics.as_ref().unwrap().get("score"), Some(0.1));
    let worst = results.best_result("score", Mode::Min).unwrap();
    assert_eq!(worst.config.get::<f64>("x").unwrap(), 0.0);

    let mut csv = csv::Reader::from_path(results.path().join("results.csv")).unwrap();
    let headers = csv.headers().unwrap().clone();
    for column in [
        "trial_id",
        "status",
        "config/x",
        "config/noise",
        "score",
        "training_iteration",
    ] {
        assert!(
            headers.iter().any(|h| h == column),
            "results.csv lacks {column}: {headers:?}"
        );
    }
    assert_eq!(csv.records().count(), 10);
    let jsonl = std::fs::read_to_string(results.path().join("results.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 10);
    assert!(results.path().join("experiment_state.json").exists());
}

#[test]
fn asha_stops_poor_trials_early_and_tpe_searches_in_parallel() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let space = SearchSpace::new().with("x", uniform(-5.0, 10.0)).with("iterations", 27);
    let results = Tuner::new(quadratic)
        .param_space(space)
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            mode: Mode::Max,
            num_samples: 16,
            ..TuneConfig::default()
        })
        .searcher(Tpe::seeded(1).n_startup_trials(4))
        .scheduler(Asha::new().max_t(27.0).grace_period(1.0).reduction_factor(3.0))
        .run_config(run_config(storage.path(), "asha"))
        .fit()
        .unwrap();
    assert_eq!(results.len(), 16);
    let lengths: Vec<usize> = results.iter().map(|r| r.metrics_history.len()).collect();
    assert!(lengths.iter().all(|n| (1..=27).contains(n)), "{lengths:?}");
    assert!(lengths.iter().any(|n| *n < 27), "ASHA stopped none early: {lengths:?}");
    assert!(lengths.contains(&27), "the best trials run to max_t: {lengths:?}");
    let best = results.best().unwrap();
    assert!((best.config.get::<f64>("x").unwrap() - 3.0).abs() < 2.0, "{best:?}");
}

#[test]
fn a_failing_trial_is_retried_max_failures_times_then_reported_with_its_error() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(flaky)
        .param_space(SearchSpace::new().with("x", grid([1, 2])))
        .run_config(RunConfig {
            max_failures: 2,
            ..run_config(storage.path(), "flaky")
        })
        .fit()
        .unwrap();
    assert_eq!(results.errors().len(), 2);
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Error);
        assert_eq!(result.error.as_deref(), Some("the trainable gives up on purpose"));
        assert_eq!(result.metrics_history.len(), 3, "one report per try, 3 tries");
    }
}

#[test]
fn a_trainable_may_fail_with_an_error_type_of_its_own() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(diverging)
        .run_config(run_config(storage.path(), "diverging"))
        .fit()
        .unwrap();
    let result = results.iter().next().unwrap();
    assert_eq!(result.status, TrialStatus::Error);
    assert_eq!(result.error.as_deref(), Some("the loss diverged at step 1"));
    assert_eq!(result.metrics_history.len(), 1);
}

#[test]
fn stoppers_end_trials_and_choices_reach_the_trainable() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(quadratic)
        .param_space(SearchSpace::new().with("x", choice([1.0, 5.0])).with("iterations", 50))
        .tune_config(TuneConfig {
            num_samples: 4,
            max_concurrent_trials: Some(1),
            ..TuneConfig::default()
        })
        .stop(MaxIterations(3))
        .run_config(run_config(storage.path(), "stopped"))
        .fit()
        .unwrap();
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated);
        assert_eq!(result.metrics_history.len(), 3);
        assert!([1.0, 5.0].contains(&result.config.get::<f64>("x").unwrap()));
    }
}

#[test]
fn unregistered_trainables_and_unplaceable_trials_are_refused_before_anything_runs() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let error = Tuner::new(unregistered)
        .run_config(run_config(storage.path(), "unregistered"))
        .fit()
        .unwrap_err();
    assert!(matches!(error, TuneError::NotRegistered(_)), "{error}");
    assert!(error.to_string().contains("register_trainable!"), "{error}");

    let error = Tuner::new(quadratic)
        .param_space(SearchSpace::new().with("x", 1.0))
        .resources_per_trial(TrialResources {
            num_cpus: 8.0,
            ..TrialResources::default()
        })
        .run_config(run_config(storage.path(), "too_big"))
        .fit()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no node can hold a trial's resources {CPU: 8}"),
        "{error}"
    );

    let again = Tuner::new(quadratic)
        .param_space(SearchSpace::new().with("x", 1.0))
        .run_config(run_config(storage.path(), "twice"));
    again.fit().unwrap();
    let error = Tuner::new(quadratic)
        .param_space(SearchSpace::new().with("x", 1.0))
        .run_config(run_config(storage.path(), "twice"))
        .fit()
        .unwrap_err()
        .to_string();
    assert!(error.contains("Tuner::restore"), "{error}");
}

#[test]
fn a_trial_whose_actor_is_killed_resumes_from_its_checkpoint_or_fails_clearly() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let run = |name: &str, max_failures| {
        Tuner::new(dies_once)
            .param_space(SearchSpace::new().with("x", grid([1, 2])))
            .run_config(RunConfig {
                max_failures,
                ..run_config(storage.path(), name)
            })
            .fit()
            .unwrap()
    };
    let resumed = run("killed_resumed", 1);
    for result in resumed.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{:?}", result.error);
        assert!(result.path.join("killed_once").exists(), "the actor was killed");
        let steps: Vec<(f64, f64)> = result
            .metrics_history
            .iter()
            .map(|m| (m.get("training_iteration").unwrap(), m.get("value").unwrap()))
            .collect();
        let expected: Vec<(f64, f64)> = (1..=6).map(|i| (i as f64, i as f64)).collect();
        assert_eq!(
            steps, expected,
            "nothing lost or repeated: the state came back from checkpoint 3"
        );
    }

    let failed = run("killed_failed", 0);
    for result in failed.iter() {
        assert_eq!(result.status, TrialStatus::Error);
        let error = result.error.as_deref().unwrap();
        assert!(error.contains("its actor failed"), "{error}");
        assert_eq!(result.metrics_history.len(), 3);
    }
}

#[test]
fn restoring_a_missing_or_garbled_experiment_fails_clearly_and_touches_nothing() {
    init();
    let storage = tempfile::tempdir().unwrap();
    let missing = storage.path().join("never_ran");
    let error = Tuner::restore(&missing, quadratic).fit().unwrap_err().to_string();
    assert!(error.contains("no experiment to restore here"), "{error}");
    assert!(!missing.exists(), "a failed restore makes no directory");

    let garbled = storage.path().join("garbled");
    std::fs::create_dir(&garbled).unwrap();
    std::fs::write(garbled.join("experiment_state.json"), b"{\"trials\": [tru").unwrap();
    let error = Tuner::restore(&garbled, quadratic).fit().unwrap_err().to_string();
    assert!(error.contains("the state file does not parse"), "{error}");
    assert_eq!(
        std::fs::read(garbled.join("experiment_state.json")).unwrap(),
        b"{\"trials\": [tru",
        "the state file is left as it was"
    );
}
