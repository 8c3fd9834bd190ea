//! Reading a head's HTTP routes in tests: a head started with its
//! dashboard, plain HTTP/1.1 requests, and Prometheus text parsed strictly.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// An HTTP/1.1 response: its status, its header lines and its body.
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Sends `METHOD path` with extra header lines (each ending in CRLF) and a body.
pub fn request(address: &str, method: &str, path: &str, headers: &str, body: &str) -> Reply {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// `GET path` with `token` as a bearer token (if any); returns the status
/// code and the body.
pub fn get(address: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map_or(String::new(), |token| format!("Authorization: Bearer {token}\r\n"));
    let reply = request(address, "GET", path, &auth, "");
    (reply.status, reply.body)
}

/// The samples of a Prometheus text exposition, keyed by name and labels;
/// panics on a line that is not one, or on a sample of an undeclared family.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut declared = Vec::new();
    let mut histograms = Vec::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
            declared.push(name.to_string());
            if kind == "histogram" {
                histograms.push(name.to_string());
            }
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("not a value: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "a bad metric name: {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|f| histograms.iter().any(|h| h == f)))
            .unwrap_or(name);
        assert!(declared.iter().any(|d| d == family), "{name} has no # TYPE line");
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "{line}"
            );
        }
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "a repeated series: {line}"
        );
    }
    samples
}

/// The sum of the samples of `name`.
pub fn total(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .map(|(_, value)| value)
        .sum()
}

pub fn metrics(address: &str, token: &str) -> BTreeMap<String, f64> {
    let (status, body) = get(address, "/metrics", Some(token));
    assert_eq!(status, 200, "{body}");
    parse_metrics(&body)
}

/// Waits until `metrics` satisfy `done`.
pub fn metrics_when(
    address: &str,
    token: &str,
    done: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let samples = metrics(address, token);
        if done(&samples) {
            return samples;
        }
        assert!(Instant::now() < deadline, "the metrics never got there: {samples:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn session_file(temp: &Path, name: &str) -> String {
    std::fs::read_to_string(temp.join("session_latest").join(name))
        .unwrap()
        .trim()
        .to_string()
}

/// Starts a head of `cpus` CPUs with its dashboard; the dashboard's address
/// and the cluster token.
pub fn start_head_with_dashboard(temp: &Path, cpus: &str) -> (String, String) {
    super::raylet(
        temp,
        &[
            "start",
            "--head",
            "--port",
            "0",
            "--dashboard-port",
            "0",
            "--num-cpus",
            cpus,
        ],
    );
    (session_file(temp, "dashboard_address"), session_file(temp, "token"))
}
