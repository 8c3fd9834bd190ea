//! OpenAI's request and response bodies, as far as this server answers
//! them: `POST /v1/completions`, `POST /v1/chat/completions` (both also as
//! server-sent events with `stream: true`) and `GET /v1/models`. A request
//! is checked field by field; what is wrong becomes an [`ApiError`] in
//! OpenAI's error format, never a generation.

use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::ApiError;
use crate::engine::{FinishReason, SamplingParams};

/// OpenAI's limit on stop sequences.
const MAX_STOPS: usize = 4;
/// `max_tokens` of a completion that gives none (OpenAI's default).
const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// The fields both endpoints share.
#[derive(Debug, Deserialize)]
struct CommonFields {
    model: String,
    max_tokens: Option<u64>,
    /// The chat endpoint's newer name for `max_tokens`.
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<Value>,
    seed: Option<i64>,
    /// vLLM's extension: generate past the end-of-text token.
    #[serde(default)]
    ignore_eos: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Value,
    #[serde(flatten)]
    common: CommonFields,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    #[serde(flatten)]
    common: CommonFields,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Completions,
    ChatCompletions,
}

/// A checked request: what to generate and how to answer.
#[derive(Debug, PartialEq)]
pub(crate) struct ApiRequest {
    pub endpoint: Endpoint,
    pub model: String,
    /// The prompt's text (a chat's messages, rendered).
    pub prompt: String,
    /// `None`: as many as the context leaves (the chat endpoint's default).
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

impl ApiRequest {
    /// A `POST /v1/completions` body, checked.
    pub(crate) fn completion(body: &[u8]) -> Result<Self, ApiError> {
        let parsed: CompletionBody = parse(body)?;
        let prompt = match parsed.prompt {
            Value::String(text) => text,
            Value::Array(items) if items.len() == 1 && items[0].is_string() => {
                items[0].as_str().unwrap_or_default().to_string()
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "prompt must be a string (or a list of one string): this server answers one prompt per request",
                ));
            }
        };
        let max_tokens = Some(parsed.common.max_tokens(DEFAULT_COMPLETION_TOKENS)?);
        Self::checked(Endpoint::Completions, prompt, max_tokens, parsed.common)
    }

    /// A `POST /v1/chat/completions` body, checked; the messages are
    /// rendered as `role: content` lines followed by `assistant:`.
    pub(crate) fn chat(body: &[u8]) -> Result<Self, ApiError> {
        let parsed: ChatBody = parse(body)?;
        if parsed.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must have at least one message"));
        }
        let mut prompt = String::new();
        for (index, message) in parsed.messages.iter().enumerate() {
            if !matches!(
                message.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::invalid(
                    &format!("messages[{index}].role"),
                    &format!(
                        "unknown role {:?}: it is one of system, developer, user, assistant, tool",
                        message.role
                    ),
                ));
            }
            let content = message_text(&message.content, index)?;
            prompt.push_str(&format!("{}: {content}\n", message.role));
        }
        prompt.push_str("assistant:");
        let max_tokens = match (parsed.common.max_completion_tokens, parsed.common.max_tokens) {
            (None, None) => None,
            _ => Some(parsed.common.max_tokens(0)?),
        };
        Self::checked(Endpoint::ChatCompletions, prompt, max_tokens, parsed.common)
    }

    fn checked(
        endpoint: Endpoint,
        prompt: String,
        max_tokens: Option<usize>,
        common: CommonFields,
    ) -> Result<Self, ApiError> {
        if common.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(
                "n",
                "n must be 1: this server makes one choice per request",
            ));
        }
        let temperature = common.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                &format!("temperature {temperature} is not between 0 and 2"),
            ));
        }
        let top_p = common.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid("top_p", &format!("top_p {top_p} is not in (0, 1]")));
        }
        Ok(ApiRequest {
            endpoint,
            model: common.model,
            prompt,
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_p,
                seed: common.seed.map(|seed| seed as u64),
            },
            stop: stops(common.stop)?,
            stream: common.stream.unwrap_or(false),
            include_usage: common.stream_options.unwrap_or_default().include_usage,
            ignore_eos: common.ignore_eos.unwrap_or(false),
        })
    }
}

impl CommonFields {
    /// `max_tokens` (or `max_completion_tokens`), `default` when absent;
    /// 0 is refused.
    fn max_tokens(&self, default: usize) -> Result<usize, ApiError> {
        let (field, asked) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(asked), _) => ("max_completion_tokens", asked),
            (None, Some(asked)) => ("max_tokens", asked),
            (None, None) => return Ok(default),
        };
        if asked == 0 {
            return Err(ApiError::invalid(
                field,
                &format!("{field} is 0: it must be at least 1"),
            ));
        }
        Ok(usize::try_from(asked).unwrap_or(usize::MAX))
    }
}

/// Whether a request body asks to stream; false when it is not JSON.
pub(crate) fn asks_to_stream(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct StreamField {
        stream: Option<bool>,
    }
    serde_json::from_slice::<StreamField>(body).is_ok_and(|fields| fields.stream == Some(true))
}

/// The body as `T`, or OpenAI's 400 with serde's message.
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(&format!("the request body is not a valid request: {e}")))
}

/// A message's text: a string, or a list of `{"type": "text", "text": ..}`
/// parts.
fn message_text(content: &Value, index: usize) -> Result<String, ApiError> {
    let param = format!("messages[{index}].content");
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match (part.get("type"), part.get("text")) {
                (Some(kind), Some(Value::String(text))) if kind == "text" => Ok(text.as_str()),
                _ => Err(ApiError::invalid(&param, "only text content parts are supported")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        _ => Err(ApiError::invalid(
            &param,
            "content must be a string or a list of text parts",
        )),
    }
}

/// `stop`: a string or a list of at most four strings.
fn stops(stop: Option<Value>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(stop)) => vec![stop],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::String(stop) => Ok(stop),
                _ => Err(ApiError::invalid("stop", "stop must be a string or a list of strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("stop", "stop must be a string or a list of strings")),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            &format!("stop has {} sequences: at most {MAX_STOPS} are allowed", stops.len()),
        ));
    }
    Ok(stops)
}

/// OpenAI's name for a finish reason.
pub(crate) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::Stop => "stop",
    }
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub(crate) fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(body: Value) -> Result<ApiRequest, ApiError> {
        ApiRequest::completion(body.to_string().as_bytes())
    }

    fn chat(body: Value) -> Result<ApiRequest, ApiError> {
        ApiRequest::chat(body.to_string().as_bytes())
    }

    fn message(error: ApiError) -> String {
        error.message().to_string()
    }

    #[test]
    fn a_completion_takes_openais_defaults() {
        let request = completion(json!({"model": "m", "prompt": "def f("})).unwrap();
        assert_eq!(request.prompt, "def f(");
        assert_eq!(request.max_tokens, Some(16));
        assert_eq!(request.sampling, SamplingParams::default());
        assert!(!request.stream && request.stop.is_empty() && !request.ignore_eos);
    }

    #[test]
    fn every_field_of_a_completion_is_read() {
        let body = json!({
            "model": "m", "prompt": ["x"], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
            "n": 1, "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n\n", "#"],
            "seed": 42, "ignore_eos": true, "user": "ignored"
        });
        let request = completion(body).unwrap();
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(
            request.sampling,
            SamplingParams {
                temperature: 0.5,
                top_p: 0.9,
                seed: Some(42)
            }
        );
        assert!(request.stream && request.include_usage && request.ignore_eos);
        assert_eq!(request.stop, ["\n\n", "#"]);
    }

    #[test]
    fn a_chat_renders_its_messages_and_leaves_max_tokens_to_the_context() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "Write Python."},
            {"role": "user", "content": [{"type": "text", "text": "a sum"}, {"type": "text", "text": "!"}]}
        ]});
        let request = chat(body).unwrap();
        assert_eq!(request.prompt, "system: Write Python.\nuser: a sum!\nassistant:");
        assert_eq!(request.max_tokens, None);
        assert_eq!(request.endpoint, Endpoint::ChatCompletions);
        let bounded = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                  "max_completion_tokens": 9}));
        assert_eq!(bounded.unwrap().max_tokens, Some(9));
    }

    #[test]
    fn bad_fields_are_refused_with_their_name() {
        let cases = [
            (json!({"model": "m", "prompt": "x", "max_tokens": 0}), "max_tokens is 0"),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": -3}),
                "invalid value: integer `-3`",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": "ten"}),
                "invalid type: string \"ten\"",
            ),
            (
                json!({"model": "m", "prompt": "x", "temperature": 3}),
                "temperature 3 is not between 0 and 2",
            ),
            (
                json!({"model": "m", "prompt": "x", "top_p": 0}),
                "top_p 0 is not in (0, 1]",
            ),
            (json!({"model": "m", "prompt": "x", "n": 2}), "n must be 1"),
            (json!({"model": "m", "prompt": ["a", "b"]}), "one prompt per request"),
            (json!({"model": "m", "prompt": 5}), "prompt must be a string"),
            (
                json!({"model": "m", "prompt": "x", "stop": [1]}),
                "stop must be a string",
            ),
            (
                json!({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
                "at most 4",
            ),
            (json!({"prompt": "x"}), "missing field `model`"),
        ];
        for (body, expected) in cases {
            let error = completion(body.clone()).unwrap_err();
            assert_eq!(error.status(), 400, "{body}");
            assert!(message(error).contains(expected), "{body}: expected {expected:?}");
        }
        let not_json = ApiRequest::completion(b"{\"model\": ").unwrap_err();
        assert!(message(not_json).contains("EOF while parsing"));
        let no_messages = chat(json!({"model": "m", "messages": []})).unwrap_err();
        assert!(message(no_messages).contains("at least one message"));
        let bad_role = chat(json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]})).unwrap_err();
        assert!(message(bad_role).contains("unknown role \"robot\""));
    }

    #[test]
    fn only_a_json_body_with_stream_true_asks_to_stream() {
        assert!(asks_to_stream(br#"{"stream": true, "model": "m"}"#));
        assert!(!asks_to_stream(br#"{"stream": false}"#));
        assert!(!asks_to_stream(b"{}"));
        assert!(!asks_to_stream(b"not json"));
    }
}
