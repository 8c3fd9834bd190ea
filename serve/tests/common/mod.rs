//! Deployments the serve tests deploy, and a small HTTP client over
//! reqwest. The test binary is the workers' binary, so the deployments are
//! registered here.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use raylet_serve::{
    Application, BoxError, Deployment, DeploymentConfig, DeploymentHandle, HttpOptions, Json, ReplicaContext,
    ServeInstance, register_deployment,
};
use serde::{Deserialize, Serialize};

pub fn init() -> raylet::Cluster {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster")
}

/// A deployment of `D` whose replicas reserve half a CPU (CI has 2).
pub fn small<D: Deployment>(name: &str, init: D::Init) -> DeploymentConfig {
    DeploymentConfig::new::<D>(name, init).expect("a config").num_cpus(0.5)
}

/// Runs `app` behind proxies on free ports.
pub fn deploy(cluster: &raylet::Cluster, app: Application) -> ServeInstance {
    raylet_serve::run_with(cluster, app, HttpOptions::default().port(0)).expect("a running application")
}

/// Two numbers to add.
#[derive(Debug, Serialize, Deserialize)]
pub struct Pair {
    pub a: i64,
    pub b: i64,
}

/// Adds the two numbers of a JSON request.
pub struct Adder;
register_deployment!(Adder);

impl Deployment for Adder {
    type Init = ();
    type UserConfig = ();
    type Request = Json<Pair>;
    type Response = Json<i64>;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Adder)
    }

    async fn call(&self, Json(pair): Json<Pair>) -> Result<Json<i64>, BoxError> {
        Ok(Json(pair.a + pair.b))
    }
}

/// Reverses a raw body.
pub struct Reverser;
register_deployment!(Reverser);

impl Deployment for Reverser {
    type Init = ();
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Reverser)
    }

    async fn call(&self, body: Bytes) -> Result<Bytes, BoxError> {
        Ok(body.iter().rev().copied().collect::<Vec<u8>>().into())
    }
}

/// Fails every request with its configured message.
pub struct Broken {
    message: String,
}
register_deployment!(Broken);

impl Deployment for Broken {
    type Init = String;
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(message: String, _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Broken { message })
    }

    async fn call(&self, _: Bytes) -> Result<Bytes, BoxError> {
        Err(self.message.clone().into())
    }
}

/// Panics in every call with its init message.
pub struct Panicking {
    message: String,
}
register_deployment!(Panicking);

impl Deployment for Panicking {
    type Init = String;
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(message: String, _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Panicking { message })
    }

    async fn call(&self, _: Bytes) -> Result<Bytes, BoxError> {
        panic!("{}", self.message);
    }
}

/// Cannot be built: its checkpoint is missing.
pub struct Unbuildable;
register_deployment!(Unbuildable);

impl Deployment for Unbuildable {
    type Init = ();
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Err("no checkpoint at /models/missing".into())
    }

    async fn call(&self, body: Bytes) -> Result<Bytes, BoxError> {
        Ok(body)
    }
}

/// Like [`Reverser`], but never registered.
pub struct Unregistered;

impl Deployment for Unregistered {
    type Init = ();
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Unregistered)
    }

    async fn call(&self, body: Bytes) -> Result<Bytes, BoxError> {
        Ok(body)
    }
}

/// Sleeps, then answers with its replica's name: load and spreading.
pub struct Sleeper {
    replica: String,
    delay: Duration,
}
register_deployment!(Sleeper);

impl Deployment for Sleeper {
    type Init = u64;
    type UserConfig = ();
    type Request = Bytes;
    type Response = Json<String>;

    fn new(delay_ms: u64, context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Sleeper {
            replica: context.replica.clone(),
            delay: Duration::from_millis(delay_ms),
        })
    }

    async fn call(&self, _: Bytes) -> Result<Json<String>, BoxError> {
        tokio::time::sleep(self.delay).await;
        Ok(Json(self.replica.clone()))
    }
}

/// Classifies a number as "even" or "odd".
pub struct Classifier;
register_deployment!(Classifier);

impl Deployment for Classifier {
    type Init = ();
    type UserConfig = ();
    type Request = Json<i64>;
    type Response = Json<String>;

    fn new(_: (), _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Classifier)
    }

    async fn call(&self, Json(n): Json<i64>) -> Result<Json<String>, BoxError> {
        Ok(Json(if n % 2 == 0 { "even" } else { "odd" }.to_string()))
    }
}

/// Parses a number out of free text (user config: a prefix to strip) and
/// asks the classifier about it.
pub struct Preprocess {
    classifier: DeploymentHandle<Classifier>,
    strip: std::sync::Mutex<String>,
}
register_deployment!(Preprocess);

impl Deployment for Preprocess {
    type Init = ();
    type UserConfig = String;
    type Request = Json<String>;
    type Response = Json<String>;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Preprocess {
            classifier: DeploymentHandle::new(&context.app, "classifier"),
            strip: std::sync::Mutex::new(String::new()),
        })
    }

    async fn call(&self, Json(text): Json<String>) -> Result<Json<String>, BoxError> {
        let strip = self.strip.lock().map_err(|e| e.to_string())?.clone();
        let number: i64 = text.trim().trim_start_matches(strip.as_str()).trim().parse()?;
        let Json(class) = self.classifier.call(Json(number)).await?;
        Ok(Json(format!("{number} is {class}")))
    }

    fn reconfigure(&self, strip: String) -> Result<(), BoxError> {
        *self.strip.lock().map_err(|e| e.to_string())? = strip;
        Ok(())
    }
}

/// A tokio runtime for the HTTP side of a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// An HTTP client of one proxy, with or without the cluster token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// A response's status, `Retry-After` and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

impl Client {
    pub fn new(address: SocketAddr, token: Option<String>) -> Self {
        // In a workspace build reqwest is unified with raylet-train's
        // `rustls-no-provider` feature, which needs a provider installed
        // before any client is built, TLS or not.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        Client {
            http,
            base: format!("http://{address}"),
            token,
        }
    }

    pub async fn post(&self, path: &str, content_type: &str, body: impl Into<Vec<u8>>) -> Answer {
        let headers = [("content-type", content_type)];
        self.send(reqwest::Method::POST, path, &headers, body.into()).await
    }

    /// Sends a request of any method with the given headers (the token
    /// besides, if the client has it).
    pub async fn send(&self, method: reqwest::Method, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("an HTTP response");
        let header = |name: &str| {
            let value = response.headers().get(name);
            value.and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let (retry_after, content_type) = (header("retry-after"), header("content-type"));
        let status = response.status().as_u16();
        let body = response.bytes().await.expect("a body").to_vec();
        Answer {
            status,
            retry_after,
            content_type,
            body,
        }
    }

    pub async fn post_json(&self, path: &str, body: &str) -> Answer {
        self.post(path, "application/json", body.as_bytes().to_vec()).await
    }
}

/// How a [`Versioned`] replica is built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VersionedInit {
    /// What every answer carries: which version of the code answered.
    pub label: String,
    pub delay_ms: u64,
    /// Its health check fails while a file named after the replica exists
    /// in this directory.
    pub sick_dir: Option<String>,
}

/// What a [`Versioned`] replica answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedAnswer {
    pub label: String,
    pub suffix: String,
    pub replica: String,
    pub pid: u32,
}

/// Answers with its version label, user config and replica after a delay:
/// rollouts, reconfiguration, health and failure.
pub struct Versioned {
    init: VersionedInit,
    replica: String,
    suffix: std::sync::Mutex<String>,
}
register_deployment!(Versioned);

impl Deployment for Versioned {
    type Init = VersionedInit;
    type UserConfig = String;
    type Request = Bytes;
    type Response = Json<VersionedAnswer>;

    fn new(init: VersionedInit, context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Versioned {
            init,
            replica: context.replica.clone(),
            suffix: std::sync::Mutex::new(String::new()),
        })
    }

    async fn call(&self, _: Bytes) -> Result<Json<VersionedAnswer>, BoxError> {
        tokio::time::sleep(Duration::from_millis(self.init.delay_ms)).await;
        let suffix = self.suffix.lock().map_err(|e| e.to_string())?.clone();
        Ok(Json(VersionedAnswer {
            label: self.init.label.clone(),
            suffix,
            replica: self.replica.clone(),
            pid: std::process::id(),
        }))
    }

    fn reconfigure(&self, suffix: String) -> Result<(), BoxError> {
        *self.suffix.lock().map_err(|e| e.to_string())? = suffix;
        Ok(())
    }

    fn check_health(&self) -> Result<(), BoxError> {
        let sick = self
            .init
            .sick_dir
            .as_ref()
            .map(|dir| std::path::Path::new(dir).join(&self.replica));
        match sick {
            Some(flag) if flag.exists() => Err(format!("{} says so", flag.display()).into()),
            _ => Ok(()),
        }
    }
}

/// What a steady load got back.
#[derive(Debug, Default)]
pub struct Tally {
    pub answers: Vec<Answer>,
}

impl Tally {
    pub fn count(&self, status: u16) -> usize {
        self.answers.iter().filter(|answer| answer.status == status).count()
    }

    pub fn failures(&self) -> Vec<&Answer> {
        self.answers.iter().filter(|answer| answer.status != 200).collect()
    }
}

/// Sends `rate` requests a second to `path` for `duration`, each on its
/// own task, and gathers every answer.
pub async fn steady_load(client: &Client, path: &str, rate: u32, duration: Duration) -> Tally {
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate);
    let end = tokio::time::Instant::now() + duration;
    let mut requests = Vec::new();
    while tokio::time::Instant::now() < end {
        ticks.tick().await;
        let client = client.clone();
        let path = path.to_string();
        requests.push(tokio::spawn(async move {
            client.post(&path, "application/octet-stream", Vec::new()).await
        }));
    }
    let mut tally = Tally::default();
    for request in requests {
        tally.answers.push(request.await.expect("a request task"));
    }
    tally
}
