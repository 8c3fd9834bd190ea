//! Deployments that serve an HTTP API of their own, over real HTTP: whole
//! requests (any method, the path below the route prefix, the query, the
//! content negotiation headers and never the token), and errors with any
//! status, content type and body, from the proxy and through handles,
//! passed on by a deployment that calls another.

use crate::common;

use bytes::Bytes;
use common::{Client, deploy, init, runtime, small};
use raylet_serve::{
    Application, BoxError, Deployment, DeploymentHandle, HttpError, HttpRequest, Json, ReplicaContext, ServeError,
    register_deployment,
};
use reqwest::Method;
use serde_json::{Value, json};

/// Answers with what it saw of the request; `/teapot` is a 418 with a
/// JSON body, `/fail` a plain error (500).
struct Echo;
register_deployment!(Echo);

impl Deployment for Echo {
    type Init = ();
    type UserConfig = ();
    type Request = HttpRequest;
    type Response = Json<Value>;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Echo)
    }

    async fn call(&self, request: HttpRequest) -> Result<Json<Value>, BoxError> {
        match request.path.as_str() {
            "/teapot" => Err(HttpError::json(418, &json!({"error": {"message": "short and stout"}})).into()),
            "/fail" => Err("a plain failure".into()),
            _ => Ok(Json(json!({
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "headers": request.headers,
                "body": String::from_utf8_lossy(&request.body),
            }))),
        }
    }
}

/// Passes every request on to the echo through a handle, and its errors
/// back with `?`.
struct Gateway {
    echo: DeploymentHandle<Echo>,
}
register_deployment!(Gateway);

impl Deployment for Gateway {
    type Init = ();
    type UserConfig = ();
    type Request = HttpRequest;
    type Response = Json<Value>;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Gateway {
            echo: DeploymentHandle::new(&context.app, "echo"),
        })
    }

    async fn call(&self, request: HttpRequest) -> Result<Json<Value>, BoxError> {
        Ok(self.echo.call(request).await?)
    }
}

fn token() -> Option<String> {
    Some(raylet::current().expect("a cluster").token())
}

#[test]
fn whole_requests_reach_the_deployment_with_method_path_query_and_headers() {
    let cluster = init();
    let instance = deploy(
        &cluster,
        Application::new("api", "/api").deployment(small::<Echo>("echo", ())),
    );
    runtime().block_on(async {
        let client = Client::new(instance.address(), token());
        let models = client
            .send(
                Method::GET,
                "/api/v1/models?verbose=1",
                &[("accept", "application/json")],
                Vec::new(),
            )
            .await;
        assert_eq!(models.status, 200, "{}", models.text());
        let seen = models.json();
        println!("a GET as the deployment saw it: {seen}");
        assert_eq!(seen["method"], "GET");
        assert_eq!(seen["path"], "/v1/models", "the path below the route prefix");
        assert_eq!(seen["query"], "verbose=1");
        assert_eq!(
            seen["headers"],
            json!([["accept", "application/json"]]),
            "no authorization"
        );

        let chat = client
            .post_json("/api/v1/chat/completions", r#"{"model": "gpt"}"#)
            .await;
        let seen = chat.json();
        assert_eq!(
            (seen["method"].as_str(), seen["path"].as_str()),
            (Some("POST"), Some("/v1/chat/completions"))
        );
        assert_eq!(
            seen["headers"],
            json!([["content-type", "application/json"], ["accept", "*/*"]]),
            "reqwest's default accept, and no authorization"
        );
        assert_eq!(seen["body"], r#"{"model": "gpt"}"#);

        let root = client.send(Method::DELETE, "/api", &[], Vec::new()).await;
        assert_eq!(
            (root.json()["method"].as_str(), root.json()["path"].as_str()),
            (Some("DELETE"), Some("/"))
        );
        assert_eq!(root.json()["query"], Value::Null);
    });
}

#[test]
fn an_http_error_is_answered_with_its_status_content_type_and_body_and_reaches_handles() {
    let cluster = init();
    let app = Application::new("api", "/")
        .deployment(small::<Gateway>("gateway", ()))
        .deployment(small::<Echo>("echo", ()));
    let instance = deploy(&cluster, app);
    runtime().block_on(async {
        let client = Client::new(instance.address(), token());
        let teapot = client.send(Method::GET, "/teapot", &[], Vec::new()).await;
        assert_eq!(teapot.status, 418, "passed on by the gateway: {}", teapot.text());
        assert_eq!(teapot.content_type.as_deref(), Some("application/json"));
        assert_eq!(teapot.json(), json!({"error": {"message": "short and stout"}}));
        let failed = client.send(Method::GET, "/fail", &[], Vec::new()).await;
        assert_eq!(failed.status, 500, "{}", failed.text());
        assert!(failed.text().contains("a plain failure"), "{}", failed.text());
    });

    let echo = instance.handle::<Echo>("echo").expect("a handle");
    let whole = HttpRequest {
        method: "PUT".into(),
        path: "/items/7".into(),
        query: Some("dry_run=true".into()),
        headers: vec![("content-type".into(), "text/plain".into())],
        body: Bytes::from_static(b"seven"),
    };
    let teapot = HttpRequest {
        path: "/teapot".into(),
        ..whole.clone()
    };
    runtime().block_on(async {
        let Json(seen) = echo.call(whole).await.expect("an answer");
        assert_eq!(
            seen,
            json!({"method": "PUT", "path": "/items/7", "query": "dry_run=true",
                   "headers": [["content-type", "text/plain"]], "body": "seven"}),
            "a handle sends the whole request"
        );
        match echo.call(teapot).await {
            Err(ServeError::Status { deployment, error }) => {
                assert_eq!(deployment, "echo");
                assert_eq!((error.status, error.content_type.as_str()), (418, "application/json"));
                assert_eq!(error.body, r#"{"error":{"message":"short and stout"}}"#);
            }
            other => panic!("expected a status, got {other:?}"),
        }
    });
}
