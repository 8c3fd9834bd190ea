//! Streaming responses over real HTTP: chunks reach the client as the
//! deployment makes them, errors before and after the first chunk, and a
//! client that goes away frees the replica's place.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{init, runtime, small};
use futures_util::Stream;
use raylet_serve::status::ReplicaState;
use raylet_serve::{
    Application, BoxError, Deployment, HttpOptions, Json, ReplicaContext, ServeInstance, register_deployment,
};

/// Streams `n` lines, one every `delay_ms`; asked for 13, it fails after
/// two lines, and asked for 0, before any.
struct Lines {
    delay: Duration,
}
register_deployment!(Lines);

impl Deployment for Lines {
    type Init = u64;
    type UserConfig = ();
    type Request = Json<u64>;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(delay_ms: u64, _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Lines {
            delay: Duration::from_millis(delay_ms),
        })
    }

    async fn call(&self, _: Json<u64>) -> Result<Bytes, BoxError> {
        Err("Lines only streams".into())
    }

    fn stream(&self, Json(n): Json<u64>) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        let delay = self.delay;
        // How many items the stream has: the lines, or the lines before
        // the error plus the error.
        let items = match n {
            0 => 1,
            13 => 3,
            n => n,
        };
        futures_util::stream::unfold(0, move |i| async move {
            if i == items {
                return None;
            }
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            let line = match (n, i) {
                (0, _) => Err("nothing to stream".into()),
                (13, 2) => Err("unlucky thirteen".into()),
                _ => Ok(Bytes::from(format!("line {i}\n"))),
            };
            Some((line, i + 1))
        })
    }
}

fn deploy(delay_ms: u64, max_ongoing: u32) -> (raylet::Cluster, ServeInstance) {
    let cluster = init();
    let lines = small::<Lines>("lines", delay_ms).max_ongoing_requests(max_ongoing);
    let app = Application::new("lines", "/lines").deployment(lines);
    let instance = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0)).expect("running");
    (cluster, instance)
}

/// A streamed response: its status, and each chunk with when it came.
struct Streamed {
    status: u16,
    chunks: Vec<(Instant, Bytes)>,
    error: Option<String>,
}

async fn stream(instance: &ServeInstance, token: &str, body: &str) -> Streamed {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let mut response = client
        .post(format!("http://{}/lines", instance.address()))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("a response");
    let status = response.status().as_u16();
    let mut streamed = Streamed {
        status,
        chunks: Vec::new(),
        error: None,
    };
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => streamed.chunks.push((Instant::now(), chunk)),
            Ok(None) => return streamed,
            Err(e) => {
                streamed.error = Some(e.to_string());
                return streamed;
            }
        }
    }
}

fn text(streamed: &Streamed) -> String {
    let bytes: Vec<u8> = streamed.chunks.iter().flat_map(|(_, chunk)| chunk.to_vec()).collect();
    String::from_utf8(bytes).expect("text")
}

#[test]
fn chunks_reach_the_client_as_they_are_made() {
    let (cluster, instance) = deploy(200, 4);
    let streamed = runtime().block_on(stream(&instance, &cluster.token(), "5"));
    assert_eq!(streamed.status, 200);
    assert!(streamed.error.is_none(), "{:?}", streamed.error);
    assert_eq!(text(&streamed), "line 0\nline 1\nline 2\nline 3\nline 4\n");
    let first = streamed.chunks.first().expect("a chunk").0;
    let last = streamed.chunks.last().expect("a chunk").0;
    assert!(
        last - first >= Duration::from_millis(400),
        "the first line came {:?} before the last, made 800 ms apart: it was not held back",
        last - first
    );
}

#[test]
fn errors_before_the_first_chunk_are_statuses_and_after_it_cut_the_stream() {
    let (cluster, instance) = deploy(10, 4);
    let token = cluster.token();
    runtime().block_on(async {
        let bad = stream(&instance, &token, "not json").await;
        assert_eq!(bad.status, 400, "{}", text(&bad));
        let failed = stream(&instance, &token, "0").await;
        assert_eq!(failed.status, 500);
        let body = text(&failed);
        assert!(
            body.contains("nothing to stream") && body.contains("replica:lines:lines:"),
            "{body}"
        );
        let cut = stream(&instance, &token, "13").await;
        assert_eq!(cut.status, 200);
        assert_eq!(text(&cut), "line 0\nline 1\n", "the lines before the error");
        assert!(cut.error.is_some(), "the body ends in an error, not cleanly");
    });
}

/// Waits until the replicas of the only deployment run `ongoing` requests.
fn wait_for_ongoing(cluster: &raylet::Cluster, ongoing: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = raylet_serve::status(cluster).expect("the status");
        let deployment = &status.apps[0].deployments[0];
        let running: u32 = deployment.replicas_in(ReplicaState::Running).map(|r| r.ongoing).sum();
        if running == ongoing {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {deployment:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_client_that_goes_away_frees_the_replicas_place() {
    let (cluster, instance) = deploy(100, 1);
    let token = cluster.token();
    let http = runtime();
    let mut endless = http.block_on(async {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let mut endless = client
            .post(format!("http://{}/lines", instance.address()))
            .bearer_auth(&token)
            .body("1000000")
            .send()
            .await
            .expect("a response");
        assert_eq!(endless.status(), 200);
        endless.chunk().await.expect("a chunk").expect("the first line");
        endless
    });
    wait_for_ongoing(&cluster, 1, "the endless stream is seen running");
    http.block_on(async { endless.chunk().await.expect("a chunk").expect("a later line") });
    drop(endless);
    wait_for_ongoing(&cluster, 0, "a stream of 27 hours still runs after its client left");
    let next = http.block_on(stream(&instance, &token, "2"));
    assert_eq!((next.status, text(&next)), (200, "line 0\nline 1\n".to_string()));
}
