//! The official `openai` Python client against a served model: whole and
//! streamed completions and chats, 32 concurrent streams, a client that
//! disconnects mid-stream (its sequence's place is freed at once), and bad
//! requests raising the client's own error classes. The client lives in
//! the venv `target/openai-venv`, which `tools/test.sh` installs.

use std::path::{Path, PathBuf};
use std::process::Command;

use raylet_llm::EngineOptions;
use serde_json::Value;

use crate::common::{MODEL, ServedModel, init};

/// The `openai` release `tools/test.sh` installs.
const OPENAI_VERSION: &str = "3.57.0";

fn python() -> PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/openai-venv/bin/python");
    assert!(
        python.exists(),
        "the openai client's venv is missing: tools/test.sh makes it, or run \
         python3 -m venv target/openai-venv && target/openai-venv/bin/pip install openai=={OPENAI_VERSION}"
    );
    python
}

/// Runs scenario `scenario` of openai_client.py; what it printed.
fn client(served: &ServedModel, scenario: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = Command::new(python())
        .arg(script)
        .args([scenario, &served.base_url(), &served.token, MODEL])
        .output()
        .expect("python starts");
    assert!(
        output.status.success(),
        "openai_client.py {scenario} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

#[test]
fn the_openai_client_completes_chats_and_streams() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());

    let result = client(&served, "basic");

    assert_eq!(result["models"], serde_json::json!([MODEL]));
    assert_eq!(result["whole_finish"], "length");
    assert_eq!(result["whole_usage"], 16);
    assert_eq!(result["streamed_text"], result["whole_text"], "{result}");
    assert_eq!(result["streamed_finish"], "length");
    assert_eq!(result["streamed_usage"], 16);
    assert!(result["streamed_chunks"].as_u64().unwrap() > 3, "{result}");
    assert_eq!(result["chat_role"], "assistant");
    assert_eq!(result["chat_streamed_text"], result["chat_text"], "{result}");
    let sampled = result["sampled"].as_array().unwrap();
    assert_eq!(sampled[0], sampled[1], "one seed, one text");
    assert_ne!(sampled[0], sampled[2], "another seed, another text");
}

#[test]
fn thirty_two_concurrent_streams_each_get_their_tokens() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());

    let result = client(&served, "concurrent");

    let usages = result["usages"].as_array().unwrap();
    assert_eq!(usages.len(), 32);
    assert!(usages.iter().all(|usage| usage == 16), "{result}");
    served.wait_for_figure("kv_cache_used", |used| used == 0.0);
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_sequence() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());

    let result = client(&served, "disconnect");

    assert_eq!(result["read"], 2);
    let made = served.wait_for_figure("generated_tokens", |made| made >= 2.0);
    served.wait_for_figure("running", |running| running == 0.0);
    served.wait_for_figure("kv_cache_used", |used| used == 0.0);
    assert!(made < 1000.0, "the abandoned sequence ran to its end: {made} tokens");
}

#[test]
fn bad_requests_raise_the_clients_own_errors() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());

    let result = client(&served, "bad");

    let outcome = |name: &str| &result[name];
    assert_eq!(outcome("too_long")["status"], 400, "{result}");
    assert_eq!(outcome("too_long")["class"], "BadRequestError");
    assert_eq!(outcome("too_long")["code"], "context_length_exceeded");
    assert!(outcome("too_long")["message"].as_str().unwrap().contains("1024 tokens"));
    assert_eq!(outcome("unknown_model")["class"], "NotFoundError", "{result}");
    assert_eq!(outcome("unknown_model")["code"], "model_not_found");
    assert_eq!(outcome("zero_tokens")["class"], "BadRequestError", "{result}");
    assert_eq!(outcome("wrong_key")["class"], "AuthenticationError", "{result}");
    assert_eq!(outcome("wrong_key")["status"], 401);
}
