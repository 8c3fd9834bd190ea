//! What users feel, measured: after streamed requests, the cluster's
//! `/metrics` counts time to first token, inter-token latency and the
//! tokens made, labelled by application and deployment, and the serve
//! status carries the same figures per deployment.

use std::time::{Duration, Instant};

use raylet_llm::EngineOptions;
use serde_json::json;

use crate::common::{MODEL, ServedModel, http_client, init, runtime, send};

/// The value of the sample whose line starts with `series` in a Prometheus
/// text body.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit_once(' '))
        .and_then(|(_, value)| value.parse().ok())
}

#[test]
fn time_to_first_token_inter_token_latency_and_tokens_reach_metrics_and_status() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());
    let http = runtime();
    for prompt in ["def", "class", "import"] {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 20, "ignore_eos": true, "stream": true});
        assert_eq!(
            http.block_on(send(&served, "POST", "/completions", &body.to_string()))
                .status,
            200
        );
    }

    let dashboard = raylet_dashboard::LocalDashboard::start(&cluster, 0).unwrap();
    let url = format!("http://{}/metrics", dashboard.address());
    let labels = r#"{app="llm",deployment="model"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = http.block_on(async {
            let response = http_client()
                .get(&url)
                .bearer_auth(cluster.token())
                .send()
                .await
                .unwrap();
            response.text().await.unwrap()
        });
        let tokens = sample(&body, &format!("serve_llm_generated_tokens_total{labels}"));
        if tokens == Some(60.0) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the tokens never reached /metrics: {tokens:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let first_tokens = sample(&body, &format!("serve_llm_time_to_first_token_seconds_count{labels}"));
    assert_eq!(first_tokens, Some(3.0), "one first token per request");
    let gaps = sample(&body, &format!("serve_llm_inter_token_latency_seconds_count{labels}"));
    assert_eq!(gaps, Some(57.0), "19 gaps per request of 20 tokens");

    let made = served.wait_for_figure("generated_tokens", |made| made == 60.0);
    assert_eq!(made, 60.0);
    let ttft = served.wait_for_figure("ttft_p99_s", |seconds| seconds > 0.0);
    let itl = served.wait_for_figure("itl_p50_s", |seconds| seconds > 0.0);
    assert!(ttft < 60.0 && itl < 60.0, "ttft p99 {ttft} s, itl p50 {itl} s");
    served.wait_for_figure("tokens_per_s", |rate| rate > 0.0);
}
