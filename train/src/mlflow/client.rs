//! The MLflow tracking server's REST API, the calls a tracker needs: find
//! or make an experiment, make a run, log params and metrics in batches,
//! end a run, and upload an artifact through the server's proxy. Each
//! call is one request, sent on raylet-storage's I/O runtime and waited
//! for, so that callers (the driver's thread) stay synchronous.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde_json::{Value, json};

use super::{CallFailure, MlflowError};
use crate::Metrics;

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one whole call may take (an artifact upload included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The most params (or tags) `runs/log-batch` takes at once.
const PARAMS_PER_BATCH: usize = 100;
/// The most metrics `runs/log-batch` takes at once.
const METRICS_PER_BATCH: usize = 1000;
/// The longest param value every MLflow server takes (later ones take
/// 6000 characters).
const MAX_PARAM_VALUE: usize = 500;
/// How a run's `artifact_uri` starts when the server proxies its artifacts.
const PROXIED_ARTIFACTS: &str = "mlflow-artifacts:";

/// A client of one tracking server.
#[derive(Clone, Debug)]
pub struct MlflowClient {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

/// A run the server made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunHandle {
    pub run_id: String,
    pub experiment_id: String,
    /// Where its artifacts go: `mlflow-artifacts:/<experiment>/<run>/artifacts`
    /// on a server that proxies them.
    pub artifact_uri: String,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    Finished,
    Failed,
    /// Ended from outside before it finished.
    Killed,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

impl MlflowClient {
    /// A client of the server at `tracking_uri` (`http://host:5000`, or
    /// `https://...`, a path prefix allowed). Nothing is sent yet.
    pub fn new(tracking_uri: &str) -> Result<Self, MlflowError> {
        let invalid = |why: String| MlflowError::InvalidUri {
            uri: tracking_uri.to_string(),
            why,
        };
        let base = Url::parse(tracking_uri).map_err(|e| invalid(format!("not a URL ({e})")))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none_or(str::is_empty) {
            return Err(invalid(
                "only a tracking server's http:// or https:// URL is supported (its REST API)".into(),
            ));
        }
        // reqwest is built without a default TLS provider: raylet uses ring.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| invalid(format!("no HTTP client for it: {}", error_chain(&e))))?;
        Ok(MlflowClient {
            http,
            base,
            token: None,
        })
    }

    /// Sends `token` as a bearer token with every call (`MLFLOW_TRACKING_TOKEN`).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The server's URL.
    pub fn server(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// The id of experiment `name`, made if there is none.
    pub fn experiment_id(&self, name: &str) -> Result<String, MlflowError> {
        match self.find_experiment(name) {
            Err(missing) if missing.code() == Some("RESOURCE_DOES_NOT_EXIST") => {}
            found => return found,
        }
        let created = self.post("experiments/create", json!({ "name": name }));
        match created {
            Ok(answer) => {
                string_field(&answer, "/experiment_id").map_err(|missing| self.failed("experiments/create", missing))
            }
            // Made by another tracker since it was looked up.
            Err(exists) if exists.code() == Some("RESOURCE_ALREADY_EXISTS") => self.find_experiment(name),
            Err(error) => Err(error),
        }
    }

    fn find_experiment(&self, name: &str) -> Result<String, MlflowError> {
        let call = "experiments/get-by-name";
        let mut url = self.api_url(&["mlflow", "experiments", "get-by-name"]);
        url.query_pairs_mut().append_pair("experiment_name", name);
        let answer = self.send(call, self.http.get(url))?;
        string_field(&answer, "/experiment/experiment_id").map_err(|missing| self.failed(call, missing))
    }

    /// Makes a run named `name` in `experiment_id`, started now, with `tags`.
    pub fn create_run(
        &self,
        experiment_id: &str,
        name: &str,
        tags: &[(String, String)],
    ) -> Result<RunHandle, MlflowError> {
        let call = "runs/create";
        let body = json!({
            "experiment_id": experiment_id,
            "run_name": name,
            "start_time": now_ms(),
            "tags": key_values(tags),
        });
        let answer = self.post(call, body)?;
        let field = |pointer: &str| string_field(&answer, pointer).map_err(|missing| self.failed(call, missing));
        Ok(RunHandle {
            run_id: field("/run/info/run_id")?,
            experiment_id: experiment_id.to_string(),
            artifact_uri: field("/run/info/artifact_uri")?,
        })
    }

    /// Logs `params`, 100 a call; values longer than MLflow's limit are cut.
    pub fn log_params(&self, run_id: &str, params: &[(String, String)]) -> Result<(), MlflowError> {
        for batch in params.chunks(PARAMS_PER_BATCH) {
            let params: Vec<(String, String)> = batch.iter().map(|(k, v)| (k.clone(), param_value(k, v))).collect();
            self.post(
                "runs/log-batch",
                json!({ "run_id": run_id, "params": key_values(&params) }),
            )?;
        }
        Ok(())
    }

    /// Logs every one of `metrics` at `step`, timestamped now.
    pub fn log_metrics(&self, run_id: &str, step: u64, metrics: &Metrics) -> Result<(), MlflowError> {
        let timestamp = now_ms();
        let metrics: Vec<Value> = metrics
            .iter()
            .map(|(key, value)| json!({ "key": key, "value": metric_value(value), "timestamp": timestamp, "step": step }))
            .collect();
        for batch in metrics.chunks(METRICS_PER_BATCH) {
            self.post("runs/log-batch", json!({ "run_id": run_id, "metrics": batch }))?;
        }
        Ok(())
    }

    /// Ends a run with `status`, now.
    pub fn end_run(&self, run_id: &str, status: RunStatus) -> Result<(), MlflowError> {
        let body = json!({ "run_id": run_id, "status": status.as_str(), "end_time": now_ms() });
        self.post("runs/update", body).map(drop)
    }

    /// Uploads `bytes` as the run's artifact `path` (`checkpoints/a/model.bpk`)
    /// through the server's artifact proxy.
    pub fn upload_artifact(&self, run: &RunHandle, path: &str, bytes: Bytes) -> Result<(), MlflowError> {
        let call = format!("uploading artifact {path}");
        let Some(root) = proxied_root(&run.artifact_uri) else {
            let failure = CallFailure::ArtifactsNotServed(run.artifact_uri.clone());
            return Err(self.failed(&call, failure));
        };
        let mut url = self.api_url(&["mlflow-artifacts", "artifacts"]);
        url.path_segments_mut()
            .expect("an http(s) URL has path segments")
            .extend(root.split('/').chain(path.split('/')).filter(|s| !s.is_empty()));
        self.send(&call, self.http.put(url).body(bytes)).map(drop)
    }

    /// POSTs `body` to `/api/2.0/mlflow/<call>`.
    fn post(&self, call: &str, body: Value) -> Result<Value, MlflowError> {
        let mut segments = vec!["mlflow"];
        segments.extend(call.split('/'));
        let request = self
            .http
            .request(Method::POST, self.api_url(&segments))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        self.send(call, request)
    }

    /// `/api/2.0/<segments...>` under the server's URL.
    fn api_url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.set_query(None);
        url.path_segments_mut()
            .expect("an http(s) URL has path segments")
            .pop_if_empty()
            .extend(["api", "2.0"])
            .extend(segments);
        url
    }

    /// Sends `request` and waits for its answer's JSON (`null` when empty).
    fn send(&self, call: &str, request: RequestBuilder) -> Result<Value, MlflowError> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let answer = raylet_storage::run(async move {
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.bytes().await?))
        });
        let (status, body) = answer.map_err(|e| self.failed(call, CallFailure::Unreachable(error_chain(&e))))?;
        if !status.is_success() {
            return Err(self.failed(call, refusal(status, &body)));
        }
        match body.is_empty() {
            true => Ok(Value::Null),
            false => serde_json::from_slice(&body).map_err(|e| self.bad_answer(call, format!("{e}"))),
        }
    }

    fn failed(&self, call: &str, failure: CallFailure) -> MlflowError {
        MlflowError::Call {
            server: self.server().to_string(),
            call: call.to_string(),
            failure,
        }
    }

    fn bad_answer(&self, call: &str, why: String) -> MlflowError {
        self.failed(call, CallFailure::BadAnswer(why))
    }
}

/// The server's error answer: MLflow's `{"error_code", "message"}` when
/// the body is that, else the body's text.
fn refusal(status: StatusCode, body: &[u8]) -> CallFailure {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| parsed.as_ref().and_then(|v| v[name].as_str()).map(str::to_string);
    let text = String::from_utf8_lossy(body);
    CallFailure::Refused {
        status: status.as_u16(),
        code: field("error_code").unwrap_or_default(),
        message: field("message").unwrap_or_else(|| text.trim().chars().take(300).collect()),
    }
}

/// The string at `pointer` in `answer`.
fn string_field(answer: &Value, pointer: &str) -> Result<String, CallFailure> {
    answer
        .pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| CallFailure::MissingField {
            pointer: pointer.to_string(),
            answer: answer.to_string(),
        })
}

/// The path of a proxied run's artifacts under the proxy
/// (`1/<run>/artifacts`), from `mlflow-artifacts:/1/<run>/artifacts` or
/// `mlflow-artifacts://host:port/1/<run>/artifacts`.
fn proxied_root(artifact_uri: &str) -> Option<&str> {
    let rest = artifact_uri.strip_prefix(PROXIED_ARTIFACTS)?;
    let path = match rest.strip_prefix("//") {
        Some(with_authority) => &with_authority[with_authority.find('/')?..],
        None => rest,
    };
    Some(path.trim_matches('/'))
}

/// A param's value, cut to MLflow's limit (saying so).
fn param_value(key: &str, value: &str) -> String {
    if value.chars().count() <= MAX_PARAM_VALUE {
        return value.to_string();
    }
    tracing::warn!(
        param = key,
        "MLflow: the param's value is cut to {MAX_PARAM_VALUE} characters"
    );
    value.chars().take(MAX_PARAM_VALUE).collect()
}

/// A metric's value in the API's JSON: a number, or protobuf's `"NaN"`,
/// `"Infinity"` and `"-Infinity"`, which JSON numbers cannot be.
fn metric_value(value: f64) -> Value {
    match value {
        v if v.is_nan() => Value::from("NaN"),
        v if v == f64::INFINITY => Value::from("Infinity"),
        v if v == f64::NEG_INFINITY => Value::from("-Infinity"),
        v => Value::from(v),
    }
}

fn key_values(pairs: &[(String, String)]) -> Vec<Value> {
    pairs
        .iter()
        .map(|(key, value)| json!({ "key": key, "value": value }))
        .collect()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// An error and its causes, `: `-joined (reqwest's own text hides the
/// cause, such as "Connection refused").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_of_a_host_are_tracking_servers() {
        for bad in [
            "localhost:5000",
            "file:///tmp/mlruns",
            "databricks",
            "http://",
            "ftp://host/x",
        ] {
            let error = MlflowClient::new(bad).unwrap_err().to_string();
            assert!(error.starts_with(&format!("MLflow tracking URI `{bad}`: ")), "{error}");
        }
        let client = MlflowClient::new("https://tracking.example/prefix/").unwrap();
        assert_eq!(
            client.api_url(&["mlflow", "runs", "create"]).as_str(),
            "https://tracking.example/prefix/api/2.0/mlflow/runs/create"
        );
    }

    #[test]
    fn a_string_field_the_answer_lacks_names_where_it_was_looked_for() {
        let answer = json!({ "run": { "info": { "run_id": 7 } } });
        let missing = string_field(&answer, "/run/info/run_id").unwrap_err();
        assert!(
            matches!(&missing, CallFailure::MissingField { pointer, .. } if pointer == "/run/info/run_id"),
            "{missing}"
        );
        let answer = json!({ "experiment_id": "12" });
        assert_eq!(string_field(&answer, "/experiment_id").unwrap(), "12");
    }

    #[test]
    fn proxied_artifact_uris_give_the_path_under_the_proxy() {
        assert_eq!(
            proxied_root("mlflow-artifacts:/1/abc/artifacts"),
            Some("1/abc/artifacts")
        );
        assert_eq!(
            proxied_root("mlflow-artifacts://host:5000/1/abc/artifacts"),
            Some("1/abc/artifacts")
        );
        assert_eq!(proxied_root("s3://bucket/1/abc/artifacts"), None);
        assert_eq!(proxied_root("/tmp/mlruns/1/abc/artifacts"), None);
    }

    #[test]
    fn metric_values_that_json_numbers_cannot_hold_are_protobuf_strings() {
        assert_eq!(metric_value(0.5), json!(0.5));
        assert_eq!(metric_value(f64::NAN), json!("NaN"));
        assert_eq!(metric_value(f64::INFINITY), json!("Infinity"));
        assert_eq!(metric_value(f64::NEG_INFINITY), json!("-Infinity"));
    }

    #[test]
    fn long_param_values_are_cut_to_the_limit() {
        let long = "x".repeat(MAX_PARAM_VALUE + 20);
        assert_eq!(param_value("k", &long).len(), MAX_PARAM_VALUE);
        assert_eq!(param_value("k", "short"), "short");
    }
}
