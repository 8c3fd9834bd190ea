//! Errors in OpenAI's format, `{"error": {"message", "type", "param",
//! "code"}}`, with the status OpenAI gives each: 400 for a bad request
//! (`context_length_exceeded` when the prompt and `max_tokens` pass the
//! context), 404 for an unknown model or path, 405 for a wrong method, 503
//! when the replica is too busy to queue more, 500 when the model fails.

use raylet_serve::HttpError;
use serde_json::json;

use crate::LlmError;

/// One failed request, as OpenAI reports it.
#[derive(Debug, PartialEq)]
pub(crate) struct ApiError {
    status: u16,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub(crate) fn invalid(param: &str, message: &str) -> Self {
        ApiError {
            status: 400,
            message: message.to_string(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// A 400 about the body as a whole.
    pub(crate) fn invalid_body(message: &str) -> Self {
        ApiError {
            param: None,
            ..Self::invalid("", message)
        }
    }

    /// A 404 for a model this server does not serve.
    pub(crate) fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            status: 404,
            message: format!("The model `{asked}` does not exist: this server serves `{served}`"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 404 or 405 for a path or method this server does not answer.
    pub(crate) fn no_route(method: &str, path: &str) -> Self {
        let known = ["/v1/completions", "/v1/chat/completions", "/v1/models"];
        let path_known = known
            .iter()
            .any(|known| path.ends_with(known.trim_start_matches("/v1")));
        ApiError {
            status: if path_known { 405 } else { 404 },
            message: format!(
                "{method} {path} is not served: this server answers POST /v1/completions, \
                 POST /v1/chat/completions and GET /v1/models"
            ),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// The error the engine gave a request.
    pub(crate) fn from_engine(error: &LlmError) -> Self {
        let (status, kind, code) = match error {
            LlmError::BeyondContext { .. } | LlmError::BeyondCache { .. } | LlmError::EmptyPrompt => {
                (400, "invalid_request_error", Some("context_length_exceeded"))
            }
            LlmError::Busy { .. } => (503, "server_error", Some("server_busy")),
            _ => (500, "server_error", None),
        };
        ApiError {
            status,
            message: error.to_string(),
            kind,
            param: None,
            code,
        }
    }

    /// A 500: the model failed while generating.
    pub(crate) fn model_failed(message: &str) -> Self {
        ApiError {
            status: 500,
            message: format!("the model failed: {message}"),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn status(&self) -> u16 {
        self.status
    }

    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The error as the body OpenAI's clients read.
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    /// The error as the answer the proxy sends.
    pub(crate) fn into_http(self) -> HttpError {
        HttpError::json(self.status, &self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_has_openais_body() {
        let error = ApiError::invalid("top_p", "top_p 0 is not in (0, 1]");
        assert_eq!(
            error.body(),
            json!({"error": {"message": "top_p 0 is not in (0, 1]", "type": "invalid_request_error",
                             "param": "top_p", "code": null}})
        );
        let http = error.into_http();
        assert_eq!(http.status, 400);
        assert_eq!(http.content_type, "application/json");
    }

    #[test]
    fn engine_errors_get_openais_statuses() {
        let beyond = LlmError::BeyondContext {
            prompt: 100,
            max_tokens: 50,
            context: 128,
        };
        assert_eq!(ApiError::from_engine(&beyond).status(), 400);
        assert_eq!(ApiError::from_engine(&beyond).code, Some("context_length_exceeded"));
        assert_eq!(ApiError::from_engine(&LlmError::Busy { waiting: 3 }).status(), 503);
        assert_eq!(ApiError::from_engine(&LlmError::EngineStopped).status(), 500);
    }

    #[test]
    fn a_known_path_with_the_wrong_method_is_405_and_an_unknown_one_404() {
        assert_eq!(ApiError::no_route("GET", "/v1/completions").status(), 405);
        assert_eq!(ApiError::no_route("POST", "/v1/embeddings").status(), 404);
    }
}
