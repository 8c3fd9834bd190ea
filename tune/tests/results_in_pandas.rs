//! An experiment's exports read in pandas, as a Ray Tune user reads them:
//! `results.csv` and `results.jsonl`, and each trial's `progress.csv` and
//! `metrics.jsonl`. The first run makes a Python venv with pandas at
//! `target/test-venv` (python3 with its venv module, and pip, are needed).

use std::path::{Path, PathBuf};
use std::process::Command;

use raylet_tune::search::{SearchSpace, grid};
use raylet_tune::{
    Metrics, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TuneConfig, Tuner, register_trainable,
};
use serde_json::Value;

const PANDAS: &str = "pandas>=2,<4";

/// Reports `score = -(x - 3)^2 + iteration / 100` five times.
fn parabola(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    for i in 1..=5 {
        ctx.report(
            Metrics::new().with("score", -(x - 3.0).powi(2) + i as f64 / 100.0),
            None,
        )?;
    }
    Ok(())
}
register_trainable!(parabola);

/// What pandas makes of the exports, as JSON.
const READ_EXPORTS: &str = r#"
import glob, json, os, sys
import pandas as pd
experiment = sys.argv[1]
results = pd.read_csv(os.path.join(experiment, "results.csv"))
lines = pd.read_json(os.path.join(experiment, "results.jsonl"), lines=True)
trials = sorted(glob.glob(os.path.join(experiment, "trial_*")))
print(json.dumps({
    "pandas": pd.__version__,
    "csv_columns": list(results.columns),
    "csv_rows": len(results),
    "best_x_in_csv": float(results.loc[results["score"].idxmax(), "config/x"]),
    "jsonl_rows": len(lines),
    "jsonl_statuses": sorted(lines["status"].unique().tolist()),
    "progress_scores": [pd.read_csv(os.path.join(t, "progress.csv"))["score"].tolist() for t in trials],
    "metrics_iterations": [
        pd.read_json(os.path.join(t, "metrics.jsonl"), lines=True)["training_iteration"].tolist() for t in trials
    ],
}))
"#;

/// The venv's python, made (with pandas) if it is not there yet.
fn python_with_pandas() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-venv");
    let python = venv.join("bin/python");
    let has_pandas = |python: &Path| {
        Command::new(python)
            .args(["-c", "import pandas"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if python.exists() && has_pandas(&python) {
        return python;
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", PANDAS]));
    python
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn pandas_reads_the_results_and_every_trials_history() {
    let python = python_with_pandas();
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(parabola)
        .param_space(
            SearchSpace::new()
                .with("x", grid([1.0, 2.0, 3.0, 4.0]))
                .with("epochs", 5),
        )
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            mode: Mode::Max,
            ..TuneConfig::default()
        })
        .run_config(RunConfig {
            name: "pandas".into(),
            storage_path: storage.path().to_path_buf(),
            verbose: 0,
            ..RunConfig::default()
        })
        .fit()
        .unwrap();

    let output = Command::new(&python)
        .args(["-c", READ_EXPORTS])
        .arg(results.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pandas could not read the exports: {stderr}");
    let read: Value = serde_json::from_slice(&output.stdout).unwrap();
    println!("{read}");
    let columns = read["csv_columns"].as_array().unwrap();
    for column in [
        "trial_id",
        "status",
        "config/x",
        "config/epochs",
        "score",
        "training_iteration",
    ] {
        assert!(
            columns.iter().any(|c| c == column),
            "results.csv lacks {column}: {columns:?}"
        );
    }
    assert_eq!(
        (read["csv_rows"].as_u64(), read["jsonl_rows"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(read["best_x_in_csv"].as_f64(), Some(3.0));
    assert_eq!(read["jsonl_statuses"], serde_json::json!(["TERMINATED"]));
    let histories: Vec<Vec<f64>> = results
        .iter()
        .map(|trial| trial.metrics_history.iter().map(|m| m.get("score").unwrap()).collect())
        .collect();
    let progress: Vec<Vec<f64>> = serde_json::from_value(read["progress_scores"].clone()).unwrap();
    assert_eq!(progress, histories, "each progress.csv holds its trial's scores");
    let iterations: Vec<Vec<f64>> = serde_json::from_value(read["metrics_iterations"].clone()).unwrap();
    assert_eq!(iterations, vec![vec![1.0, 2.0, 3.0, 4.0, 5.0]; 4]);
}
