//! [`OpenAiServer`]: a raylet-serve deployment that serves one model's
//! engine over OpenAI's API. It streams every answer (`STREAMING`): a
//! request with `stream: true` gets server-sent events, one per token's
//! text, a last one with the finish reason (and the usage, when
//! `stream_options.include_usage` asks), then `data: [DONE]`; any other
//! gets one JSON body. A bad request gets OpenAI's error body and status
//! before anything is generated. The cluster token is the API key: the
//! proxy checks it as a bearer token, which is how OpenAI's clients send
//! their key.
//!
//! A replica reports its fullness (cache reserved and needed over its
//! budget), so routers send requests to the replica with room in its
//! cache.
//!
//! Served under the route prefix `/v1`, so that a client's `base_url` is
//! `http://<proxy>/v1`; under another prefix the paths below it are
//! `/completions`, `/chat/completions` and `/models` all the same.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::stream::{self, BoxStream};
use futures_util::{Stream, StreamExt};
use raylet_serve::{BoxError, Combine, Deployment, Figure, HttpRequest, ReplicaContext};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::protocol::{ApiRequest, Endpoint, Usage, asks_to_stream, finish_reason};
use crate::engine::{Engine, EngineOptions, Event, FinishReason, Generation, GenerationRequest};
use crate::model::{GptModel, Tokenizer};
use crate::stats::{ServingStats, StatsLabels};

/// What every replica of an [`OpenAiServer`] is built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerInit {
    /// The name clients ask for in `model`.
    pub model_name: String,
    /// A GPT checkpoint directory of raylet-lm's training, which every
    /// node can read.
    pub checkpoint: PathBuf,
    pub engine: EngineOptions,
}

/// One replica: an engine and the model's name.
pub struct OpenAiServer {
    served: Arc<Served>,
}
raylet_serve::register_deployment!(OpenAiServer);

/// What the answers of a replica share.
struct Served {
    engine: Engine,
    tokenizer: Arc<dyn Tokenizer>,
    model_name: String,
    stats: Arc<ServingStats>,
    /// When the replica started, in seconds since the epoch (`created`).
    created: u64,
}

/// The chunks of an answer.
type Chunks = BoxStream<'static, Result<Bytes, BoxError>>;

impl Deployment for OpenAiServer {
    type Init = ServerInit;
    type UserConfig = ();
    type Request = HttpRequest;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(init: ServerInit, context: &ReplicaContext) -> Result<Self, BoxError> {
        let (model, tokenizer) = GptModel::load(&init.checkpoint)?;
        let stats = Arc::new(ServingStats::labelled(StatsLabels {
            app: context.app.clone(),
            deployment: context.deployment.clone(),
            replica: context.replica.clone(),
        }));
        let tokenizer: Arc<dyn Tokenizer> = tokenizer;
        let engine = Engine::start(model, tokenizer.clone(), init.engine, stats.clone())?;
        Ok(OpenAiServer {
            served: Arc::new(Served {
                engine,
                tokenizer,
                model_name: init.model_name,
                stats,
                created: unix_seconds(),
            }),
        })
    }

    /// The whole answer at once, for a handle's `call`: the JSON body, or
    /// the events of a streamed answer, concatenated.
    async fn call(&self, request: HttpRequest) -> Result<Bytes, BoxError> {
        let mut answer = Vec::new();
        let mut chunks = self.served.clone().answer(request);
        while let Some(chunk) = chunks.next().await {
            answer.extend_from_slice(&chunk?);
        }
        Ok(answer.into())
    }

    fn stream(&self, request: HttpRequest) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        self.served.clone().answer(request)
    }

    fn stream_content_type(&self, request: &HttpRequest) -> String {
        match request.method == "POST" && asks_to_stream(&request.body) {
            true => "text/event-stream".into(),
            false => "application/json".into(),
        }
    }

    /// The cache its sequences reserved plus what its waiting requests
    /// need, over its budget: routers send a request to the emptier of two
    /// replicas, and none to a replica at 1 or more.
    fn fullness(&self) -> Option<f64> {
        Some(self.served.engine.fullness())
    }

    fn figures(&self) -> Vec<Figure> {
        let snapshot = self.served.stats.snapshot();
        let engine = &self.served.engine;
        let budget = engine.budget();
        vec![
            Figure::new("tokens_per_s", snapshot.tokens_per_second, Combine::Sum),
            Figure::new("generated_tokens", snapshot.generated_tokens as f64, Combine::Sum),
            Figure::new("ttft_p50_s", snapshot.time_to_first_token_p50, Combine::Mean),
            Figure::new("ttft_p99_s", snapshot.time_to_first_token_p99, Combine::Mean),
            Figure::new("itl_p50_s", snapshot.inter_token_latency_p50, Combine::Mean),
            Figure::new("itl_p99_s", snapshot.inter_token_latency_p99, Combine::Mean),
            Figure::new("running", engine.running() as f64, Combine::Sum),
            Figure::new("waiting", engine.waiting() as f64, Combine::Sum),
            Figure::new(
                "kv_cache_used",
                budget.reserved() as f64 / budget.capacity() as f64,
                Combine::Mean,
            ),
        ]
    }
}

impl Served {
    /// The answer to `request`, chunk by chunk; an error before the first
    /// chunk is OpenAI's error, which the proxy answers with. The request
    /// is checked, tokenized and handed to the engine at once, so that the
    /// replica's fullness counts it before the next request is admitted.
    fn answer(self: Arc<Self>, request: HttpRequest) -> Chunks {
        match self.open(&request) {
            Ok(chunks) => chunks,
            Err(error) => stream::iter([Err(error.into_http().into())]).boxed(),
        }
    }

    /// Routes the request and starts its generation.
    fn open(self: Arc<Self>, request: &HttpRequest) -> Result<Chunks, ApiError> {
        let path = request.path.strip_prefix("/v1").unwrap_or(&request.path);
        let asked = match (request.method.as_str(), path.trim_end_matches('/')) {
            ("GET", "/models") => return Ok(one_chunk(self.models())),
            ("POST", "/completions") => ApiRequest::completion(&request.body)?,
            ("POST", "/chat/completions") => ApiRequest::chat(&request.body)?,
            (method, _) => return Err(ApiError::no_route(method, &request.path)),
        };
        if asked.model != self.model_name {
            return Err(ApiError::unknown_model(&asked.model, &self.model_name));
        }
        let generation = self.submit(&asked)?;
        let reply = Reply {
            served: self,
            id: format!("{}-{:016x}", asked.endpoint.id_prefix(), rand::random::<u64>()),
            endpoint: asked.endpoint,
            include_usage: asked.include_usage,
        };
        Ok(match asked.stream {
            true => reply.events(generation),
            false => stream::once(reply.whole(generation)).boxed(),
        })
    }

    /// Tokenizes the prompt and hands it to the engine.
    fn submit(&self, asked: &ApiRequest) -> Result<Generation, ApiError> {
        let mut prompt = self
            .tokenizer
            .encode(&asked.prompt)
            .map_err(|e| ApiError::invalid("prompt", &e.to_string()))?;
        if prompt.is_empty() {
            prompt.push(self.tokenizer.end_of_text());
        }
        let context = self.engine.context_length();
        let max_tokens = asked.max_tokens.unwrap_or(context.saturating_sub(prompt.len()).max(1));
        let request = GenerationRequest {
            prompt,
            max_tokens,
            sampling: asked.sampling,
            stop: asked.stop.clone(),
            ignore_eos: asked.ignore_eos,
        };
        self.engine.submit(request).map_err(|e| ApiError::from_engine(&e))
    }

    /// `GET /v1/models`.
    fn models(&self) -> Value {
        json!({"object": "list", "data": [{
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "raylet",
        }]})
    }
}

impl Endpoint {
    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl",
            Endpoint::ChatCompletions => "chatcmpl",
        }
    }
}

/// How one request's answer is written.
struct Reply {
    served: Arc<Served>,
    id: String,
    endpoint: Endpoint,
    include_usage: bool,
}

impl Reply {
    /// The whole answer as one JSON body, once the generation ends.
    async fn whole(self, mut generation: Generation) -> Result<Bytes, BoxError> {
        let mut text = String::new();
        while let Some(event) = generation.events.recv().await {
            match event {
                Event::Token(piece) => text.push_str(&piece),
                Event::Finished {
                    reason,
                    completion_tokens,
                } => {
                    let usage = Usage {
                        prompt_tokens: generation.prompt_tokens,
                        completion_tokens,
                    };
                    return Ok(Bytes::from(self.completed(&text, reason, usage).to_string()));
                }
                Event::Failed(message) => return Err(ApiError::model_failed(&message).into_http().into()),
            }
        }
        Err(ApiError::model_failed("the engine stopped").into_http().into())
    }

    /// The answer as server-sent events: a chat's first names the role,
    /// then one per token with text, the finish, the usage if asked, and
    /// `[DONE]`.
    fn events(self, generation: Generation) -> Chunks {
        let opening = match self.endpoint {
            Endpoint::ChatCompletions => vec![Ok(
                self.event(&self.chunk(json!({"role": "assistant", "content": ""}), None))
            )],
            Endpoint::Completions => Vec::new(),
        };
        let tokens = stream::unfold(Some((self, generation)), |state| async move {
            let (reply, mut generation) = state?;
            loop {
                match generation.events.recv().await {
                    Some(Event::Token(text)) if text.is_empty() => continue,
                    Some(Event::Token(text)) => {
                        let chunk = reply.event(&reply.chunk(json!(text), None));
                        return Some((Ok(chunk), Some((reply, generation))));
                    }
                    Some(Event::Finished {
                        reason,
                        completion_tokens,
                    }) => {
                        let usage = Usage {
                            prompt_tokens: generation.prompt_tokens,
                            completion_tokens,
                        };
                        return Some((Ok(reply.ending(reason, usage)), None));
                    }
                    Some(Event::Failed(message)) => return Some((Err(message.into()), None)),
                    None => return Some((Err("the engine stopped".into()), None)),
                }
            }
        });
        stream::iter(opening).chain(tokens).boxed()
    }

    /// The last events: the finish reason, the usage when asked, `[DONE]`.
    fn ending(&self, reason: FinishReason, usage: Usage) -> Bytes {
        let empty = match self.endpoint {
            Endpoint::ChatCompletions => json!({}),
            Endpoint::Completions => json!(""),
        };
        let mut events = self.event(&self.chunk(empty, Some(reason))).to_vec();
        if self.include_usage {
            let mut usage_chunk = self.chunk(json!(""), None);
            usage_chunk["choices"] = json!([]);
            usage_chunk["usage"] = usage.json();
            events.extend_from_slice(&self.event(&usage_chunk));
        }
        events.extend_from_slice(b"data: [DONE]\n\n");
        events.into()
    }

    /// One streamed chunk: a completion's `text` or a chat's `delta`.
    fn chunk(&self, piece: Value, reason: Option<FinishReason>) -> Value {
        let reason = reason.map(finish_reason);
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => (
                "text_completion",
                json!({"index": 0, "text": piece, "logprobs": null, "finish_reason": reason}),
            ),
            Endpoint::ChatCompletions => {
                let delta = match piece {
                    Value::String(text) => json!({"content": text}),
                    delta => delta,
                };
                (
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason}),
                )
            }
        };
        self.envelope(object, choice)
    }

    /// The whole answer's body.
    fn completed(&self, text: &str, reason: FinishReason, usage: Usage) -> Value {
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(reason)}),
            ),
            Endpoint::ChatCompletions => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": finish_reason(reason)}),
            ),
        };
        let mut body = self.envelope(object, choice);
        body["usage"] = usage.json();
        body
    }

    /// What every body and chunk has around its one choice.
    fn envelope(&self, object: &str, choice: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": unix_seconds(),
            "model": self.served.model_name,
            "choices": [choice],
        })
    }

    fn event(&self, chunk: &Value) -> Bytes {
        Bytes::from(format!("data: {chunk}\n\n"))
    }
}

fn one_chunk(body: Value) -> Chunks {
    stream::iter([Ok(Bytes::from(body.to_string()))]).boxed()
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
