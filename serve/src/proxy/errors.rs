//! How every outcome becomes an HTTP response: the one table from
//! [`ServeError`] to a status code.
//!
//! | outcome | status |
//! |---|---|
//! | malformed JSON, wrong type | 400 |
//! | no or wrong token | 401, `WWW-Authenticate: Bearer` |
//! | no application at the path | 404 |
//! | body too large | 413 (axum's body limit) |
//! | back-pressure, no replica will come, replica died | 503, `Retry-After: 1` |
//! | user error or panic | 500, JSON naming deployment and replica |
//! | an [`HttpError`](crate::HttpError) of user code | its status, content type and body |
//! | request timeout | 504 |

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ServeError;

/// The status a failed request gets.
pub(super) fn status(error: &ServeError) -> StatusCode {
    match error {
        ServeError::BadRequest { .. } => StatusCode::BAD_REQUEST,
        ServeError::BackPressure { .. } | ServeError::NoReplicas { .. } | ServeError::ReplicaDied { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ServeError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        ServeError::Status { error, .. } => {
            StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
        ServeError::NotRegistered(_)
        | ServeError::InvalidConfig(_)
        | ServeError::Encode { .. }
        | ServeError::UnknownDeployment { .. }
        | ServeError::WrongDeploymentType { .. }
        | ServeError::ReplicaFailed { .. }
        | ServeError::User { .. }
        | ServeError::BadResponse { .. }
        | ServeError::DeployFailed { .. }
        | ServeError::NoSuchApp(_)
        | ServeError::ControllerGone(_)
        | ServeError::OtherBuild { .. }
        | ServeError::WaitTimedOut { .. }
        | ServeError::NotRunning { .. }
        | ServeError::NoProxy { .. }
        | ServeError::Http(_)
        | ServeError::Cluster(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The response to a failed request: a 503 says when to retry, and a user
/// error names its deployment and replica in JSON.
pub(super) fn response(error: &ServeError) -> Response {
    let status = status(error);
    match error {
        ServeError::User {
            deployment,
            replica,
            message,
        } => {
            let body = json!({"error": message, "deployment": deployment, "replica": replica});
            (status, Json(body)).into_response()
        }
        ServeError::Status { error, .. } => {
            let content_type = content_type(&error.content_type);
            (status, [(header::CONTENT_TYPE, content_type)], error.body.clone()).into_response()
        }
        _ if status == StatusCode::SERVICE_UNAVAILABLE => {
            (status, [(header::RETRY_AFTER, "1")], format!("{error}\n")).into_response()
        }
        _ => (status, format!("{error}\n")).into_response(),
    }
}

/// `content_type` as a header value; one that cannot be a header is
/// `application/octet-stream`.
pub(super) fn content_type(content_type: &str) -> HeaderValue {
    HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("application/octet-stream"))
}

/// A 404 for a path under no application.
pub(super) fn no_route(path: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no application is served at {path}\n")).into_response()
}

/// A 401 that says how to present the token, never showing it.
pub(super) fn unauthorized() -> Response {
    let message = "this raylet cluster needs its token: send Authorization: Bearer <token> \
                   (the token is in <temp-dir>/session_latest/token), or deploy the application as public\n";
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        message,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn user_errors_name_deployment_and_replica() {
        let error = ServeError::User {
            deployment: "classifier".into(),
            replica: "replica:app:classifier:0".into(),
            message: "bad weights".into(),
        };
        let response = response(&error);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn overload_says_when_to_retry_and_timeouts_are_504() {
        let full = response(&ServeError::BackPressure { deployment: "d".into() });
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()[header::RETRY_AFTER], "1");
        let late = response(&ServeError::Timeout(Duration::from_secs(1)));
        assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
        let bad = ServeError::BadRequest {
            deployment: "d".into(),
            message: "expected i64".into(),
        };
        assert_eq!(status(&bad), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn an_http_error_of_user_code_is_answered_as_it_is() {
        let error = crate::HttpError::json(429, &json!({"error": {"message": "slow down"}}));
        let answer = response(&ServeError::Status {
            deployment: "llm".into(),
            error,
        });
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let odd = crate::HttpError::new(1000, "text/plain\n", "?");
        let answer = response(&ServeError::Status {
            deployment: "llm".into(),
            error: odd,
        });
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/octet-stream");
    }
}
