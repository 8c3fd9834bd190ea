//! A model deployment scaled to zero: it runs no replica until the first
//! request, which waits for one to start and load the model, and gets its
//! answer. The cold start is printed, never asserted.

use std::time::{Duration, Instant};

use raylet_llm::EngineOptions;
use raylet_llm::openai::{ROUTE_PREFIX, deployment};
use raylet_serve::{Application, AutoscalingConfig, HttpOptions};
use serde_json::json;

use crate::common::{MODEL, init, runtime, server_init};

#[test]
fn the_first_request_to_a_model_at_zero_replicas_waits_for_one_and_is_answered() {
    let cluster = init();
    let dir = tempfile::tempdir().unwrap();
    let init = server_init(dir.path(), EngineOptions::default());
    let scaling = AutoscalingConfig {
        min_replicas: 0,
        max_replicas: 1,
        downscale_delay: Duration::from_secs(2),
        metrics_interval: Duration::from_millis(250),
        look_back_period: Duration::from_secs(1),
        ..AutoscalingConfig::default()
    };
    let app = Application::new("cold", ROUTE_PREFIX).deployment(deployment(init).unwrap().autoscaling(scaling));
    let serve = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0)).unwrap();
    let replicas = || serve.status().unwrap().apps[0].deployments[0].replicas.len();
    assert_eq!(replicas(), 0, "no replica before the first request");
    let url = format!("http://{}/v1/completions", serve.address());
    let body = json!({"model": MODEL, "prompt": "def", "max_tokens": 8, "ignore_eos": true}).to_string();
    let complete = || {
        runtime().block_on(async {
            let started = Instant::now();
            let response = crate::common::http_client()
                .post(&url)
                .bearer_auth(cluster.token())
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let answer: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
            (status, answer, started.elapsed())
        })
    };

    let (status, answer, cold) = complete();

    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    let (_, _, warm) = complete();
    println!("a model's cold start from zero replicas: {cold:?} to its answer (warm: {warm:?})");
    let deadline = Instant::now() + Duration::from_secs(60);
    while replicas() > 0 {
        assert!(Instant::now() < deadline, "the idle model never went back to zero");
        std::thread::sleep(Duration::from_millis(200));
    }
}
