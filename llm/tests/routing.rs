//! Routing by the room in each replica's key/value cache: one replica's
//! cache is filled by a long request, so it reports itself full and every
//! request goes to the other, which has room, and ends long before the
//! long request does. Routed by request counts alone, one of three short
//! requests would always land on the full replica and wait there until
//! the long request ended.

use std::time::{Duration, Instant};

use raylet_llm::openai::application;
use raylet_llm::{EngineOptions, GptModel, LanguageModel, Tokenizer};
use raylet_serve::HttpOptions;
use serde_json::json;

use crate::common::{MODEL, http_client, init, runtime, server_init};

/// The prompt of every request.
const PROMPT: &str = "x";
/// The long request's tokens, and the short ones'.
const LONG: usize = 896;
const SHORT: usize = 96;

#[test]
fn requests_go_to_the_replica_with_room_in_its_cache_while_the_other_is_full() {
    let cluster = init();
    let dir = tempfile::tempdir().unwrap();
    let mut init = server_init(dir.path(), EngineOptions::default());
    let (model, tokenizer) = GptModel::load(&init.checkpoint).unwrap();
    let prompt_tokens = tokenizer.encode(PROMPT).unwrap().len();
    // Each replica's cache holds exactly the long request, or three short ones.
    init.engine.kv_cache_bytes = (prompt_tokens + LONG) * model.cache_bytes_per_token();
    let http = HttpOptions::default().port(0);
    let serve = raylet_serve::run_with(&cluster, application("routed", init, 2).unwrap(), http).unwrap();
    let url = format!("http://{}/v1/completions", serve.address());
    let token = cluster.token();

    runtime().block_on(async move {
        let open = |max_tokens: usize| {
            let body = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                              "ignore_eos": true, "stream": true});
            let request = http_client().post(&url).bearer_auth(&token).body(body.to_string());
            async move {
                let mut response = request.send().await.unwrap();
                assert_eq!(response.status(), 200);
                response.chunk().await.unwrap().expect("a first event");
                response
            }
        };
        let until_done = |mut response: reqwest::Response| async move {
            while response.chunk().await.unwrap().is_some() {}
            Instant::now()
        };
        let long = tokio::spawn(until_done(open(LONG).await));
        let shorts: Vec<_> = (0..3)
            .map(|_| open(SHORT))
            .map(|opening| tokio::spawn(async move { until_done(opening.await).await }))
            .collect();

        let mut shorts_done = Vec::new();
        for short in shorts {
            let done = tokio::time::timeout(Duration::from_secs(120), short).await.unwrap();
            shorts_done.push(done.unwrap());
        }
        let long_done = long.await.unwrap();
        for done in shorts_done {
            assert!(
                done < long_done,
                "a short request ended after the long one: it went to the replica whose cache was full"
            );
        }
    });
}
