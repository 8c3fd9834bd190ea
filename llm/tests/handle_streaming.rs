//! Streaming through a `DeploymentHandle`: a router deployment in front of
//! the model streams the model's answer on to HTTP as it comes, and a
//! client that goes away frees the model's sequence through both hops.

use std::time::Duration;

use futures_util::Stream;
use futures_util::stream::{self, StreamExt};
use raylet_llm::EngineOptions;
use raylet_llm::openai::{DEPLOYMENT, OpenAiServer, ROUTE_PREFIX};
use raylet_serve::{
    Application, BoxError, Bytes, Deployment, DeploymentConfig, DeploymentHandle, HttpOptions, HttpRequest,
    ReplicaContext, register_deployment,
};
use serde_json::json;

use crate::common::{MODEL, init, runtime, server_init};

/// Passes every request to the model deployment through a handle and
/// streams its answer back chunk by chunk.
pub struct ModelRouter {
    model: DeploymentHandle<OpenAiServer>,
}
register_deployment!(ModelRouter);

impl Deployment for ModelRouter {
    type Init = ();
    type UserConfig = ();
    type Request = HttpRequest;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(ModelRouter {
            model: DeploymentHandle::new(&context.app, DEPLOYMENT),
        })
    }

    async fn call(&self, _: HttpRequest) -> Result<Bytes, BoxError> {
        Err("the router only streams".into())
    }

    fn stream_content_type(&self, _: &HttpRequest) -> String {
        "text/event-stream".into()
    }

    fn stream(&self, request: HttpRequest) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        let model = self.model.clone();
        stream::once(async move { model.stream(request).await }).flat_map(|opened| match opened {
            Ok(chunks) => chunks.map(|chunk| chunk.map_err(BoxError::from)).boxed(),
            Err(error) => stream::iter([Err(BoxError::from(error))]).boxed(),
        })
    }
}

#[test]
fn a_router_streams_the_models_tokens_through_a_handle_and_a_client_that_leaves_frees_them() {
    let cluster = init();
    let dir = tempfile::tempdir().unwrap();
    let init = server_init(dir.path(), EngineOptions::default());
    let app = Application::new("routed", ROUTE_PREFIX)
        .deployment(
            DeploymentConfig::new::<ModelRouter>("router", ())
                .unwrap()
                .max_ongoing_requests(64),
        )
        .deployment(
            DeploymentConfig::new::<OpenAiServer>(DEPLOYMENT, init)
                .unwrap()
                .max_ongoing_requests(64),
        );
    let serve = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0)).unwrap();
    let url = format!("http://{}/v1/completions", serve.address());
    let request = |max_tokens: usize| {
        json!({"model": MODEL, "prompt": "def f(", "max_tokens": max_tokens, "temperature": 0,
               "ignore_eos": true, "stream": true})
        .to_string()
    };
    let http = runtime();
    let client = crate::common::http_client();

    let whole = http.block_on(async {
        let response = client
            .post(&url)
            .bearer_auth(cluster.token())
            .body(request(10))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    });
    let (chunks, done) = crate::common::events(&whole);
    assert!(done, "{whole}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");

    let mut endless = http.block_on(async {
        client
            .post(&url)
            .bearer_auth(cluster.token())
            .body(request(1000))
            .send()
            .await
            .unwrap()
    });
    let first = http.block_on(endless.chunk()).unwrap().expect("a first event");
    assert!(first.starts_with(b"data: {"), "{first:?}");
    drop(endless);

    let model_figure = |name: &str| {
        serve.status().unwrap().apps[0]
            .deployments
            .iter()
            .find(|deployment| deployment.name == DEPLOYMENT)
            .and_then(|deployment| deployment.figures.iter().find(|f| f.name == name).map(|f| f.value))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // The whole answer made 10 tokens: more means the abandoned stream's are
    // counted too.
    while model_figure("running") != Some(0.0) || model_figure("generated_tokens").is_none_or(|made| made <= 10.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the model still runs the abandoned sequence"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let made = model_figure("generated_tokens").unwrap();
    assert!(made < 1000.0, "the abandoned sequence ran to its end: {made} tokens");
}
