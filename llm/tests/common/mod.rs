//! A small GPT served OpenAI-compatibly on an embedded cluster, and an
//! HTTP client for it. The GPT is untrained (its weights are random, its
//! tokenizer is trained on a few lines of Python): what it writes means
//! nothing, but every token goes through the same engine, cache and API as
//! a trained model's.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::prelude::Device;
use raylet_llm::EngineOptions;
use raylet_llm::openai::{ServerInit, application};
use raylet_lm::TrainedGpt;
use raylet_models::gpt::{Gpt, GptConfig};
use raylet_models::tokenizer::LmTokenizer;
use raylet_serve::{HttpOptions, ServeInstance};
use serde_json::Value;

/// The name the model is served under.
pub const MODEL: &str = "tiny-gpt";
/// The context of the served model.
pub const CONTEXT: usize = 1024;

pub fn init() -> raylet::Cluster {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster")
}

/// Python that the tokenizer learns from.
const PYTHON: &str = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        \
                      self.x = x\n        self.y = y\n\nfor i in range(10):\n    print(i, add(i, 1))\n";

/// Writes an untrained GPT of `CONTEXT` tokens and its tokenizer as a
/// checkpoint in `dir`.
pub fn write_checkpoint(dir: &Path) -> PathBuf {
    let tokenizer = LmTokenizer::train([PYTHON; 8], 400).expect("a tokenizer");
    let config = GptConfig {
        vocab_size: tokenizer.vocab_size(),
        context_length: CONTEXT,
        d_model: 128,
        n_heads: 4,
        n_layers: 2,
        mlp_ratio: 4,
        dropout: 0.0,
    };
    let device = Device::flex();
    device.seed(11);
    let model = Gpt::new(&config, &device).expect("a GPT");
    let checkpoint = dir.join("checkpoint");
    TrainedGpt::save(&checkpoint, &model, &config, &tokenizer, 0).expect("a checkpoint");
    checkpoint
}

/// What a replica serving a GPT written in `dir` is built from.
pub fn server_init(dir: &Path, engine: EngineOptions) -> ServerInit {
    ServerInit {
        model_name: MODEL.into(),
        checkpoint: write_checkpoint(dir),
        engine,
    }
}

/// The model served at `/v1` by one replica, with these engine options.
pub struct ServedModel {
    pub serve: ServeInstance,
    pub token: String,
    _dir: tempfile::TempDir,
}

impl ServedModel {
    pub fn start(cluster: &raylet::Cluster, engine: EngineOptions) -> Self {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let app = application("llm", server_init(dir.path(), engine), 1).expect("an application");
        let serve = raylet_serve::run_with(cluster, app, HttpOptions::default().port(0)).expect("served");
        ServedModel {
            serve,
            token: cluster.token(),
            _dir: dir,
        }
    }

    /// OpenAI's `base_url` for this server.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.serve.address())
    }

    /// The figure `name` of the model deployment in the serve status.
    pub fn figure(&self, name: &str) -> Option<f64> {
        let status = self.serve.status().expect("the serve status");
        status
            .apps
            .iter()
            .flat_map(|app| &app.deployments)
            .flat_map(|deployment| &deployment.figures)
            .find(|figure| figure.name == name)
            .map(|figure| figure.value)
    }

    /// Waits until figure `name` satisfies `holds`; its last value.
    pub fn wait_for_figure(&self, name: &str, holds: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.figure(name);
            if let Some(value) = value
                && holds(value)
            {
                return value;
            }
            assert!(Instant::now() < deadline, "figure {name} stayed at {value:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A runtime for the HTTP client.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// What a request got: its status, content type and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// OpenAI's error message, asserting the error's shape.
    pub fn error_message(&self) -> String {
        let body = self.json();
        let error = &body["error"];
        assert!(error["type"].is_string(), "not OpenAI's error body: {body}");
        error["message"].as_str().expect("a message").to_string()
    }
}

/// An HTTP client. In a workspace build reqwest is unified with
/// raylet-train's `rustls-no-provider` feature, which needs a provider
/// installed before any client is built, TLS or not.
pub fn http_client() -> reqwest::Client {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client")
}

/// Sends `method` `path` (below `/v1`) with a JSON `body` and the token.
pub async fn send(served: &ServedModel, method: &str, path: &str, body: &str) -> Answer {
    let client = http_client();
    let url = format!("{}{path}", served.base_url());
    let request = match method {
        "GET" => client.get(url),
        "POST" => client.post(url),
        other => client.request(other.parse().expect("a method"), url),
    };
    let response = request
        .bearer_auth(&served.token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|value| value.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let body = response.text().await.expect("a body");
    Answer {
        status,
        content_type,
        body,
    }
}

/// The JSON of each `data:` event of a server-sent event stream, and
/// whether it ended with `[DONE]`.
pub fn events(stream: &str) -> (Vec<Value>, bool) {
    let mut chunks = Vec::new();
    let mut done = false;
    for event in stream.split("\n\n").filter(|event| !event.is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not an event: {event:?}"));
        match data {
            "[DONE]" => done = true,
            data => chunks.push(serde_json::from_str(data).expect("a JSON chunk")),
        }
    }
    (chunks, done)
}
