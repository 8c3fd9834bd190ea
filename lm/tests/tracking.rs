//! A tiny GPT's training tracked on a real `mlflow server` (from the venv
//! that tools/test.sh makes) and read back with MLflow's Python client: the
//! run's settings as params, without its rows or tokenizer, and every
//! report's loss, validation loss and perplexity by step.

use raylet_train::mlflow::MlflowCallback;
use raylet_train::testing::MlflowServer;

use crate::training::{init, sample, trainer, training};

const STEPS: u64 = 3;

#[test]
fn a_run_is_tracked_with_its_settings_and_each_reports_validation_loss_and_perplexity() {
    let server = MlflowServer::start();
    init();
    let scratch = tempfile::tempdir().unwrap();
    let sample = sample(scratch.path());
    let mlflow = MlflowCallback::new(&server.uri()).unwrap().experiment_name("gpt");
    let result = trainer(training(&sample, STEPS), 2, scratch.path(), "gpt-tiny")
        .callback(mlflow)
        .fit()
        .unwrap();

    let runs = server.runs("gpt");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = &runs[0];
    assert_eq!((run.run_name.as_str(), run.status.as_str()), ("gpt-tiny", "FINISHED"));
    let reported = &result.metrics_history;
    assert_eq!(reported.len() as u64, STEPS);
    for metric in ["loss", "validation_loss", "validation_perplexity", "learning_rate"] {
        let expected: Vec<(u64, f64)> = reported
            .iter()
            .map(|report| (report.index, report.metrics.get(metric).unwrap()))
            .collect();
        assert_eq!(run.metrics.get(metric), Some(&expected), "metric {metric}");
    }

    let param = |key: &str| run.params.get(key).map(String::as_str);
    let tiny = &training(&sample, STEPS).model;
    assert_eq!(param("model.d_model"), Some(tiny.d_model.to_string().as_str()));
    assert_eq!(param("model.vocab_size"), Some(tiny.vocab_size.to_string().as_str()));
    assert_eq!(param("optimizer.learning_rate"), Some("0.003"));
    assert_eq!(param("optimizer.weight_decay"), Some("0.01"), "an f32 as written");
    assert_eq!(param("steps"), Some("3"));
    assert_eq!(param("scaling.num_workers"), Some("2"));
    assert!(
        param("train").is_some_and(|rows| rows.ends_with(" rows in memory")),
        "{:?}",
        param("train")
    );
    assert_eq!(param("validation"), Some("32 rows"));
    assert!(
        !run.params.contains_key("tokenizer_json"),
        "the tokenizer is not a param: {:?}",
        run.params.keys()
    );
    println!("{:#?}", run.params);
}
