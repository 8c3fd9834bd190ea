//! Serve end to end from the CLI on a `raylet start` cluster: `raylet serve
//! deploy app.yaml` runs this test binary (which registers the deployment)
//! as a job that deploys the file and exits; the application then serves
//! real HTTP with the token, outlives that job, shows in `raylet serve
//! status` and on the head's `/metrics`, and `raylet serve delete` stops it.
//! Another binary's deploy is refused while this one's application runs,
//! and serves once it is deleted.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::http::{metrics_when, request, session_file, total};
use common::{Daemons, RAYLET, head_address, raylet};
use raylet_serve::{BoxError, Deployment, Json, ReplicaContext, register_deployment};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Greets whoever a request names.
struct Greeter {
    greeting: String,
}
register_deployment!(Greeter);

#[derive(Serialize, Deserialize)]
struct GreeterInit {
    greeting: String,
}

impl Deployment for Greeter {
    type Init = GreeterInit;
    type UserConfig = ();
    type Request = Json<String>;
    type Response = Json<String>;

    fn new(init: GreeterInit, _: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Greeter {
            greeting: init.greeting,
        })
    }

    async fn call(&self, Json(name): Json<String>) -> Result<Json<String>, BoxError> {
        Ok(Json(format!("{} {name}", self.greeting)))
    }
}

/// A deploy file for this binary, with `class` as the deployment's class.
fn deploy_file(dir: &std::path::Path, class: &str) -> std::path::PathBuf {
    let binary = std::env::current_exe().unwrap();
    let text = format!(
        "binary: {}\nname: greet\nroute_prefix: /greet\nhttp: {{port: 0}}\ndeployments:\n  - name: greeter\n    \
         class: {class}\n    num_replicas: 2\n    num_cpus: 0.5\n    init: {{greeting: hello}}\n",
        binary.display()
    );
    let path = dir.join(format!("{}.yaml", class.replace(':', "_")));
    std::fs::write(&path, text).unwrap();
    path
}

fn serve_status(temp: &std::path::Path) -> Value {
    serde_json::from_str(&raylet(temp, &["serve", "status", "--format", "json"])).unwrap()
}

#[test]
fn deploy_serve_and_delete_an_application_from_the_cli() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let start = [
        "start",
        "--head",
        "--port",
        "0",
        "--dashboard-port",
        "0",
        "--num-cpus",
        "2",
    ];
    raylet(temp.path(), &start);
    let _head = head_address(temp.path());
    let (dashboard, token) = (
        session_file(temp.path(), "dashboard_address"),
        session_file(temp.path(), "token"),
    );

    let wrong = deploy_file(temp.path(), "nowhere::Greeter");
    let refused = Command::new(RAYLET)
        .args(["serve", "deploy", wrong.to_str().unwrap(), "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("nowhere::Greeter") && said.contains("Greeter"),
        "names the class and what is registered: {said}"
    );

    let file = deploy_file(temp.path(), std::any::type_name::<Greeter>());
    let deployed = raylet(temp.path(), &["serve", "deploy", file.to_str().unwrap()]);
    let url = deployed
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("the deploy prints the address: {deployed}"));
    let address = url.trim_end_matches("/greet");

    let auth = format!("Authorization: Bearer {token}\r\nContent-Type: application/json\r\n");
    let greeted = request(address, "POST", "/greet", &auth, "\"world\"");
    assert_eq!((greeted.status, greeted.body.as_str()), (200, "\"hello world\""));
    let anonymous = request(
        address,
        "POST",
        "/greet",
        "Content-Type: application/json\r\n",
        "\"world\"",
    );
    assert_eq!(anonymous.status, 401);
    let healthz = request(address, "GET", "/-/healthz", "", "");
    assert_eq!(healthz.status, 200, "the proxy's health check needs no token");

    let status = serve_status(temp.path());
    let app = &status["apps"][0];
    assert_eq!(
        (app["name"].as_str(), app["state"].as_str()),
        (Some("greet"), Some("RUNNING")),
        "{status:#}"
    );
    let replicas = app["deployments"][0]["replicas"].as_array().unwrap();
    assert_eq!(
        replicas.len(),
        2,
        "the application outlived the job that deployed it: {status:#}"
    );

    let samples = metrics_when(&dashboard, &token, |samples| {
        total(samples, "serve_requests_total") >= 1.0
    });
    let ok = r#"serve_requests_total{app="greet",code="200",deployment="greeter"}"#;
    assert_eq!(samples.get(ok), Some(&1.0), "{samples:#?}");
    assert!(
        total(&samples, "serve_request_latency_seconds_count") >= 1.0,
        "{samples:#?}"
    );
    let running = r#"serve_replicas{app="greet",deployment="greeter",state="RUNNING"}"#;
    assert_eq!(samples.get(running), Some(&2.0), "{samples:#?}");

    another_build_waits_for_the_applications_of_the_running_one(temp.path(), &token);
}

/// Deploys serve_bench's no-op application, from another binary: refused
/// while `greet` (this binary's) runs, served once it is deleted.
fn another_build_waits_for_the_applications_of_the_running_one(temp: &Path, token: &str) {
    let file = other_build_file(temp);
    let refused = Command::new(RAYLET)
        .args(["serve", "deploy", file.to_str().unwrap(), "--temp-dir"])
        .arg(temp)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("another build") && said.contains("greet") && said.contains("raylet serve delete"),
        "says why and what to do: {said}"
    );
    let greeting = &serve_status(temp)["apps"][0];
    assert_eq!(greeting["state"], "RUNNING", "the running build went on serving");

    let deleted = raylet(temp, &["serve", "delete", "greet"]);
    assert!(deleted.contains("deleted greet"), "{deleted}");
    assert!(serve_status(temp)["apps"].as_array().unwrap().is_empty());

    let deployed = raylet(temp, &["serve", "deploy", file.to_str().unwrap()]);
    let url = deployed
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("the deploy prints the address: {deployed}"));
    let auth = format!("Authorization: Bearer {token}\r\n");
    let answered = request(url.trim_end_matches("/noop"), "POST", "/noop", &auth, "{}");
    assert_eq!((answered.status, answered.body.as_str()), (200, r#"{"ok":true}"#));
    let deleted = raylet(temp, &["serve", "delete", "noop"]);
    assert!(deleted.contains("deleted noop"), "{deleted}");
}

/// A deploy file for raylet-serve's `serve_bench` example, another binary
/// with deployments registered.
fn other_build_file(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe.parent().unwrap().parent().unwrap().join("examples/serve_bench");
    assert!(
        binary.exists(),
        "{} is missing: build it with `cargo build -p raylet-serve --example serve_bench` (the workspace's test run does)",
        binary.display()
    );
    let text = format!(
        "binary: {}\nname: noop\nroute_prefix: /noop\nhttp: {{port: 0}}\ndeployments:\n  - name: noop\n    \
         class: serve_bench::Noop\n    num_replicas: 1\n    num_cpus: 0.5\n    init: null\n",
        binary.display()
    );
    let path = dir.join("noop.yaml");
    std::fs::write(&path, text).unwrap();
    path
}
