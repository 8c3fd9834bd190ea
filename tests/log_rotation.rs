//! Logs that rotate by size: a worker writing far past the limit leaves at
//! most the kept parts on disk, `raylet logs --follow` reads every line in
//! order across the rotations, `--tail` shows the newest lines, the
//! daemons' debug logs stay within the bound (their rotation is tested in
//! `raylet_common::output_capture`), and a bad setting stops `raylet start`
//! with its name.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{Daemons, head_address, raylet};
use raylet::Config;

/// The size at which the test's logs rotate.
const MAX_BYTES: u64 = 32 * 1024;
/// The older parts the test's logs keep.
const BACKUP_COUNT: u64 = 8;
/// Lines the chatty actor prints (about 370 KB): eleven rotations.
const LINES: u32 = 6_000;

#[raylet::actor]
pub struct Chatter {}

#[raylet::actor]
impl Chatter {
    pub fn new() -> Self {
        Chatter {}
    }

    /// Prints `lines` numbered lines, about 60 KB a second: the kept parts
    /// hold what 4.5 s print, so a follower reading every 200 ms keeps up.
    pub fn chatter(&self, lines: u32) -> u32 {
        for n in 0..lines {
            println!("{}", chatter_line(n));
            if n % 10 == 9 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        lines
    }

    /// The worker process's id.
    pub fn pid(&self) -> u32 {
        std::process::id()
    }
}

fn chatter_line(n: u32) -> String {
    format!("chatter line {n:06} ........................................")
}

fn raylet_with_rotation(temp: &Path, args: &[&str]) -> std::process::Output {
    Command::new(common::RAYLET)
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .env("RAYLET_ROTATION_MAX_BYTES", MAX_BYTES.to_string())
        .env("RAY_ROTATION_BACKUP_COUNT", BACKUP_COUNT.to_string())
        .env("RAYLET_LOG", "debug")
        .output()
        .unwrap()
}

/// Every file under `dir` whose name starts with `prefix` (not through
/// links, such as `session_latest`).
fn files_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(files_named(&path, prefix));
        } else if entry.file_name().to_string_lossy().starts_with(prefix) {
            found.push(path);
        }
    }
    found
}

fn bytes_on_disk(files: &[PathBuf]) -> u64 {
    files.iter().map(|file| std::fs::metadata(file).unwrap().len()).sum()
}

/// Kept parts plus the current one, and one line of slack.
const BOUND: u64 = (BACKUP_COUNT + 1) * MAX_BYTES + 4096;

#[test]
fn logs_rotate_within_their_bound_and_raylet_logs_follows_across_rotations() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let started = raylet_with_rotation(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "2"]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let head = head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let chatter = Chatter::remote(&cluster).spawn().unwrap();
    let pid = chatter.pid().get().unwrap();

    let mut follower = Command::new(common::RAYLET)
        .args(["logs", "--actor", &chatter.id().to_string(), "--follow", "--temp-dir"])
        .arg(temp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let last = chatter_line(LINES - 1);
    let mut stdout = follower.stdout.take().unwrap();
    let reading = std::thread::spawn(move || {
        let mut text = String::new();
        let mut chunk = [0u8; 64 * 1024];
        while let Ok(read @ 1..) = stdout.read(&mut chunk) {
            text.push_str(&String::from_utf8_lossy(&chunk[..read]));
            if text.contains(&last) {
                break;
            }
        }
        text
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(chatter.chatter(LINES).get().unwrap(), LINES);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reading.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    follower.kill().unwrap();
    let followed = reading.join().unwrap();
    let mut errors = String::new();
    follower.stderr.take().unwrap().read_to_string(&mut errors).unwrap();
    follower.wait().unwrap();
    let chatter_lines: Vec<&str> = followed.lines().filter(|line| line.starts_with("chatter")).collect();
    let expected: Vec<String> = (0..LINES).map(chatter_line).collect();
    assert!(!errors.contains("lines were lost"), "{errors}");
    assert_eq!(
        chatter_lines.len(),
        expected.len(),
        "the follower saw every line once: {errors}"
    );
    assert!(chatter_lines.iter().zip(&expected).all(|(seen, sent)| seen == sent));

    let worker_logs = files_named(temp.path(), "worker-")
        .into_iter()
        .filter(|file| file.to_string_lossy().contains(&format!("-{pid}.out")))
        .collect::<Vec<_>>();
    assert_eq!(worker_logs.len() as u64, BACKUP_COUNT + 1, "{worker_logs:?}");
    assert!(bytes_on_disk(&worker_logs) <= BOUND, "{worker_logs:?}");
    let tail = raylet(
        temp.path(),
        &["logs", "--actor", &chatter.id().to_string(), "--tail", "2"],
    );
    assert_eq!(
        tail,
        format!("{}\n{}\n", chatter_line(LINES - 2), chatter_line(LINES - 1))
    );

    for daemon in ["head.log", "head_node.log"] {
        let logs = files_named(temp.path(), daemon);
        assert!(!logs.is_empty() && bytes_on_disk(&logs) <= BOUND, "{logs:?}");
    }
    cluster.shutdown().unwrap();
}

#[test]
fn a_rotation_setting_that_is_not_a_number_stops_raylet_start_with_its_name() {
    let temp = tempfile::tempdir().unwrap();
    let output = Command::new(common::RAYLET)
        .args(["start", "--head", "--port", "0", "--temp-dir"])
        .arg(temp.path())
        .env("RAYLET_ROTATION_MAX_BYTES", "1GB")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("RAYLET_ROTATION_MAX_BYTES=\"1GB\" is not a whole number"),
        "{message}"
    );
    assert!(files_named(temp.path(), "head.log").is_empty(), "nothing started");
}
