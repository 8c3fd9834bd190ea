//! A real S3-compatible server for tests (feature `testing`): `s3s-fs`
//! (installed by tools/test.sh with `cargo install s3s-fs`), started on a free
//! loopback port over a temporary directory, one bucket per folder, and
//! killed on drop.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::StorageOptions;

const ACCESS_KEY: &str = "raylet-test";
const SECRET_KEY: &str = "raylet-test-secret";
/// The s3s-fs that tools/test.sh installs (later ones need a newer Rust).
pub const S3S_FS_VERSION: &str = "0.14.1";
/// How many ports a server tries: a port chosen free can be taken by
/// another test before the server binds it.
const PORT_ATTEMPTS: usize = 5;

/// A running `s3s-fs` and the directory it serves.
pub struct S3Server {
    process: Child,
    root: tempfile::TempDir,
    port: u16,
}

/// The `s3s-fs` binary: on the PATH or in cargo's bin directory.
fn s3s_fs() -> Option<PathBuf> {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .map(|home| home.join("bin/s3s-fs"));
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("s3s-fs"))
        .chain(cargo_bin)
        .find(|path| path.is_file())
}

impl S3Server {
    /// Starts the server. Panics, saying how to install it, where
    /// `s3s-fs` is not installed (tools/test.sh installs it).
    pub fn start() -> S3Server {
        let binary = s3s_fs().unwrap_or_else(|| {
            panic!(
                "no s3s-fs on the PATH or in cargo's bin directory: tools/test.sh installs it \
                 (cargo install s3s-fs --version {S3S_FS_VERSION} --features binary --locked)"
            )
        });
        for _ in 0..PORT_ATTEMPTS {
            if let Some(server) = S3Server::spawn(&binary) {
                return server;
            }
        }
        panic!("s3s-fs exited before listening {PORT_ATTEMPTS} times in a row (its port taken each time?)");
    }

    /// Spawns `s3s-fs` on a port that was free a moment ago and waits
    /// until it listens; `None` if it exited first, as it does when
    /// another process took the port before it bound it.
    fn spawn(binary: &Path) -> Option<S3Server> {
        let root = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let process = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs starts");
        let mut server = S3Server { process, root, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(_)) = server.process.try_wait() {
                return None;
            }
            assert!(Instant::now() < deadline, "s3s-fs did not listen in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// Makes an empty bucket (a folder of the served directory).
    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir_all(self.root.path().join(name)).unwrap();
    }

    /// The settings that reach this server.
    pub fn options(&self) -> StorageOptions {
        StorageOptions::new()
            .with("aws_endpoint", format!("http://127.0.0.1:{}", self.port))
            .with("aws_access_key_id", ACCESS_KEY)
            .with("aws_secret_access_key", SECRET_KEY)
            .with("aws_region", "us-east-1")
            .with("aws_allow_http", "true")
    }

    /// The same settings as environment variables (`AWS_ENDPOINT`, …), for
    /// a process that reads them, such as `raylet start --spill-to`.
    pub fn env(&self) -> Vec<(String, String)> {
        let options = self.options();
        options
            .entries()
            .map(|(key, value)| (key.to_ascii_uppercase(), value.to_string()))
            .collect()
    }

    /// The objects under `bucket/prefix`, as names relative to it.
    pub fn objects(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let dir = self.root.path().join(bucket).join(prefix);
        let mut names = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(folder) = stack.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                match entry.file_type().unwrap().is_dir() {
                    true => stack.push(entry.path()),
                    false => names.push(entry.path().strip_prefix(&dir).unwrap().to_string_lossy().into_owned()),
                }
            }
        }
        names.sort();
        names
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
