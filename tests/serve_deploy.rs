//! Serve end to end from the CLI on a `raylet start` cluster: `raylet serve
//! deploy app.yaml` runs this test binary (which registers the deployment)
//! as a job that deploys the file and exits; the application then serves
//! real HTTP with the token, outlives that job, shows in `raylet serve
//! status` and on the head's `/metrics`, and `raylet serve delete` stops it.
//! Another binary's deploy is refused while this one's application runs,
//! and serves once it is deleted.
//!
//! Issue 47: an application deployed from the CLI heals after each of its
//! replicas and its proxy is SIGKILLed under load (the deploy job, and the
//! directory that held its binary, are long gone by then); a replica that
//! cannot fit is named with what it waits for; a proxy whose port is taken
//! is started again with back-off and reported. An application on the
//! machine of a head with CPUs answers every request through the head's
//! SIGKILL and recovery (item 7). Slow uploads to a public application
//! leave its proxy within its body budget (item 1).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// The class name a deploy file gives for [`Greeter`].
pub fn greeter_class() -> &'static str {
    std::any::type_name::<Greeter>()
}

/// A deploy file for this binary, with `class` as the deployment's class.
fn deploy_file(dir: &std::path::Path, class: &str) -> std::path::PathBuf {
    deploy_file_with(dir, class, 2, 0.5, 0)
}

/// A deploy file of `greet` for this binary: `replicas` of `class`, each
/// holding `cpus`, behind proxies on `port`.
fn deploy_file_with(dir: &Path, class: &str, replicas: u32, cpus: f64, port: u16) -> PathBuf {
    let binary = std::env::current_exe().unwrap();
    let text = format!(
        "binary: {}\nname: greet\nroute_prefix: /greet\nhttp: {{port: {port}}}\ndeployments:\n  - name: greeter\n    \
         class: {class}\n    num_replicas: {replicas}\n    num_cpus: {cpus}\n    init: {{greeting: hello}}\n",
        binary.display()
    );
    let path = dir.join(format!("{}-{replicas}-{port}.yaml", class.replace(':', "_")));
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
    start_head(temp.path(), "2");
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

/// A load of `threads` clients, each sending one request after another to
/// `POST /greet` at `address` (which may change: a proxy restarted on
/// port 0 listens elsewhere), tallying the answers by status (0 for no
/// answer at all) until it is stopped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<u16>>>,
}

impl Load {
    fn start(address: Arc<Mutex<String>>, token: &str, threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let auth = format!("Authorization: Bearer {token}\r\nContent-Type: application/json\r\n");
        let threads = (0..threads)
            .map(|_| {
                let (stop, address, auth) = (stop.clone(), address.clone(), auth.clone());
                std::thread::spawn(move || {
                    let mut statuses = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let to = address.lock().unwrap().clone();
                        statuses.push(greet(&to, &auth));
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    statuses
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the clients; returns every status they got.
    fn stop(self) -> Vec<u16> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    }
}

/// One `POST /greet "world"`: its status, 0 when no answer came; any 200
/// must greet the world.
pub fn greet(address: &str, auth: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(address) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let body = "\"world\"";
    let sent = write!(
        stream,
        "POST /greet HTTP/1.1\r\nHost: {address}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut response = String::new();
    if sent.is_err() || stream.read_to_string(&mut response).is_err() {
        return 0;
    }
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status == 200 {
        assert!(response.ends_with("\"hello world\""), "{response}");
    }
    status
}

/// The running replicas of `greet` as (name, pid), once its state is
/// `RUNNING` with 2 replicas that all run, none of them named in `gone`;
/// panics after `seconds`.
fn healed(temp: &Path, gone: &[String], seconds: u64) -> Vec<(String, u32)> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let status = serve_status(temp);
        let app = &status["apps"][0];
        let replicas: Vec<(String, String, u32)> = app["deployments"][0]["replicas"]
            .as_array()
            .map(|replicas| {
                replicas
                    .iter()
                    .map(|r| {
                        let name = r["name"].as_str().unwrap_or_default().to_string();
                        let state = r["state"].as_str().unwrap_or_default().to_string();
                        (name, state, r["pid"].as_u64().unwrap_or(0) as u32)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let all_running = replicas.len() == 2
            && replicas
                .iter()
                .all(|(name, state, pid)| state == "RUNNING" && *pid != 0 && !gone.contains(name));
        if app["state"] == "RUNNING" && all_running {
            return replicas.into_iter().map(|(name, _, pid)| (name, pid)).collect();
        }
        assert!(
            Instant::now() < deadline,
            "`greet` did not heal within {seconds} s (replicas {gone:?} killed): {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pid of the alive actor named `name` in namespace `serve`, if any.
fn serve_actor_pid(temp: &Path, name: &str) -> Option<u32> {
    let actors: Value = serde_json::from_str(&raylet(temp, &["list", "actors", "--format", "json"])).unwrap();
    let alive = actors
        .as_array()?
        .iter()
        .find(|a| a["namespace"] == "serve" && a["name"] == name && a["state"] == "ALIVE")?;
    alive["pid"].as_u64().map(|pid| pid as u32)
}

fn sigkill(pid: u32) {
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success(), "kill -9 {pid}");
}

/// Issue 47, item 3: the deploy job's directory, which held the binary, is
/// removed when the job ends; the application it deployed must still start
/// new replicas and proxies from a binary that outlives it. Under a steady
/// load each replica is SIGKILLed in turn, then the proxy; the application
/// comes back to RUNNING with 2 replicas each time, every request after it
/// healed is answered, and deploying the file again succeeds.
#[test]
fn a_deployed_application_heals_after_each_replica_and_its_proxy_are_killed_under_load() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    start_head(temp.path(), "2");
    let token = session_file(temp.path(), "token");
    let file = deploy_file(temp.path(), std::any::type_name::<Greeter>());
    let deployed = raylet(temp.path(), &["serve", "deploy", file.to_str().unwrap()]);
    let address = proxy_address(&deployed);
    let original = healed(temp.path(), &[], 30);

    let shared = Arc::new(Mutex::new(address.clone()));
    let load = Load::start(shared.clone(), &token, 4);
    std::thread::sleep(Duration::from_secs(1));
    let mut killed = Vec::new();
    for (name, pid) in &original {
        let began = Instant::now();
        sigkill(*pid);
        killed.push(name.clone());
        let replicas = healed(temp.path(), &killed, 60);
        println!(
            "replica {name} (pid {pid}) SIGKILLed: healed in {:.1} s, now {replicas:?}",
            began.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let during = load.stop();

    let node = serve_status(temp.path())["proxies"][0]["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let proxy_name = format!("proxy:{node}");
    let proxy_pid = serve_actor_pid(temp.path(), &proxy_name).expect("the proxy runs");
    sigkill(proxy_pid);
    let began = Instant::now();
    let auth = format!("Authorization: Bearer {token}\r\nContent-Type: application/json\r\n");
    let restarted = loop {
        let proxies = serve_status(temp.path())["proxies"].clone();
        let pid = serve_actor_pid(temp.path(), &proxy_name);
        let listed = proxies[0]["address"].as_str().map(str::to_string);
        // The status may still list the killed proxy's address until the
        // controller sees it die; the new one has healed once it answers.
        if let (Some(pid), Some(address)) = (pid, listed)
            && pid != proxy_pid
            && greet(&address, &auth) == 200
        {
            break address;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "no proxy came back within 60 s: {proxies:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "proxy (pid {proxy_pid}) SIGKILLed: a new one listens at {restarted} after {:.1} s",
        began.elapsed().as_secs_f64()
    );
    *shared.lock().unwrap() = restarted.clone();

    let failed: Vec<u16> = during.iter().copied().filter(|status| *status != 200).collect();
    println!(
        "{} requests while 2 replicas were SIGKILLed in turn: {} failed {failed:?}",
        during.len(),
        failed.len()
    );
    assert!(during.len() >= 100, "the load ran: {} requests", during.len());
    assert!(
        failed.len() <= 8,
        "at most the requests in flight at a killed replica fail (4 clients, 2 kills): {failed:?}"
    );
    assert!(failed.iter().all(|status| *status == 503), "{failed:?}");

    let after: Vec<u16> = (0..50).map(|_| greet(&restarted, &auth)).collect();
    assert!(after.iter().all(|status| *status == 200), "after healing: {after:?}");

    let again = raylet(temp.path(), &["serve", "deploy", file.to_str().unwrap()]);
    assert!(again.contains("deployed greet"), "{again}");
    assert_eq!(greet(&proxy_address(&again), &auth), 200);
    let deleted = raylet(temp.path(), &["serve", "delete", "greet"]);
    assert!(deleted.contains("deleted greet"), "{deleted}");
}

/// Issue 47, item 7: on a head started with default settings (with CPUs),
/// the Serve controller, the proxy and the replicas run on the head's
/// machine. A SIGKILL of the head leaves them running, as its machine's
/// node manager is a daemon of its own: the application answers every
/// request while the head is down and after it is started again with
/// `--recover`, from the same replicas and proxy.
#[test]
fn an_application_on_the_heads_machine_answers_through_a_head_kill_and_recovery() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(
        temp.path(),
        &["start", "--head", "--port", "0", "--dashboard-port", "0"],
    );
    let token = session_file(temp.path(), "token");
    let file = deploy_file(temp.path(), std::any::type_name::<Greeter>());
    let deployed = raylet(temp.path(), &["serve", "deploy", file.to_str().unwrap()]);
    let address = proxy_address(&deployed);
    let replicas = healed(temp.path(), &[], 30);
    let node = serve_status(temp.path())["proxies"][0]["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let proxy = format!("proxy:{node}");
    let proxy_pid = serve_actor_pid(temp.path(), &proxy).expect("the proxy runs");

    let load = Load::start(Arc::new(Mutex::new(address)), &token, 2);
    std::thread::sleep(Duration::from_secs(1));
    common::kill_head(temp.path());
    std::thread::sleep(Duration::from_secs(2));
    raylet(temp.path(), &["start", "--head", "--recover", "--dashboard-port", "0"]);
    assert_eq!(
        healed(temp.path(), &[], 60),
        replicas,
        "the same replicas serve after the restart"
    );
    assert_eq!(serve_actor_pid(temp.path(), &proxy), Some(proxy_pid), "the same proxy");
    std::thread::sleep(Duration::from_secs(1));
    let statuses = load.stop();
    let failed: Vec<u16> = statuses.iter().copied().filter(|status| *status != 200).collect();
    println!(
        "{} requests through a SIGKILL of the head and its recovery: {} failed {failed:?}",
        statuses.len(),
        failed.len()
    );
    assert!(statuses.len() >= 100, "the load ran: {} requests", statuses.len());
    assert!(failed.is_empty(), "every request is answered: {failed:?}");
}

/// Resident memory of `pid`, in MiB.
fn resident_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() >> 10
}

/// A client of a public application, from its own loopback address, that
/// declares a `declared`-byte body, sends `sent` bytes of it as fast as the
/// proxy takes them (for at most a few seconds), then stalls.
fn slow_upload(address: &str, declared: usize, sent: usize) -> std::net::TcpStream {
    use std::io::Write;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let flooder: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
    let proxy: std::net::SocketAddr = address.parse().unwrap();
    socket.bind(&flooder.into()).unwrap();
    socket.connect(&proxy.into()).unwrap();
    let mut stream: std::net::TcpStream = socket.into();
    stream.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let head = format!(
        "POST /greet HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    let chunk = vec![b' '; 1 << 20];
    let _ = stream.write_all(head.as_bytes());
    for _ in 0..sent / chunk.len() {
        if stream.write_all(&chunk).is_err() {
            break;
        }
    }
    stream
}

/// Issue 47, item 1: a public application's proxy (16 MiB bodies, no
/// token) took 14 to 589 MiB from 40 slow uploads. Bodies received and not
/// yet answered count against one budget per process, lowered here to
/// 32 MiB, of which one client address holds at most a quarter: 40 uploads
/// of 8 MiB of a declared 15 MiB from one address, then stalled, leave the
/// proxy within that budget, and it answers a client at another address.
#[test]
fn slow_uploads_to_a_public_application_leave_its_proxy_within_the_body_budget() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let budget = (32u64 << 20).to_string();
    start_head_with_env(temp.path(), "2", &[("RAYLET_HTTP_BODY_BUDGET_BYTES", &budget)]);
    let file = deploy_file(temp.path(), std::any::type_name::<Greeter>());
    let public = format!("{}public: true\n", std::fs::read_to_string(&file).unwrap());
    std::fs::write(&file, public).unwrap();
    let deployed = raylet(temp.path(), &["serve", "deploy", file.to_str().unwrap()]);
    let address = proxy_address(&deployed);
    let node = serve_status(temp.path())["proxies"][0]["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let proxy_pid = serve_actor_pid(temp.path(), &format!("proxy:{node}")).expect("the proxy runs");
    assert_eq!(
        greet(&address, "Content-Type: application/json\r\n"),
        200,
        "public: no token"
    );
    let before = resident_mib(proxy_pid);

    let uploads: Vec<std::net::TcpStream> = (0..40).map(|_| slow_upload(&address, 15 << 20, 8 << 20)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let during = resident_mib(proxy_pid);
    println!("proxy RSS {before} MiB before, {during} MiB with 40 slow 8 MiB uploads from one address (budget 32 MiB)");
    let answered = greet(&address, "Content-Type: application/json\r\n");
    assert_eq!(answered, 200, "the proxy answers others meanwhile");
    assert!(
        during.saturating_sub(before) < 32,
        "the proxy grew from {before} to {during} MiB"
    );
    drop(uploads);
}

/// The proxy's address that a deploy printed (`... RUNNING at http://ADDRESS/greet`).
pub fn proxy_address(deployed: &str) -> String {
    let url = deployed
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("the deploy prints the address: {deployed}"));
    url.trim_end_matches("/greet").to_string()
}

/// Starts a head with `cpus` CPUs under `temp`.
fn start_head(temp: &Path, cpus: &str) {
    start_head_with_env(temp, cpus, &[]);
}

/// [`start_head`] with `env` in the head's environment (and so its node's
/// and workers').
fn start_head_with_env(temp: &Path, cpus: &str, env: &[(&str, &str)]) {
    let started = Command::new(RAYLET)
        .args([
            "start",
            "--head",
            "--port",
            "0",
            "--dashboard-port",
            "0",
            "--num-cpus",
            cpus,
        ])
        .arg("--temp-dir")
        .arg(temp)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
}

/// Runs `raylet serve deploy FILE ARGS`; returns whether it succeeded and
/// everything it printed.
fn try_deploy(temp: &Path, file: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(RAYLET)
        .args(["serve", "deploy"])
        .arg(file)
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// Issue 47, item 11: 3 one-CPU replicas on a 2-CPU cluster. The one that
/// cannot fit is named with what it waits for, as the deploy goes on (the
/// deploy job's output), in `raylet serve status` (text and JSON), and in
/// the error when the wait ends.
#[test]
fn a_deploy_whose_replicas_cannot_fit_says_which_wait_and_for_what() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    start_head(temp.path(), "2");
    let file = deploy_file_with(temp.path(), std::any::type_name::<Greeter>(), 3, 1.0, 0);
    let began = Instant::now();
    let (deployed, said) = try_deploy(temp.path(), &file, &["--timeout", "15"]);
    println!("after {:.1} s the deploy said:\n{said}", began.elapsed().as_secs_f64());
    assert!(!deployed, "{said}");
    let waits = said
        .lines()
        .filter(|line| line.contains("replica:greet:greeter:") && line.contains("waits for {CPU: 1}"))
        .count();
    assert!(
        waits >= 2,
        "the deploy's log says which replica waits, and the error repeats it: {said}"
    );
    assert!(said.contains("not deployed within 15 s"), "{said}");

    let status = serve_status(temp.path());
    let replicas = status["apps"][0]["deployments"][0]["replicas"]
        .as_array()
        .unwrap()
        .clone();
    let waiting: Vec<&Value> = replicas.iter().filter(|r| r["waiting"] != "").collect();
    assert_eq!(waiting.len(), 1, "one replica waits: {status:#}");
    let why = waiting[0]["waiting"].as_str().unwrap();
    assert!(why.contains("{CPU: 1}") && why.contains("of 2"), "{why}");
    let table = raylet(temp.path(), &["serve", "status"]);
    println!("{table}");
    assert!(table.contains("Waiting:\n"), "{table}");
    let name = waiting[0]["name"].as_str().unwrap();
    assert!(
        table
            .lines()
            .any(|line| line.contains(name) && line.contains("waits for {CPU: 1}")),
        "{table}"
    );
    raylet(temp.path(), &["serve", "delete", "greet"]);
}

/// Issue 47, item 8: the proxy's port is taken. The deploy fails soon,
/// saying why; the controller tries again with growing delays (a few proxy
/// actors in 20 s, not one a second), `raylet serve status` says the proxy
/// is failing, and once the port is free the proxy starts and serves.
#[test]
fn a_proxy_that_cannot_bind_backs_off_is_reported_and_starts_once_the_port_is_free() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    start_head(temp.path(), "2");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let file = deploy_file_with(temp.path(), std::any::type_name::<Greeter>(), 1, 0.5, port);
    let began = Instant::now();
    let (deployed, said) = try_deploy(temp.path(), &file, &["--timeout", "60"]);
    let took = began.elapsed();
    println!("after {:.1} s the deploy said:\n{said}", took.as_secs_f64());
    assert!(!deployed, "{said}");
    assert!(said.contains("proxy") && said.contains("in use"), "says why: {said}");
    assert!(
        took < Duration::from_secs(45),
        "fails soon, not at the timeout: {took:?}"
    );

    std::thread::sleep(Duration::from_secs(20));
    let table = raylet(temp.path(), &["serve", "status"]);
    println!("{table}");
    assert!(
        table.contains("failed starts") && table.contains("next try in") && table.contains("in use"),
        "{table}"
    );
    let actors: Value = serde_json::from_str(&raylet(temp.path(), &["list", "actors", "--format", "json"])).unwrap();
    let proxies = actors
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["namespace"] == "serve" && a["name"].as_str().unwrap_or("").starts_with("proxy:"))
        .count();
    println!(
        "{proxies} proxy actors created in {:.0} s",
        began.elapsed().as_secs_f64()
    );
    assert!(proxies <= 8, "backed off: {proxies} proxy actors");

    drop(taken);
    let freed = Instant::now();
    let auth = format!(
        "Authorization: Bearer {}\r\nContent-Type: application/json\r\n",
        session_file(temp.path(), "token")
    );
    let address = format!("127.0.0.1:{port}");
    while greet(&address, &auth) != 200 {
        assert!(
            freed.elapsed() < Duration::from_secs(60),
            "the proxy did not start within 60 s of the port's release: {:#}",
            serve_status(temp.path())
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "the proxy serves {:.1} s after the port was freed",
        freed.elapsed().as_secs_f64()
    );
    let status = serve_status(temp.path());
    assert!(
        status["proxy_failures"].as_array().is_none_or(Vec::is_empty),
        "{status:#}"
    );
    raylet(temp.path(), &["serve", "delete", "greet"]);
}
