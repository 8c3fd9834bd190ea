//! The head's HTTP server on a CLI cluster: every route refuses a missing
//! or wrong token, the login cookie reads but changes nothing, `/metrics`
//! parses as Prometheus text and its gauges move as nodes join, actors and
//! objects come and lease requests wait or are refused, the JSON API lists
//! what `raylet list` does, and `/api/serve` and the Serve page show the
//! status the Serve controller publishes.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::http::{get, metrics, metrics_when, request, session_file, start_head_with_dashboard, total};
use common::{Daemons, head_address, raylet};
use raylet::Config;
use serde_json::Value;

/// A route's path with its parameters filled in: a page, a job that is
/// not there.
fn concrete(path: &str) -> String {
    path.replace("{page}", "jobs")
        .replace("{id}", &"0".repeat(32))
        .replace("{protocol}", "gcs")
        .replace("{name}", "_ray_pkg_0000000000000000.zip")
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
    let form = "Content-Type: application/x-www-form-urlencoded\r\n";
    let right = request(&dashboard, "POST", "/login", form, &format!("token={token}"));
    assert_eq!(right.status, 303, "{}", right.head);
    let cookie = login_cookie(&right.head);
    assert!(
        right.head.contains("; HttpOnly; SameSite=Strict; Path=/") && !right.head.contains("Secure"),
        "{}",
        right.head
    );
    assert_ne!(cookie, token, "the cookie is not the token");
    assert!(!right.head.contains(&token), "the login reply shows no token");
    let with_cookie = format!("Cookie: raylet_token={cookie}\r\n");
    let lower_case_bearer = format!("Authorization: bearer {token}\r\n");
    let routes = raylet_dashboard::route_paths();
    for route in &routes {
        let path = concrete(route);
        for presented in [None, Some("wrong"), Some(other_cluster.as_str())] {
            let (status, body) = get(&dashboard, &path, presented);
            let refusal = if is_page(&path) { 303 } else { 401 };
            assert_eq!(status, refusal, "{path} with {presented:?}: {body}");
            assert!(!body.contains(&token), "a refusal shows the token");
        }
        for wrong_cookie in ["wrong", token.as_str()] {
            let refused = request(
                &dashboard,
                "GET",
                &path,
                &format!("Cookie: raylet_token={wrong_cookie}\r\n"),
                "",
            );
            assert!(matches!(refused.status, 303 | 401), "{path} with a wrong cookie");
        }
        let expected = match path.as_str() {
            "/" => 303,
            "/api/jobs/00000000000000000000000000000000"
            | "/api/jobs/00000000000000000000000000000000/logs"
            | "/api/packages/gcs/_ray_pkg_0000000000000000.zip" => 404,
            "/api/jobs/00000000000000000000000000000000/stop" => 405,
            "/api/jobs/00000000000000000000000000000000/logs/tail" => 400,
            _ => 200,
        };
        assert_eq!(get(&dashboard, &path, Some(&token)).0, expected, "{path}");
        for presented in [&with_cookie, &lower_case_bearer] {
            assert_eq!(
                request(&dashboard, "GET", &path, presented, "").status,
                expected,
                "{path} with {}",
                presented.split(':').next().unwrap_or_default()
            );
        }
    }
    let unknown = get(
        &dashboard,
        "/api/jobs/00000000000000000000000000000000/logs",
        Some(&token),
    );
    println!("an unknown job's logs: {} {}", unknown.0, unknown.1.trim());
    assert!(unknown.1.contains("00000000000000000000000000000000"), "{}", unknown.1);
    assert_cookie_is_no_grpc_credential(&head_address(temp.path()), &cookie);
    let json = "Content-Type: application/json\r\n";
    let submit_with_cookie = request(&dashboard, "POST", "/api/jobs/", &format!("{with_cookie}{json}"), "{}");
    assert_eq!(submit_with_cookie.status, 401, "{}", submit_with_cookie.body);
    assert!(
        submit_with_cookie
            .body
            .contains("the login cookie opens only requests that read")
    );
    let bearer = format!("Authorization: Bearer {token}\r\n{json}");
    let submit_with_token = request(&dashboard, "POST", "/api/jobs/", &bearer, "{}");
    assert_eq!(submit_with_token.status, 400, "{}", submit_with_token.body);
    assert!(
        submit_with_token.body.contains("missing field `entrypoint`"),
        "{}",
        submit_with_token.body
    );
    let zeros = "0".repeat(32);
    let delete_with_cookie = request(&dashboard, "DELETE", &format!("/api/jobs/{zeros}"), &with_cookie, "");
    assert_eq!(delete_with_cookie.status, 401, "a cookie changes nothing");
    println!("the login cookie reads but cannot submit or delete a job; the token can");
    assert_eq!(routes.len(), 26, "every route of the head's HTTP server: {routes:?}");
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
    let wrong = request(&dashboard, "POST", "/login", form, "token=wrong");
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("not this cluster's token") && !wrong.head.contains("set-cookie"));
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
    let (dashboard, token) = start_head_with_dashboard(temp.path(), "1");
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

/// The value of the `raylet_token` cookie that a login reply sets.
pub fn login_cookie(head: &str) -> String {
    let line = head
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: raylet_token="))
        .unwrap_or_else(|| panic!("the login sets no cookie: {head}"));
    line.split(';').next().unwrap_or_default().to_string()
}

/// The login cookie's value, presented as the token over gRPC, is refused.
fn assert_cookie_is_no_grpc_credential(head: &str, cookie: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let token = raylet_common::auth::AuthToken::parse(cookie).unwrap();
    let refused = runtime.block_on(async {
        let mut client = raylet_proto::channel::connect_head(head, &token, Duration::from_secs(5)).await?;
        let status = client.get_cluster_status(raylet_proto::v1::GetClusterStatusRequest::default());
        status.await.map_err(raylet_proto::Error::from)
    });
    match refused {
        Err(raylet_proto::Error::Unauthenticated(message)) => {
            println!("the login cookie as a gRPC token: unauthenticated: {message}")
        }
        other => panic!("the login cookie opened the head's gRPC: {other:?}"),
    }
}

/// The head lists its own `/metrics` and both nodes' for Prometheus; the
/// joined node's needs the token and has its lease replies and gRPC
/// latencies, and with the head machine's node's they count every lease
/// the naps took.
fn every_node_serves_its_metrics(dashboard: &str, token: &str) {
    let (status, targets) = get(dashboard, "/api/prometheus_targets", Some(token));
    assert_eq!(status, 200, "{targets}");
    let targets: Value = serde_json::from_str(&targets).unwrap();
    let targets = targets.as_array().unwrap();
    assert_eq!(targets.len(), 3, "{targets:?}");
    let target = |labels: (&str, &str)| {
        let found = targets.iter().find(|t| t["labels"][labels.0] == labels.1);
        found.unwrap_or_else(|| panic!("no target with {labels:?}: {targets:?}"))["targets"][0]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        target(("component", "head")),
        dashboard,
        "the head's metrics are its dashboard's"
    );
    let head_node = target(("is_head_node", "true"));
    let node = target(("is_head_node", "false"));
    let node = node.as_str();
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
    let on_head = metrics(&head_node, token);
    let both = on_node.get(granted).unwrap_or(&0.0) + on_head.get(granted).unwrap_or(&0.0);
    assert!(both >= 3.0, "the three naps' leases at least: {both}");
}

/// The lines of the large job's output: `seq 1 LINES` prints about 47 MB.
const LARGE_OUTPUT_LINES: u32 = 6_000_000;
/// Views of the large job's logs at once, and rounds of them.
const CONCURRENT_VIEWS: usize = 8;
const VIEW_ROUNDS: usize = 3;
/// How much the head's resident memory may grow while the views run. Before
/// the head read only the tail, each view held the whole output (47 MB, in a
/// vector that grows by doubling) and 8 at once took the head past 400 MiB.
const VIEW_MEMORY_BOUND: u64 = 64 << 20;

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`).
fn process_memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.trim().trim_end_matches(" kB").parse::<u64>().unwrap() << 10
}

#[test]
fn a_large_jobs_logs_view_reads_only_the_end_and_the_heads_memory_stays_flat() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let (dashboard, token) = start_head_with_dashboard(temp.path(), "1");
    let head_pid = common::daemon_pids(temp.path(), "head")[0];
    let seq = format!("seq 1 {LARGE_OUTPUT_LINES}");
    let submitted = std::process::Command::new(common::RAYLET)
        .args(["job", "submit", "--no-wait", "--temp-dir"])
        .arg(temp.path())
        .args(["--", "/bin/sh", "-c", &seq])
        .output()
        .unwrap();
    assert!(submitted.status.success(), "{submitted:?}");
    let id = String::from_utf8(submitted.stdout).unwrap().trim().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let status = raylet(temp.path(), &["job", "status", &id]);
        if status.contains("SUCCEEDED") {
            break;
        }
        assert!(
            !status.contains("FAILED") && std::time::Instant::now() < deadline,
            "{status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = std::process::Command::new("seq")
        .args(["1", &LARGE_OUTPUT_LINES.to_string()])
        .output()
        .unwrap()
        .stdout;
    let expected = String::from_utf8(output[output.len() - (64 << 10)..].to_vec()).unwrap();
    let path = format!("/api/jobs/{id}/logs?tail_bytes={}", 64 << 10);

    let before = process_memory(head_pid, "VmRSS");
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(process_memory(head_pid, "VmRSS"), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let started = std::time::Instant::now();
    let views: Vec<_> = (0..CONCURRENT_VIEWS)
        .map(|_| {
            let (dashboard, token, path) = (dashboard.clone(), token.clone(), path.clone());
            std::thread::spawn(move || {
                (0..VIEW_ROUNDS)
                    .map(|_| {
                        let asked = std::time::Instant::now();
                        let (status, body) = get(&dashboard, &path, Some(&token));
                        (status, body, asked.elapsed())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for view in views {
        for (status, body, took) in view.join().unwrap() {
            assert_eq!(status, 200, "{body}");
            let view: Value = serde_json::from_str(&body).unwrap();
            let logs = view["logs"].as_str().unwrap();
            assert_eq!(logs.len(), 64 << 10, "exactly the last 64 KiB");
            assert!(logs == expected, "the view is the output's last 64 KiB");
            slowest = slowest.max(took);
        }
    }
    let elapsed = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let grew = peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(before);
    println!(
        "{} views ({CONCURRENT_VIEWS} at once) of a {} MB output's last 64 KiB in {elapsed:.2?}, \
         the slowest {slowest:.2?}; the head's RSS {} MiB before, grew by at most {} KiB (bound {} MiB)",
        CONCURRENT_VIEWS * VIEW_ROUNDS,
        output.len() >> 20,
        before >> 20,
        grew >> 10,
        VIEW_MEMORY_BOUND >> 20
    );
    assert!(
        grew < VIEW_MEMORY_BOUND,
        "the head grew by {} MiB while the views ran",
        grew >> 20
    );
}
