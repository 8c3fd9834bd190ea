//! MLflow tracking of a search against a real `mlflow server` (from the
//! venv that tools/test.sh makes), read back with MLflow's own Python client:
//! the experiment is a parent run and each trial of a digits search a
//! child run of it, with the trial's config as params, every result's
//! metrics at its training iteration, and its checkpoints as artifacts; a
//! search whose tracking server is down finishes, with one clear warning.

use std::collections::BTreeMap;
use std::net::TcpListener;

use raylet_train::testing::{MlflowServer, TrackedRun, warnings_of};
use raylet_tune::digits::train_digits;
use raylet_tune::search::{SearchSpace, grid};
use raylet_tune::{
    Metrics, MlflowCallback, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TrialResult, TrialStatus,
    TuneConfig, Tuner, register_trainable,
};

const EPOCHS: u64 = 2;

/// The checkpoint files of a trial, by artifact path, with their sizes.
fn checkpoint_files(result: &TrialResult) -> BTreeMap<String, u64> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&result.path).unwrap() {
        let folder = entry.unwrap();
        let name = folder.file_name().to_string_lossy().into_owned();
        if !name.starts_with("checkpoint_") {
            continue;
        }
        for file in std::fs::read_dir(folder.path()).unwrap() {
            let file = file.unwrap();
            let path = format!("checkpoints/{name}/{}", file.file_name().to_string_lossy());
            files.insert(path, file.metadata().unwrap().len());
        }
    }
    files
}

/// Checks a trial's run against the trial's own results.
fn check_trial_run(run: &TrackedRun, result: &TrialResult, parent: &TrackedRun) {
    let id = result.trial_id.as_str();
    assert_eq!((run.run_name.as_str(), run.status.as_str()), (id, "FINISHED"));
    let tag = |key: &str| run.tags.get(key).map(String::as_str);
    assert_eq!(tag("mlflow.parentRunId"), Some(parent.run_id.as_str()));
    assert_eq!((tag("trial_id"), tag("trial_name")), (Some(id), Some(id)));
    assert_eq!(tag("team"), Some("raylet"));
    let config: BTreeMap<String, String> = result
        .config
        .flatten()
        .into_iter()
        .map(|(key, value)| (key, value.as_str().map_or(value.to_string(), str::to_string)))
        .collect();
    assert_eq!(run.params, config, "{id}'s params are its config");
    let names: Vec<&str> = result.metrics_history[0].iter().map(|(name, _)| name).collect();
    assert_eq!(run.metrics.keys().map(String::as_str).collect::<Vec<_>>(), names);
    for (name, history) in &run.metrics {
        let expected: Vec<(u64, f64)> = result
            .metrics_history
            .iter()
            .map(|m| (m.get("training_iteration").unwrap() as u64, m.get(name).unwrap()))
            .collect();
        assert_eq!(history, &expected, "{id}'s {name}");
    }
    let steps: Vec<u64> = run.metrics["accuracy"].iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, (1..=EPOCHS).collect::<Vec<_>>());
    let files = checkpoint_files(result);
    assert_eq!(files.len(), 3 * EPOCHS as usize, "{id}: {files:?}");
    assert_eq!(run.artifacts, files, "{id}'s checkpoints are its artifacts");
}

#[test]
fn an_experiment_is_a_parent_run_with_a_child_run_per_trial() {
    let server = MlflowServer::start();
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let mlflow = MlflowCallback::new(&server.uri())
        .unwrap()
        .tag("team", "raylet")
        .save_artifact(true);
    let results = Tuner::new(train_digits)
        .param_space(
            SearchSpace::new()
                .with("lr", grid([3e-3, 1e-2]))
                .with("hidden", 32)
                .with("batch_size", 64)
                .with("epochs", EPOCHS),
        )
        .tune_config(TuneConfig {
            metric: Some("accuracy".into()),
            mode: Mode::Max,
            ..TuneConfig::default()
        })
        .run_config(RunConfig {
            name: "mlflow-search".into(),
            storage_path: storage.path().to_path_buf(),
            verbose: 0,
            ..RunConfig::default()
        })
        .callback(mlflow)
        .fit()
        .unwrap();
    assert_eq!(results.len(), 2);

    let runs = server.runs("mlflow-search");
    assert_eq!(runs.len(), 3, "the experiment's run and one per trial: {runs:#?}");
    let (parents, trials): (Vec<&TrackedRun>, Vec<&TrackedRun>) = runs
        .iter()
        .partition(|run| !run.tags.contains_key("mlflow.parentRunId"));
    let parent = parents[0];
    assert_eq!(
        (parent.run_name.as_str(), parent.status.as_str()),
        ("mlflow-search", "FINISHED")
    );
    let expected: BTreeMap<String, String> = [("metric", "accuracy"), ("mode", "max")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(parent.params, expected);
    assert_eq!(parent.tags.get("team").map(String::as_str), Some("raylet"));
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{:?}", result.error);
        let run = trials
            .iter()
            .find(|run| run.run_name == result.trial_id)
            .unwrap_or_else(|| panic!("no run for {}: {runs:#?}", result.trial_id));
        check_trial_run(run, result, parent);
    }
    println!("{runs:#?}");
}

/// Reports `score = x * iteration` three times.
fn linear(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    for i in 1..=3 {
        ctx.report(Metrics::new().with("score", x * i as f64), None)?;
    }
    Ok(())
}
register_trainable!(linear);

#[test]
fn a_search_whose_tracking_server_is_down_finishes_with_one_clear_warning() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let uri = format!("http://127.0.0.1:{port}");
    let (results, warnings) = warnings_of(|| {
        Tuner::new(linear)
            .param_space(SearchSpace::new().with("x", grid([1.0, 2.0])))
            .run_config(RunConfig {
                name: "mlflow-down".into(),
                storage_path: storage.path().to_path_buf(),
                verbose: 0,
                ..RunConfig::default()
            })
            .callback(MlflowCallback::new(&uri).unwrap())
            .fit()
    });
    let results = results.expect("tracking failures do not fail the search");
    assert!(
        results
            .iter()
            .all(|r| r.status == TrialStatus::Terminated && r.metrics_history.len() == 3)
    );
    println!("{warnings}");
    let lines: Vec<&str> = warnings.lines().filter(|l| l.contains("MLflow")).collect();
    assert_eq!(
        lines.len(),
        1,
        "the experiment's run is not made, and its trials' are not tried: {warnings}"
    );
    let expected = format!(
        "MLflow tracking failed (starting a run: it is not tracked); training goes on without it: \
         MLflow at {uri}: experiments/get-by-name: the server could not be reached"
    );
    assert!(lines[0].contains(&expected), "{warnings}");
    assert!(lines[0].contains("Connection refused"), "{warnings}");
}
