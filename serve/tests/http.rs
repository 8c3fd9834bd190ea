//! Serving over real HTTP on an embedded cluster: JSON and raw bodies, a
//! 400 for bad input, 404, token auth and public applications, a 500 that
//! names the replica, and 503 with Retry-After under overload.

use crate::common;

use std::time::{Duration, Instant};

use common::{Adder, Broken, Client, Panicking, Reverser, Sleeper, deploy, init, runtime, small};
use raylet_serve::{Application, HttpOptions, ServeInstance};

fn serve(app: Application) -> ServeInstance {
    deploy(&init(), app)
}

fn token() -> Option<String> {
    Some(raylet::current().expect("a cluster").token())
}

fn adder_app() -> Application {
    let adder = small::<Adder>("adder", ());
    Application::new("math", "/add").deployment(adder)
}

#[test]
fn json_and_raw_bytes_round_trip() {
    let math = serve(adder_app());
    let reverser = small::<Reverser>("reverser", ());
    let bytes = serve(Application::new("bytes", "/reverse").deployment(reverser));
    runtime().block_on(async {
        let sum = Client::new(math.address(), token())
            .post_json("/add", r#"{"a": 2, "b": 40}"#)
            .await;
        assert_eq!(sum.status, 200, "{}", sum.text());
        assert_eq!(sum.content_type.as_deref(), Some("application/json"));
        assert_eq!(sum.json(), serde_json::json!(42));
        let body = vec![0u8, 1, 2, 255];
        let reversed = Client::new(bytes.address(), token())
            .post("/reverse/sub/path", "application/octet-stream", body)
            .await;
        assert_eq!(reversed.status, 200, "{}", reversed.text());
        assert_eq!(reversed.content_type.as_deref(), Some("application/octet-stream"));
        assert_eq!(reversed.body, vec![255u8, 2, 1, 0]);
    });
    bytes.shutdown().expect("stopped");
    math.shutdown().expect("stopped");
}

#[test]
fn bad_input_is_400_and_unknown_paths_404() {
    let math = serve(adder_app());
    runtime().block_on(async {
        let client = Client::new(math.address(), token());
        let malformed = client.post_json("/add", r#"{"a": 2,"#).await;
        assert_eq!(malformed.status, 400, "{}", malformed.text());
        assert!(malformed.text().contains("EOF"), "{}", malformed.text());
        let wrong_type = client.post_json("/add", r#"{"a": "two", "b": 1}"#).await;
        assert_eq!(wrong_type.status, 400, "{}", wrong_type.text());
        assert!(wrong_type.text().contains("invalid type"), "{}", wrong_type.text());
        let elsewhere = client.post_json("/addition", r#"{"a": 1, "b": 1}"#).await;
        assert_eq!(elsewhere.status, 404, "{}", elsewhere.text());
        let too_large = client.post("/add", "application/json", vec![b' '; 17 << 20]).await;
        assert_eq!(too_large.status, 413, "{}", too_large.text());
    });
}

#[test]
fn the_token_is_required_unless_the_app_is_public() {
    let private = serve(adder_app());
    let reverser = small::<Reverser>("reverser", ());
    let open = Application::new("open", "/open").deployment(reverser).public(true);
    let public = serve(open);
    runtime().block_on(async {
        let anonymous = Client::new(private.address(), None);
        let refused = anonymous.post_json("/add", r#"{"a": 1, "b": 1}"#).await;
        assert_eq!(refused.status, 401, "{}", refused.text());
        let wrong = Client::new(private.address(), Some("not-the-token".into()));
        assert_eq!(wrong.post_json("/add", r#"{"a": 1, "b": 1}"#).await.status, 401);
        let admitted = Client::new(private.address(), token());
        assert_eq!(admitted.post_json("/add", r#"{"a": 1, "b": 1}"#).await.status, 200);
        let open = Client::new(public.address(), None)
            .post("/open", "application/octet-stream", b"ab".to_vec())
            .await;
        assert_eq!(open.status, 200, "{}", open.text());
        assert_eq!(open.body, b"ba");
    });
}

#[test]
fn a_user_error_is_a_500_naming_deployment_and_replica() {
    let broken = small::<Broken>("broken", "the weights are corrupt".to_string());
    let instance = serve(Application::new("faulty", "/").deployment(broken));
    runtime().block_on(async {
        let failed = Client::new(instance.address(), token())
            .post("/anything", "application/octet-stream", b"x".to_vec())
            .await;
        assert_eq!(failed.status, 500, "{}", failed.text());
        let body = failed.json();
        assert_eq!(body["deployment"], "broken");
        assert_eq!(body["replica"], "replica:faulty:broken:0");
        assert_eq!(body["error"], "the weights are corrupt");
    });
}

#[test]
fn a_panic_in_user_code_is_a_500_that_quotes_it_and_the_replica_answers_on() {
    let panicking = small::<Panicking>("panicking", "the tokenizer is missing".to_string());
    let instance = serve(Application::new("panics", "/").deployment(panicking));
    runtime().block_on(async {
        let client = Client::new(instance.address(), token());
        for _ in 0..2 {
            let failed = client.post("/", "application/octet-stream", b"x".to_vec()).await;
            assert_eq!(failed.status, 500, "{}", failed.text());
            let body = failed.json();
            assert_eq!(body["error"], "panicked: the tokenizer is missing");
            assert_eq!(body["replica"], "replica:panics:panicking:0");
        }
    });
}

#[test]
fn overload_is_answered_with_503_and_retry_after_not_a_hang() {
    let slow = small::<Sleeper>("slow", 200)
        .max_ongoing_requests(1)
        .max_queued_requests(2);
    let instance = serve(Application::new("slow", "/slow").deployment(slow));
    let client = Client::new(instance.address(), token());
    let started = Instant::now();
    let answers = runtime().block_on(async {
        let requests = (0..50).map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.post("/slow", "application/octet-stream", Vec::new()).await })
        });
        let mut answers = Vec::new();
        for request in requests.collect::<Vec<_>>() {
            answers.push(request.await.expect("a request task"));
        }
        answers
    });
    let elapsed = started.elapsed();
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.status == 503).collect();
    assert_eq!(ok + refused.len(), 50, "only 200 and 503: {answers:?}");
    assert!(ok >= 1, "some requests were served: {answers:?}");
    assert!(
        refused.len() >= 40,
        "the queue holds 2, so most are refused: {ok} served"
    );
    assert!(
        refused.iter().all(|a| a.retry_after.as_deref() == Some("1")),
        "{refused:?}"
    );
    assert!(
        elapsed < Duration::from_secs(15),
        "answered in {elapsed:?}, well before the 60 s timeout"
    );
}

#[test]
fn a_request_past_the_timeout_is_a_504() {
    let cluster = init();
    let slow = small::<Sleeper>("slow", 5_000);
    let app = Application::new("slow", "/slow").deployment(slow);
    let options = HttpOptions::default()
        .port(0)
        .request_timeout(Duration::from_millis(300));
    let instance = raylet_serve::run_with(&cluster, app, options).expect("a running app");
    let started = Instant::now();
    let late = runtime().block_on(async {
        let client = Client::new(instance.address(), token());
        client.post("/slow", "application/octet-stream", Vec::new()).await
    });
    assert_eq!(late.status, 504, "{}", late.text());
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}
