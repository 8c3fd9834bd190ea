//! Streams as an OpenAI-compatible server sends them, over real HTTP: the
//! content type chosen per request (server-sent events or one JSON body),
//! each event flushed to the client as it is made, statuses before the
//! first event; and a deployment that streams another's chunks through a
//! handle, passing them on as they come and a client that leaves on to
//! the other's replica.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{init, runtime, small};
use futures_util::{Stream, TryStreamExt};
use raylet_serve::status::ReplicaState;
use raylet_serve::{
    Application, BoxError, Deployment, DeploymentHandle, HttpError, HttpOptions, Json, ReplicaContext, ServeInstance,
    register_deployment,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What a [`Completions`] request asks.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Ask {
    /// Events as they are made, or one JSON body.
    stream: bool,
    /// How many events.
    events: u64,
    /// A file to wait for after the first event, so that the test knows
    /// the stream has not ended when it reads that event.
    gate: Option<PathBuf>,
    /// Milliseconds between events after the first.
    every_ms: u64,
}

impl Ask {
    fn streaming(events: u64, gate: Option<&Path>) -> Self {
        Ask {
            stream: true,
            events,
            gate: gate.map(Path::to_path_buf),
            every_ms: 20,
        }
    }
}

/// Waits until `gate` exists (at most 30 s).
async fn wait_for(gate: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gate.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `events` events `data: <i>\n\n` (or one JSON body when not streaming),
/// waiting for the gate after the first; no events at all is a 422.
fn events(ask: Ask) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
    futures_util::stream::unfold(0, move |i| {
        let ask = ask.clone();
        async move {
            if i == ask.events.max(1) || (!ask.stream && i == 1) {
                return None;
            }
            if ask.events == 0 {
                let error = HttpError::json(422, &json!({"error": {"message": "ask for at least one event"}}));
                return Some((Err(error.into()), ask.events.max(1)));
            }
            if !ask.stream {
                let body = json!({"choices": [{"text": "one whole answer"}]}).to_string();
                return Some((Ok(Bytes::from(body)), 1));
            }
            match (i, &ask.gate) {
                (1, Some(gate)) => wait_for(gate).await,
                (0, _) => {}
                _ => tokio::time::sleep(Duration::from_millis(ask.every_ms)).await,
            }
            Some((Ok(Bytes::from(format!("data: {i}\n\n"))), i + 1))
        }
    })
}

fn content_type(ask: &Ask) -> String {
    match ask.stream {
        true => "text/event-stream".to_string(),
        false => "application/json".to_string(),
    }
}

/// Answers as a completions endpoint: server-sent events when asked to
/// stream, one JSON body otherwise.
struct Completions;
register_deployment!(Completions);

impl Deployment for Completions {
    type Init = ();
    type UserConfig = ();
    type Request = Json<Ask>;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Completions)
    }

    async fn call(&self, _: Json<Ask>) -> Result<Bytes, BoxError> {
        Err("Completions only streams".into())
    }

    fn stream(&self, Json(ask): Json<Ask>) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        events(ask)
    }

    fn stream_content_type(&self, Json(ask): &Json<Ask>) -> String {
        content_type(ask)
    }
}

/// A router in front of a [`Completions`] model: streams its chunks on
/// through a handle.
struct Relay {
    model: DeploymentHandle<Completions>,
}
register_deployment!(Relay);

impl Deployment for Relay {
    type Init = ();
    type UserConfig = ();
    type Request = Json<Ask>;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Relay {
            model: DeploymentHandle::new(&context.app, "model"),
        })
    }

    async fn call(&self, _: Json<Ask>) -> Result<Bytes, BoxError> {
        Err("Relay only streams".into())
    }

    fn stream(&self, ask: Json<Ask>) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        let model = self.model.clone();
        futures_util::stream::once(async move { model.stream(ask).await })
            .try_flatten()
            .map_err(BoxError::from)
    }

    fn stream_content_type(&self, Json(ask): &Json<Ask>) -> String {
        content_type(ask)
    }
}

fn serve(app: Application) -> (raylet::Cluster, ServeInstance) {
    let cluster = init();
    let instance = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0)).expect("running");
    (cluster, instance)
}

/// Opens a request for `ask` at `path`.
async fn open(instance: &ServeInstance, token: &str, path: &str, ask: &Ask) -> reqwest::Response {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
        .post(format!("http://{}{path}", instance.address()))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(ask).expect("JSON"))
        .send()
        .await
        .expect("a response")
}

fn header(response: &reqwest::Response, name: &str) -> String {
    let value = response.headers().get(name).and_then(|value| value.to_str().ok());
    value.unwrap_or_default().to_string()
}

/// The rest of a response's body, as text.
async fn rest(response: reqwest::Response) -> String {
    String::from_utf8_lossy(&response.bytes().await.expect("the body")).into_owned()
}

/// Reads the first event while the deployment waits for `gate`, which
/// only this test makes, then lets the stream go on and reads the rest.
async fn first_event_before_the_end(mut response: reqwest::Response, gate: &Path) -> String {
    let first = response.chunk().await.expect("a chunk").expect("the first event");
    assert_eq!(first, "data: 0\n\n", "the first event alone, flushed at once");
    assert!(!gate.exists(), "the stream waits for the gate: it has not ended");
    std::fs::write(gate, b"").expect("the gate");
    format!("{}{}", String::from_utf8_lossy(&first), rest(response).await)
}

#[test]
fn a_stream_s_content_type_is_chosen_per_request_and_each_event_is_flushed() {
    let (cluster, instance) = serve(Application::new("llm", "/v1").deployment(small::<Completions>("completions", ())));
    let token = cluster.token();
    let gates = tempfile::tempdir().expect("a directory");
    let gate = gates.path().join("first-event-read");
    runtime().block_on(async {
        let sse = open(&instance, &token, "/v1/completions", &Ask::streaming(3, Some(&gate))).await;
        assert_eq!(sse.status(), 200);
        assert_eq!(header(&sse, "content-type"), "text/event-stream");
        let events = first_event_before_the_end(sse, &gate).await;
        assert_eq!(events, "data: 0\n\ndata: 1\n\ndata: 2\n\n");

        let whole = open(
            &instance,
            &token,
            "/v1/completions",
            &Ask {
                stream: false,
                ..Ask::streaming(3, None)
            },
        )
        .await;
        assert_eq!(whole.status(), 200);
        assert_eq!(header(&whole, "content-type"), "application/json");
        let body: serde_json::Value = serde_json::from_str(&rest(whole).await).expect("JSON");
        assert_eq!(body["choices"][0]["text"], "one whole answer");

        let refused = open(&instance, &token, "/v1/completions", &Ask::streaming(0, None)).await;
        assert_eq!(
            refused.status(),
            422,
            "an HttpError before the first event is its status"
        );
        assert_eq!(header(&refused, "content-type"), "application/json");
        assert_eq!(
            rest(refused).await,
            r#"{"error":{"message":"ask for at least one event"}}"#
        );
    });
}

/// The ongoing requests of each running replica of deployment `name`.
fn ongoing(cluster: &raylet::Cluster, name: &str) -> u32 {
    let status = raylet_serve::status(cluster).expect("the status");
    let deployment = status.apps[0].deployment(name).expect("the deployment");
    deployment
        .replicas_in(ReplicaState::Running)
        .map(|replica| replica.ongoing)
        .sum()
}

/// Waits until `name`'s replicas run `expected` requests.
fn wait_for_ongoing(cluster: &raylet::Cluster, name: &str, expected: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ongoing(cluster, name) != expected {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_deployment_streams_another_through_a_handle_and_a_client_that_leaves_frees_both() {
    let app = Application::new("relay", "/")
        .deployment(small::<Relay>("relay", ()))
        .deployment(small::<Completions>("model", ()).max_ongoing_requests(1));
    let (cluster, instance) = serve(app);
    let token = cluster.token();
    let gates = tempfile::tempdir().expect("a directory");
    let gate = gates.path().join("first-tick-read");
    let http = runtime();
    http.block_on(async {
        let relayed = open(&instance, &token, "/", &Ask::streaming(4, Some(&gate))).await;
        assert_eq!(header(&relayed, "content-type"), "text/event-stream");
        let events = first_event_before_the_end(relayed, &gate).await;
        assert_eq!(events, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n");
        let refused = open(&instance, &token, "/", &Ask::streaming(0, None)).await;
        assert_eq!(refused.status(), 422, "the model's status, passed on by the relay");
    });

    let mut endless = http.block_on(async {
        let mut endless = open(&instance, &token, "/", &Ask::streaming(u64::MAX, None)).await;
        endless.chunk().await.expect("a chunk").expect("the first event");
        endless.chunk().await.expect("a chunk").expect("a second event");
        endless
    });
    wait_for_ongoing(&cluster, "model", 1, "the model's stream is seen running");
    http.block_on(async { endless.chunk().await.expect("a chunk").expect("a later event") });
    drop(endless);
    wait_for_ongoing(
        &cluster,
        "relay",
        0,
        "the relay's stream still runs after its client left",
    );
    wait_for_ongoing(
        &cluster,
        "model",
        0,
        "the model's stream still runs after the relay's client left",
    );
    let next = http.block_on(async { rest(open(&instance, &token, "/", &Ask::streaming(2, None)).await).await });
    assert_eq!(next, "data: 0\n\ndata: 1\n\n", "the model's only place is free again");
}
