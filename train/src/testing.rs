//! A real MLflow tracking server for tests (feature `testing`): `mlflow
//! server` from the venv that tools/test.sh makes (`target/mlflow-venv`, or the
//! one `RAYLET_MLFLOW_VENV` names), on a free loopback port, with a SQLite
//! store and served artifacts in a temporary directory, in a process group
//! of its own that is killed on drop. [`MlflowServer::runs`] reads an
//! experiment's runs back through MLflow's own Python client, and
//! [`warnings_of`] catches the warnings a tracker logs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;

/// The MLflow that tools/test.sh installs.
pub const MLFLOW_VERSION: &str = "3.17.2";
/// The variable that names another venv with MLflow in it.
pub const VENV_VARIABLE: &str = "RAYLET_MLFLOW_VENV";
/// How long the server may take to answer `/health` (it starts in about
/// 20 s on a busy 2-core machine).
const STARTUP: Duration = Duration::from_secs(150);
/// How many ports a server tries before giving up: a port chosen free can
/// be taken by another test before the server binds it.
const PORT_ATTEMPTS: usize = 5;

/// How a server's start ended, short of a panic.
#[derive(Debug, PartialEq, Eq)]
enum Startup {
    Healthy,
    PortTaken,
}

/// A running `mlflow server` and its directory.
pub struct MlflowServer {
    process: Child,
    root: tempfile::TempDir,
    port: u16,
    venv: PathBuf,
    killed: bool,
}

/// A run as MLflow's Python client reads it back.
#[derive(Clone, Debug, Deserialize)]
pub struct TrackedRun {
    pub run_id: String,
    pub run_name: String,
    /// `RUNNING`, `FINISHED`, `FAILED` or `KILLED`.
    pub status: String,
    pub params: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    /// Each metric's whole history: `(step, value)` by step.
    pub metrics: BTreeMap<String, Vec<(u64, f64)>>,
    /// Every artifact file's path, with its size in bytes.
    pub artifacts: BTreeMap<String, u64>,
}

/// Dumps every run of an experiment as JSON, with MLflow's client.
const READ_RUNS: &str = r#"
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
experiment = client.get_experiment_by_name(sys.argv[2])
def files(run_id, path=None):
    found = []
    for item in client.list_artifacts(run_id, path):
        found.extend(files(run_id, item.path) if item.is_dir else [(item.path, item.file_size)])
    return found
def history(run_id, key):
    return sorted([m.step, m.value] for m in client.get_metric_history(run_id, key))
runs = [] if experiment is None else client.search_runs([experiment.experiment_id], max_results=1000)
print(json.dumps([{
    "run_id": run.info.run_id,
    "run_name": run.info.run_name,
    "status": run.info.status,
    "params": run.data.params,
    "tags": run.data.tags,
    "metrics": {key: history(run.info.run_id, key) for key in run.data.metrics},
    "artifacts": dict(files(run.info.run_id)),
} for run in runs]))
"#;

/// The venv with MLflow: `RAYLET_MLFLOW_VENV`, else the workspace's
/// `target/mlflow-venv`.
pub fn mlflow_venv() -> PathBuf {
    std::env::var_os(VENV_VARIABLE)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mlflow-venv"))
}

impl MlflowServer {
    /// Starts the server and waits until it is healthy. Panics, saying how
    /// to install it, where the venv has no MLflow.
    pub fn start() -> MlflowServer {
        let venv = mlflow_venv();
        let mlflow = venv.join("bin/mlflow");
        assert!(
            mlflow.is_file(),
            "no MLflow at {}: make its venv with tools/test.sh (python3 -m venv target/mlflow-venv && \
             target/mlflow-venv/bin/pip install mlflow=={MLFLOW_VERSION}), or set {VENV_VARIABLE} to a venv with it",
            mlflow.display()
        );
        for _ in 0..PORT_ATTEMPTS {
            let mut server = MlflowServer::spawn(venv.clone(), free_port());
            if server.wait_until_healthy() == Startup::Healthy {
                return server;
            }
        }
        panic!("mlflow server found its port taken {PORT_ATTEMPTS} times in a row");
    }

    /// Spawns `mlflow server` from `venv` on `port`, with its store and log
    /// in a new temporary directory.
    fn spawn(venv: PathBuf, port: u16) -> MlflowServer {
        let mlflow = venv.join("bin/mlflow");
        let root = tempfile::tempdir().expect("a temporary directory");
        let log = std::fs::File::create(root.path().join("server.log")).expect("the server's log file");
        let process = Command::new(&mlflow)
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", root.path().join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(root.path().join("artifacts"))
            .current_dir(root.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file, twice"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} did not start: {e}", mlflow.display()));
        MlflowServer {
            process,
            root,
            port,
            venv,
            killed: false,
        }
    }

    /// Waits for `/health` to answer. A server that exits because another
    /// process took its port in the moment between choosing the port and
    /// binding it is [`Startup::PortTaken`]; any other exit, or no answer
    /// in [`STARTUP`], panics with the server's log.
    fn wait_until_healthy(&mut self) -> Startup {
        let deadline = Instant::now() + STARTUP;
        while !healthy(self.port) {
            if let Ok(Some(status)) = self.process.try_wait() {
                let log = self.log();
                if log.contains("address already in use") {
                    return Startup::PortTaken;
                }
                panic!("mlflow server exited ({status}): {log}");
            }
            assert!(
                Instant::now() < deadline,
                "mlflow server was not healthy in {STARTUP:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        Startup::Healthy
    }

    /// The tracking URI: `http://127.0.0.1:<port>`.
    pub fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the server and every process it started, at once (SIGKILL).
    pub fn kill(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        let _ = killpg(Pid::from_raw(self.process.id() as i32), Signal::SIGKILL);
        let _ = self.process.wait();
    }

    /// Every run of experiment `name` (none if there is no such
    /// experiment), read with MLflow's Python client.
    pub fn runs(&self, experiment: &str) -> Vec<TrackedRun> {
        let output = Command::new(self.venv.join("bin/python"))
            .args(["-c", READ_RUNS, &self.uri(), experiment])
            .output()
            .expect("the venv's python starts");
        assert!(
            output.status.success(),
            "reading the runs back failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "the runs read back are not JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// The end of the server's log.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.root.path().join("server.log")).unwrap_or_default();
        let start = log.len().saturating_sub(4000);
        log[log.ceil_char_boundary(start)..].to_string()
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Whether the server on `port` answers `GET /health` with 200.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut answer = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.split_whitespace().nth(1) == Some("200")
}

/// Runs `run` and returns what it logged at `WARN` or above on this
/// thread, as text.
pub fn warnings_of<T>(run: impl FnOnce() -> T) -> (T, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let value = tracing::subscriber::with_default(subscriber, run);
    let text = captured.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    (value, String::from_utf8_lossy(&text).into_owned())
}

/// Log lines kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
