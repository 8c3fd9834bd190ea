//! Prometheus for real (issue 53): Debian's `prometheus` server finds a
//! running cluster's targets through the head's HTTP service discovery
//! list (`/api/prometheus_targets`), scrapes the head and every node with
//! the cluster token, and answers queries for task, object-store, Serve and
//! autoscaler series. The Grafana dashboard shipped in
//! `deploy/grafana/raylet.json` is read as JSON, and every series its
//! queries name is one this Prometheus holds.

use crate::autoscaler_cluster::{UpCluster, node_manager_pid, wait_for};
use crate::common;
use crate::serve_deploy::{greet, greeter_class};

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::http::session_file;
use common::{Daemons, raylet};
use raylet_test_support::{Need, missing};
use serde_json::Value;

/// Where Debian's package puts the server.
const PROMETHEUS: &str = "/usr/bin/prometheus";
/// The dashboard that `deploy/grafana/` ships, from this file's directory.
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/raylet.json");

/// Holds its CPUs for `ms` milliseconds.
#[raylet::remote]
fn hold_two_cpus(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// A Prometheus server of this test, stopped when dropped.
struct Prometheus {
    child: Child,
    address: String,
}

impl Prometheus {
    /// Starts one in `dir` that discovers its targets at the dashboard
    /// `dashboard` and scrapes them every second, with `token`.
    fn start(dir: &Path, dashboard: &str, token: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        let text = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n\
             \x20 - job_name: raylet\n\
             \x20   authorization: {{type: Bearer, credentials: \"{token}\"}}\n\
             \x20   http_sd_configs:\n\
             \x20     - url: http://{dashboard}/api/prometheus_targets\n\
             \x20       refresh_interval: 1s\n\
             \x20       authorization: {{type: Bearer, credentials: \"{token}\"}}\n"
        );
        std::fs::write(&config, text).unwrap();
        // A free port may be taken by another test before Prometheus binds
        // it: then it exits at once, saying so, and another port is tried.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let address = format!("127.0.0.1:{port}");
            let log_path = dir.join("prometheus.log");
            let log = std::fs::File::create(&log_path).unwrap();
            let child = Command::new(PROMETHEUS)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
                .arg(format!("--web.listen-address={address}"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("prometheus starts");
            let mut prometheus = Prometheus { child, address };
            if prometheus.ready() {
                return prometheus;
            }
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            assert!(
                said.contains("address already in use"),
                "Prometheus did not start:\n{said}"
            );
        }
        panic!("Prometheus found no free port in 5 tries");
    }

    /// Waits until it answers; false if it exited first.
    fn ready(&mut self) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if self.api("/api/v1/status/buildinfo").is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("Prometheus at {} did not answer within 30 s", self.address);
    }

    /// `GET path` of its HTTP API, as JSON (`data` of a success).
    fn api(&self, path: &str) -> Option<Value> {
        let mut stream = TcpStream::connect(&self.address).ok()?;
        // HTTP/1.0: the reply is the body whole, never chunked.
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.address).ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        let (_, body) = reply.split_once("\r\n\r\n")?;
        let value: Value = serde_json::from_str(body).ok()?;
        (value["status"] == "success").then(|| value["data"].clone())
    }

    /// The samples of the instant query `query` (URL-safe), once it has any.
    fn query(&self, query: &str) -> Vec<Value> {
        wait_for(Duration::from_secs(60), &format!("Prometheus to hold {query}"), || {
            let result = self.api(&format!("/api/v1/query?query={query}"))?["result"].clone();
            let samples = result.as_array().cloned().unwrap_or_default();
            (!samples.is_empty()).then_some(samples)
        })
    }

    /// Its targets once it scrapes at least 3 (the head and two nodes' own
    /// `/metrics`) of both components, every one up; fails with the
    /// targets it saw last and its log (in `dir`) after 60 s.
    fn every_target_up(&self, dir: &Path) -> Vec<Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let seen = self
                .api("/api/v1/targets")
                .map_or(Value::Null, |data| data["activeTargets"].clone());
            let targets = seen.as_array().cloned().unwrap_or_default();
            let components: BTreeSet<&str> = targets
                .iter()
                .filter_map(|t| t["labels"]["component"].as_str())
                .collect();
            let all_up = targets.iter().all(|target| target["health"] == "up");
            if targets.len() >= 3 && all_up && components.len() == 2 {
                return targets;
            }
            if std::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
                panic!("not every target was scraped within 60 s; the last seen: {seen:#}\nits log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The names of every series it holds.
    fn series_names(&self) -> BTreeSet<String> {
        let names = self
            .api("/api/v1/label/__name__/values")
            .expect("the names of its series");
        names
            .as_array()
            .unwrap()
            .iter()
            .map(|name| name.as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A deploy file of `greet` for this binary: one replica of the greeter
/// under an autoscaling policy (which reports its queue), behind a proxy
/// on a free port.
fn autoscaled_deploy_file(dir: &Path) -> std::path::PathBuf {
    let binary = std::env::current_exe().unwrap();
    let text = format!(
        "binary: {}\nname: greet\nroute_prefix: /greet\nhttp: {{port: 0}}\ndeployments:\n  - name: greeter\n    \
         class: {}\n    num_cpus: 0.5\n    autoscaling: {{min_replicas: 1, max_replicas: 1}}\n    \
         init: {{greeting: hello}}\n",
        binary.display(),
        greeter_class()
    );
    let path = dir.join("greet-autoscaled.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The metric names in a PromQL expression: raylet's own series.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        let word = &tail[..end];
        if word.starts_with("raylet_") || word.starts_with("serve_") {
            names.push(word.to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// Every `expr` of the dashboard's panels.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("the dashboard has panels") {
        let panel_queries = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        for target in panel_queries {
            queries.push(target["expr"].as_str().expect("each target has an expr").to_string());
        }
    }
    queries
}

#[test]
fn prometheus_scrapes_every_target_the_head_lists_and_the_grafana_dashboard_names_series_it_holds() {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    if !Path::new(PROMETHEUS).exists() {
        return missing(Need::Prometheus, &format!("{PROMETHEUS} does not exist"));
    }
    let cluster = UpCluster::up(1, &UpCluster::cpu2_types(1, 600), None);
    let _daemons = Daemons(cluster.path());
    let driver = cluster.driver();
    let token = session_file(cluster.path(), "token");
    let dashboard_address = session_file(cluster.path(), "dashboard_address");

    let file = autoscaled_deploy_file(cluster.path());
    let deployed = raylet(cluster.path(), &["serve", "deploy", file.to_str().unwrap()]);
    let proxy = crate::serve_deploy::proxy_address(&deployed);
    let auth = format!("Authorization: Bearer {token}\r\nContent-Type: application/json\r\n");
    for _ in 0..5 {
        assert_eq!(greet(&proxy, &auth), 200);
    }
    let held = driver.put(&vec![7u8; 1 << 20]).unwrap();
    let finished = node_manager_pid::options().num_cpus(0.25).remote(&driver).unwrap();
    driver.get_timeout(&finished, Duration::from_secs(30)).unwrap();
    // The first launches the one cpu2 node the config allows; the others
    // wait, and the autoscaler reports them as demand it cannot meet.
    let holding: Vec<_> = (0..3)
        .map(|_| hold_two_cpus::options().num_cpus(2.0).remote(&driver, 60_000).unwrap())
        .collect();

    let prometheus = Prometheus::start(cluster.path(), &dashboard_address, &token);
    let targets = prometheus.every_target_up(cluster.path());
    println!(
        "Prometheus scrapes {} targets: {:?}",
        targets.len(),
        targets.iter().map(|t| t["scrapeUrl"].clone()).collect::<Vec<_>>()
    );

    let finished = prometheus.query("raylet_tasks%7Bstate%3D%22FINISHED%22%7D");
    assert!(
        finished.iter().any(|s| s["metric"]["function"]
            .as_str()
            .unwrap_or("")
            .contains("node_manager_pid")),
        "{finished:#?}"
    );
    let used = prometheus.query("sum(raylet_object_store_used_bytes)");
    let used: f64 = used[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(used >= (1 << 20) as f64, "the 1 MiB object is counted: {used}");
    let answered = prometheus.query("serve_requests_total%7Bcode%3D%22200%22%7D");
    assert_eq!(answered[0]["metric"]["app"], "greet", "{answered:#?}");
    let launched = prometheus.query("raylet_autoscaler_launches_total");
    assert_eq!(launched[0]["metric"]["node_type"], "cpu2", "{launched:#?}");
    let waiting = prometheus.query("raylet_autoscaler_waiting_demand");
    let reason = waiting[0]["metric"]["reason"].as_str().unwrap();
    assert!(reason.contains("max"), "{waiting:#?}");
    prometheus.query("serve_queued_requests");

    let held_series = prometheus.series_names();
    let missing_series: Vec<(String, String)> = queries
        .iter()
        .flat_map(|query| metric_names(query).into_iter().map(move |name| (name, query.clone())))
        .filter(|(name, _)| !held_series.contains(name))
        .collect();
    assert!(
        missing_series.is_empty(),
        "the dashboard's queries name series Prometheus does not hold: {missing_series:#?}"
    );
    drop((held, holding));
    drop(driver);
    let said = cluster.down();
    assert!(said.contains("is down"), "{said}");
}

#[test]
fn metric_names_are_read_out_of_promql() {
    assert_eq!(
        metric_names("histogram_quantile(0.99, sum by (le) (rate(raylet_grpc_server_handling_seconds_bucket[5m])))"),
        ["raylet_grpc_server_handling_seconds_bucket"]
    );
    assert_eq!(
        metric_names("sum(raylet_object_store_used_bytes) / sum(raylet_object_store_capacity_bytes)"),
        ["raylet_object_store_used_bytes", "raylet_object_store_capacity_bytes"]
    );
    assert_eq!(
        metric_names("sum by (state) (serve_replicas{app=\"x\"})"),
        ["serve_replicas"]
    );
}
