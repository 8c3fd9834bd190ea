//! The head's HTTP server on a CLI cluster: every route refuses a missing
//! or wrong token, `/metrics` parses as Prometheus text and its gauges move
//! as nodes join, actors and objects come and lease requests wait or are
//! refused, the JSON API lists what `raylet list` does, and `/api/serve`
//! and the Serve page show the status the Serve controller publishes.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::http::{get, metrics, metrics_when, request, session_file, total};
use common::{Daemons, head_address, raylet};
use raylet::Config;
use serde_json::Value;

/// A route's path with its parameters filled in: a page, a job that is
/// not there.
fn concrete(path: &str) -> String {
    path.replace("{page}", "jobs").replace("{id}", &"0".repeat(32))
}

/// Whether the route is a page, which sends a browser to the login page.
fn is_page(path: &str) -> bool {
    path == "/" || (path.starts_with("/ui") && !path.starts_with("/ui/assets/"))
}

#[raylet::actor]
pub struct Counter {
    count: u64,
}

#[raylet::actor]
impl Counter {
    pub fn new(start: u64) -> Self {
        Counter { count: start }
    }

    pub fn add(&mut self, by: u64) -> u64 {
        self.count += by;
        self.count
    }
}

#[raylet::remote]
fn nap(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

#[test]
fn the_heads_http_routes_need_the_token_and_metrics_follow_the_cluster() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let fast = ["--num-cpus", "1", "--heartbeat-interval", "100ms"];
    raylet(
        temp.path(),
        &[&["start", "--head", "--port", "0", "--dashboard-port", "0"][..], &fast].concat(),
    );
    let dashboard = session_file(temp.path(), "dashboard_address");
    let token = session_file(temp.path(), "token");

    let other_cluster = "f".repeat(64);
    let with_cookie = format!("Cookie: raylet_token={token}\r\n");
    let routes = raylet_dashboard::route_paths();
    for route in &routes {
        let path = concrete(route);
        for presented in [None, Some("wrong"), Some(other_cluster.as_str())] {
            let (status, body) = get(&dashboard, &path, presented);
            let refusal = if is_page(&path) { 303 } else { 401 };
            assert_eq!(status, refusal, "{path} with {presented:?}: {body}");
            assert!(!body.contains(&token), "a refusal shows the token");
        }
        let refused = request(&dashboard, "GET", &path, "Cookie: raylet_token=wrong\r\n", "");
        assert!(matches!(refused.status, 303 | 401), "{path} with a wrong cookie");
        let expected = match path.as_str() {
            "/" => 303,
            "/api/jobs/00000000000000000000000000000000/logs" => 502,
            _ => 200,
        };
        assert_eq!(get(&dashboard, &path, Some(&token)).0, expected, "{path}");
        assert_eq!(
            request(&dashboard, "GET", &path, &with_cookie, "").status,
            expected,
            "{path}"
        );
    }
    assert_eq!(routes.len(), 20, "every route of the head's HTTP server: {routes:?}");
    println!(
        "{} HTTP routes refuse requests without the cluster's token",
        routes.len()
    );
    for path in [
        "/api/not-a-route",
        "/admin",
        "/api/jobs/abc/not-a-route",
        "/ui/assets/other.js",
    ] {
        let (status, _) = get(&dashboard, path, None);
        assert_eq!(
            status, 401,
            "{path} is refused before routing, so no route can be public by mistake"
        );
        assert_eq!(get(&dashboard, path, Some(&token)).0, 404, "{path} with the token");
    }
    assert_eq!(raylet_dashboard::PUBLIC_PATHS, ["/healthz", "/login"]);
    let form = "Content-Type: application/x-www-form-urlencoded\r\n";
    let wrong = request(&dashboard, "POST", "/login", form, "token=wrong");
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("not this cluster's token") && !wrong.head.contains("set-cookie"));
    let right = request(&dashboard, "POST", "/login", form, &format!("token={token}"));
    assert_eq!(right.status, 303, "{}", right.head);
    assert!(
        right
            .head
            .contains(&format!("set-cookie: raylet_token={token}; HttpOnly; SameSite=Strict"))
    );
    assert_eq!(get(&dashboard, "/login", None).0, 200, "the login page needs no token");
    assert_eq!(
        get(&dashboard, "/healthz", None),
        (200, "ok\n".to_string()),
        "nor the health check"
    );

    let samples = metrics(&dashboard, &token);
    assert_eq!(samples[r#"raylet_nodes{state="ALIVE"}"#], 1.0);
    assert_eq!(total(&samples, "raylet_actors"), 0.0);
    assert!(total(&samples, "raylet_node_resource_total") > 0.0);

    let head = head_address(temp.path());
    raylet(temp.path(), &[&["start", "--address", &head][..], &fast].concat());
    metrics_when(&dashboard, &token, |s| s[r#"raylet_nodes{state="ALIVE"}"#] == 2.0);
    let cpus = |s: &BTreeMap<String, f64>| -> f64 {
        s.iter()
            .filter(|(series, _)| {
                series.starts_with("raylet_node_resource_total{") && series.contains(r#"resource="CPU""#)
            })
            .map(|(_, value)| value)
            .sum()
    };
    assert_eq!(cpus(&metrics(&dashboard, &token)), 2.0, "a CPU from each node");

    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let counter = Counter::remote(&cluster, 0).spawn().unwrap();
    assert_eq!(counter.add(2).get().unwrap(), 2);
    let block = cluster.put(&serde_bytes::ByteBuf::from(vec![7u8; 2 << 20])).unwrap();
    let samples = metrics_when(&dashboard, &token, |s| {
        s[r#"raylet_actors{state="ALIVE"}"#] == 1.0 && total(s, "raylet_object_store_objects") >= 1.0
    });
    assert!(total(&samples, "raylet_object_store_used_bytes") >= (2 << 20) as f64);

    let (_, nodes) = get(&dashboard, "/api/nodes", Some(&token));
    let nodes: Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 2, "{nodes}");
    let (_, actors) = get(&dashboard, "/api/actors", Some(&token));
    let actors: Value = serde_json::from_str(&actors).unwrap();
    assert_eq!(actors[0]["state"], "ALIVE", "{actors}");
    let (_, stores) = get(&dashboard, "/api/objects", Some(&token));
    assert!(stores.contains(&block.id().to_string()), "{stores}");

    cluster.kill(&counter, true).unwrap();
    metrics_when(&dashboard, &token, |s| s[r#"raylet_actors{state="DEAD"}"#] == 1.0);

    let naps: Vec<_> = (0..3).map(|_| nap::remote(&cluster, 3_000).unwrap()).collect();
    metrics_when(&dashboard, &token, |s| total(s, "raylet_lease_requests_pending") >= 1.0);
    let refused = nap::options().num_cpus(64.0).remote(&cluster, 0).unwrap();
    assert!(refused.get().is_err(), "64 CPUs fit no node");
    metrics_when(&dashboard, &token, |s| {
        total(s, "raylet_lease_requests_infeasible") >= 1.0
    });
    assert_eq!(cluster.get_all(&naps).unwrap(), vec![3_000; 3]);
    every_node_serves_its_metrics(&dashboard, &token);
}

#[test]
fn the_serve_api_returns_the_controllers_status_only_with_the_token() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(
        temp.path(),
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--dashboard-port",
            "0",
            "--num-cpus",
            "1",
        ],
    );
    let dashboard = session_file(temp.path(), "dashboard_address");
    let token = session_file(temp.path(), "token");
    assert_eq!(
        get(&dashboard, "/api/serve", Some(&token)),
        (200, "null".to_string()),
        "no Serve controller published a status"
    );

    let head = head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let published = serde_json::json!({
        "updated_at_ms": 1_764_180_000_000u64,
        "controller": {"node_id": "ab12cd34", "pid": 4242},
        "proxies": [{"node_id": "ab12cd34", "address": "127.0.0.1:8000"}],
        "apps": [{
            "name": "digits", "route_prefix": "/classify", "public": false, "state": "RUNNING", "message": "",
            "deployments": [{
                "name": "classifier", "class": "serve_digits::Classifier", "version": "3f9a1c22",
                "target_replicas": 1, "max_ongoing_requests": 32,
                "replicas": [{"name": "replica:digits:classifier:3f9a1c22:1", "state": "RUNNING",
                              "version": "3f9a1c22", "node_id": "ab12cd34", "pid": 5151, "ongoing": 0}],
                "requests": {"total": 10, "errors": 0},
                "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2.0,
                    "current": 1, "desired": 1, "average_ongoing": 0.0, "queued": 0, "decision": "hold at 1"}
            }]
        }]
    });
    cluster.publish_to_dashboard("serve", "status", &published).unwrap();
    let (status, body) = get(&dashboard, "/api/serve", Some(&token));
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), published);
    for presented in [None, Some("wrong")] {
        let (status, body) = get(&dashboard, "/api/serve", presented);
        assert_eq!(status, 401, "{presented:?}");
        assert!(
            !body.contains("digits"),
            "a refusal shows nothing of the status: {body}"
        );
    }
    let (status, page) = get(&dashboard, "/ui/serve", Some(&token));
    assert_eq!(status, 200);
    assert!(page.contains("/ui/assets/app.js"), "{page}");
    let (_, script) = get(&dashboard, "/ui/assets/app.js", Some(&token));
    assert!(
        script.contains(r#"["serve", "Serve", servePage]"#),
        "the Serve page is in the nav"
    );
    assert!(script.contains(r#"api("/api/serve")"#));
    cluster.shutdown().unwrap();
}

/// The head lists both nodes' `/metrics` for Prometheus; the joined node's
/// needs the token and has its lease replies and gRPC latencies, and with
/// the head's they count every lease the naps took.
fn every_node_serves_its_metrics(dashboard: &str, token: &str) {
    let (status, targets) = get(dashboard, "/api/prometheus_targets", Some(token));
    assert_eq!(status, 200, "{targets}");
    let targets: Value = serde_json::from_str(&targets).unwrap();
    let targets = targets.as_array().unwrap();
    assert_eq!(targets.len(), 2, "{targets:?}");
    let node = targets.iter().find(|t| t["labels"]["is_head_node"] == "false").unwrap();
    let head = targets.iter().find(|t| t["labels"]["is_head_node"] == "true").unwrap();
    assert_eq!(head["targets"][0], dashboard, "the head's metrics are its dashboard's");
    let node = node["targets"][0].as_str().unwrap();
    let foreign = "f".repeat(64);
    for route in raylet_dashboard::NODE_ROUTES.iter().chain(&["/healthz", "/api/nodes"]) {
        for presented in [None, Some("wrong"), Some(foreign.as_str())] {
            assert_eq!(
                get(node, route, presented).0,
                401,
                "{route} of a node with {presented:?}"
            );
        }
    }
    let on_node = metrics(node, token);
    let lease_sessions =
        r#"raylet_grpc_server_handling_seconds_count{method="raylet.v1.NodeManagerService/LeaseSession"}"#;
    assert!(
        on_node.get(lease_sessions).is_some_and(|count| *count >= 1.0),
        "{on_node:#?}"
    );
    let granted = r#"raylet_node_lease_replies_total{outcome="granted"}"#;
    let on_head = metrics(dashboard, token);
    let both = on_node.get(granted).unwrap_or(&0.0) + on_head.get(granted).unwrap_or(&0.0);
    assert!(both >= 3.0, "the three naps' leases at least: {both}");
}
