//! The OpenAI-compatible API over real HTTP: the models list, whole and
//! streamed completions and chats in OpenAI's format, and every kind of
//! bad request answered with OpenAI's error body and status while the
//! server goes on serving.

use crate::common::{CONTEXT, MODEL, ServedModel, events, init, runtime, send};
use raylet_llm::EngineOptions;
use serde_json::{Value, json};

fn completion(prompt: &str, max_tokens: usize, stream: bool) -> String {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "ignore_eos": true, "stream": stream})
    .to_string()
}

#[test]
fn models_are_listed_and_completions_and_chats_are_answered_in_openais_format() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());
    let http = runtime();

    let models = http.block_on(send(&served, "GET", "/models", "")).json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);

    let answer = http.block_on(send(
        &served,
        "POST",
        "/completions",
        &completion("def add(", 12, false),
    ));
    assert_eq!((answer.status, answer.content_type.as_str()), (200, "application/json"));
    let body = answer.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(body["choices"][0]["text"].is_string());
    assert_eq!(body["usage"]["completion_tokens"], 12);
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(body["usage"]["total_tokens"], prompt_tokens + 12);

    let chat = json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let body = http
        .block_on(send(&served, "POST", "/chat/completions", &chat.to_string()))
        .json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert!(body["choices"][0]["message"]["content"].is_string());
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
}

#[test]
fn a_streamed_completion_is_server_sent_events_that_add_up_to_the_whole_answer() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());
    let http = runtime();
    let whole = http.block_on(send(&served, "POST", "/completions", &completion("class P", 20, false)));
    let whole_text = whole.json()["choices"][0]["text"].as_str().unwrap().to_string();

    let streamed = http.block_on(send(&served, "POST", "/completions", &completion("class P", 20, true)));

    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.content_type, "text/event-stream");
    let (chunks, done) = events(&streamed.body);
    assert!(done, "the stream ends with [DONE]: {}", streamed.body);
    let text: String = chunks
        .iter()
        .map(|chunk| chunk["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole_text, "greedy decoding gives the same text streamed or not");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    assert!(chunks.len() > 5, "a chunk per token: {}", chunks.len());
    let ids: std::collections::HashSet<&Value> = chunks.iter().map(|chunk| &chunk["id"]).collect();
    assert_eq!(ids.len(), 1, "one id for the whole stream");
}

#[test]
fn bad_requests_get_openais_error_bodies_and_the_server_goes_on() {
    let cluster = init();
    let served = ServedModel::start(&cluster, EngineOptions::default());
    let http = runtime();
    let post = |path: &str, body: &str| http.block_on(send(&served, "POST", path, body));
    let long_prompt = "x = 1\n".repeat(CONTEXT);

    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "/completions",
            completion(&long_prompt, 16, false),
            400,
            "the context length, 1024 tokens",
        ),
        (
            "/completions",
            completion(&long_prompt, 16, true),
            400,
            "the context length, 1024 tokens",
        ),
        (
            "/completions",
            completion("x", 0, false),
            400,
            "max_tokens is 0: it must be at least 1",
        ),
        (
            "/completions",
            completion("x", CONTEXT + 1, false),
            400,
            "max_tokens is 1025",
        ),
        (
            "/completions",
            "{\"model\": \"tiny-gpt\", \"prompt\": ".into(),
            400,
            "EOF while parsing",
        ),
        (
            "/completions",
            json!({"model": MODEL, "prompt": "x", "max_tokens": "9"}).to_string(),
            400,
            "invalid type",
        ),
        (
            "/completions",
            json!({"model": MODEL, "prompt": "x", "temperature": -1}).to_string(),
            400,
            "temperature -1",
        ),
        (
            "/completions",
            json!({"model": "gpt-4", "prompt": "x"}).to_string(),
            404,
            "The model `gpt-4` does not exist",
        ),
        (
            "/chat/completions",
            json!({"model": MODEL, "messages": "hi"}).to_string(),
            400,
            "invalid type",
        ),
        (
            "/embeddings",
            json!({"model": MODEL, "input": "x"}).to_string(),
            404,
            "POST /embeddings is not served",
        ),
    ];
    for (path, body, status, expected) in cases {
        let answer = post(path, &body);
        let shown = &body[..body.len().min(80)];
        assert_eq!(answer.status, status, "{path} {shown}: {}", answer.body);
        assert_eq!(answer.content_type, "application/json", "{path} {shown}");
        let message = answer.error_message();
        assert!(message.contains(expected), "{path} {shown}: {message}");
    }
    let too_long = post("/completions", &completion(&long_prompt, 16, false)).json();
    assert_eq!(too_long["error"]["code"], "context_length_exceeded");
    let unknown_model = post("/completions", &json!({"model": "gpt-4", "prompt": "x"}).to_string()).json();
    assert_eq!(unknown_model["error"]["code"], "model_not_found");
    let wrong_method = http.block_on(send(&served, "GET", "/completions", ""));
    assert_eq!(wrong_method.status, 405);

    let answer = post("/completions", &completion("def", 3, false));
    assert_eq!(answer.status, 200, "the server still answers: {}", answer.body);
    assert_eq!(answer.json()["usage"]["completion_tokens"], 3);
}
