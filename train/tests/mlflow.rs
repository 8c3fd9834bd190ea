//! MLflow tracking of Train runs against a real `mlflow server` (from the
//! venv that tools/test.sh makes), read back with MLflow's own Python client: a
//! digits run's params, every report's metrics, its tags and its
//! checkpoints as artifacts; a run whose server dies mid-run finishes with
//! clear warnings; a strict callback fails the run instead; a tracking URI
//! that is not an http(s) URL is refused when the callback is made; and
//! tools/test.sh installs the MLflow these tests expect.

use std::net::TcpListener;
use std::path::Path;

use raylet_models::digits;
use raylet_train::digits::DigitsTraining;
use raylet_train::mlflow::{CallFailure, MlflowCallback, MlflowError};
use raylet_train::testing::{MLFLOW_VERSION, MlflowServer, warnings_of};
use raylet_train::{RunConfig, ScalingConfig, TrainError, Trainer};

const EPOCHS: u64 = 3;

/// The digits trainer with `workers` ranks, its run `name`.
fn digits_trainer(storage: &Path, name: &str, workers: usize) -> Trainer<DigitsTraining> {
    let data = digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs: EPOCHS,
        ..DigitsTraining::default()
    };
    Trainer::new(training)
        .scaling(ScalingConfig {
            num_workers: workers,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: name.to_string(),
            storage_path: storage.to_path_buf(),
            verbose: false,
            ..RunConfig::default()
        })
        .dataset("train", data.train)
        .dataset("test", data.test)
}

/// A loopback URL that nothing listens on.
fn nobody_listening() -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}")
}

#[test]
fn a_run_is_tracked_with_its_params_metrics_tags_and_checkpoints() {
    let server = MlflowServer::start();
    raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let mlflow = MlflowCallback::new(&server.uri())
        .unwrap()
        .experiment_name("digits-mlflow")
        .tag("team", "raylet")
        .save_artifact(true);
    let result = digits_trainer(storage.path(), "digits", 2)
        .callback(mlflow)
        .fit()
        .unwrap();

    let runs = server.runs("digits-mlflow");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = &runs[0];
    assert_eq!((run.run_name.as_str(), run.status.as_str()), ("digits", "FINISHED"));
    let training = DigitsTraining::default();
    let expected_params = [
        ("epochs", EPOCHS.to_string()),
        ("global_batch_size", training.global_batch_size.to_string()),
        ("learning_rate", training.learning_rate.to_string()),
        ("hidden", training.hidden.to_string()),
        ("seed", training.seed.to_string()),
        ("scaling.num_workers", "2".to_string()),
        ("scaling.use_gpu", "false".to_string()),
    ];
    for (key, value) in expected_params {
        assert_eq!(run.params.get(key), Some(&value), "param {key}: {:?}", run.params);
    }
    assert_eq!(run.params.len(), 7, "{:?}", run.params);
    assert_eq!(run.tags.get("team").map(String::as_str), Some("raylet"));
    assert_eq!(run.tags.get("mlflow.runName").map(String::as_str), Some("digits"));
    assert!(!run.tags.contains_key("mlflow.parentRunId"));

    let reported = &result.metrics_history;
    assert_eq!(reported.len() as u64, EPOCHS);
    let names: Vec<&str> = result.metrics.iter().map(|(name, _)| name).collect();
    assert_eq!(run.metrics.keys().map(String::as_str).collect::<Vec<_>>(), names);
    for (name, history) in &run.metrics {
        let expected: Vec<(u64, f64)> = reported
            .iter()
            .map(|r| (r.index, r.metrics.get(name).unwrap()))
            .collect();
        assert_eq!(history, &expected, "metric {name}");
    }

    let mut expected_artifacts = std::collections::BTreeMap::new();
    for report in reported {
        let checkpoint = report
            .checkpoint
            .as_ref()
            .expect("the digits loop checkpoints every epoch");
        let folder = checkpoint.path().file_name().unwrap().to_string_lossy().into_owned();
        for file in std::fs::read_dir(checkpoint.path()).unwrap() {
            let file = file.unwrap();
            let path = format!("checkpoints/{folder}/{}", file.file_name().to_string_lossy());
            expected_artifacts.insert(path, file.metadata().unwrap().len());
        }
    }
    assert_eq!(expected_artifacts.len(), 4 * EPOCHS as usize, "{expected_artifacts:?}");
    assert_eq!(run.artifacts, expected_artifacts);
    println!("{run:#?}");
}

#[test]
fn a_run_whose_tracking_server_dies_finishes_with_clear_warnings() {
    let mut server = MlflowServer::start();
    raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let uri = server.uri();
    let mlflow = MlflowCallback::new(&uri).unwrap().save_artifact(true);
    // The first call after the kill may go out on a kept-alive connection
    // to the dead server (reset by peer); every later one is refused.
    let (result, warnings) = warnings_of(|| {
        digits_trainer(storage.path(), "killed-server", 1)
            .callback(mlflow)
            .fit_with_reports(|report| {
                if report.index == 0 {
                    server.kill();
                }
                std::ops::ControlFlow::Continue(())
            })
    });
    let result = result.expect("tracking failures do not fail the run");
    assert_eq!(result.metrics_history.len() as u64, EPOCHS);
    println!("{warnings}");
    let lines: Vec<&str> = warnings
        .lines()
        .filter(|l| l.contains("MLflow tracking failed"))
        .collect();
    let failed = |doing: &str, call: &str| {
        lines
            .iter()
            .filter(|line| {
                line.contains(&format!(
                    "({doing}); training goes on without it: MLflow at {uri}: {call}"
                )) && line.contains("the server could not be reached")
                    && (line.contains("Connection refused") || line.contains("Connection reset by peer"))
            })
            .count()
    };
    assert_eq!(
        failed("logging metrics", "runs/log-batch"),
        EPOCHS as usize - 1,
        "{warnings}"
    );
    let uploads = failed("uploading a checkpoint", "uploading artifact checkpoints/checkpoint_");
    assert_eq!(uploads, EPOCHS as usize - 1, "{warnings}");
    assert_eq!(failed("ending a run", "runs/update"), 1, "{warnings}");
}

#[test]
fn a_strict_callback_fails_the_run_when_its_server_is_down() {
    raylet::init().unwrap();
    let storage = tempfile::tempdir().unwrap();
    let uri = nobody_listening();
    let mlflow = MlflowCallback::new(&uri).unwrap().strict(true);
    let error = digits_trainer(storage.path(), "strict", 1)
        .callback(mlflow)
        .fit()
        .unwrap_err();
    let message = error.to_string();
    println!("{message}");
    match error {
        TrainError::Mlflow(MlflowError::Call {
            server,
            call,
            failure: CallFailure::Unreachable(_),
        }) => {
            assert_eq!(server, uri);
            assert_eq!(call, "experiments/get-by-name");
        }
        other => panic!("not an unreachable server's error: {other:?}"),
    }
    assert!(message.contains("the server could not be reached"), "{message}");
}

#[test]
fn a_tracking_uri_that_is_not_an_http_url_is_refused_when_the_callback_is_made() {
    for uri in ["localhost:5000", "file:///tmp/mlruns", "http://", "not a url"] {
        let error = MlflowCallback::new(uri).unwrap_err();
        assert!(matches!(error, MlflowError::InvalidUri { .. }), "{error:?}");
        assert!(
            error.to_string().starts_with(&format!("MLflow tracking URI `{uri}`: ")),
            "{error}"
        );
    }
    let error = MlflowCallback::new("localhost:5000").unwrap_err().to_string();
    assert!(
        error.contains("only a tracking server's http:// or https:// URL"),
        "{error}"
    );
}

#[test]
fn the_test_script_installs_the_mlflow_these_tests_expect() {
    let script = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/test.sh")).unwrap();
    assert!(
        script.contains(&format!(
            "\npip_venv target/mlflow-venv mlflow mlflow {MLFLOW_VERSION}\n"
        )),
        "tools/test.sh must install mlflow {MLFLOW_VERSION}, raylet_train::testing::MLFLOW_VERSION"
    );
}
