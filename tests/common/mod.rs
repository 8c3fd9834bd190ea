//! Helpers for tests that drive clusters of `raylet start` daemons: running
//! the CLI, stopping every daemon when a test ends, finding their pids.
//! Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

pub const RAYLET: &str = env!("CARGO_BIN_EXE_raylet");

/// Runs `raylet ARGS --temp-dir TEMP`, asserts that it succeeded, and
/// returns what it printed.
pub fn raylet(temp: &Path, args: &[&str]) -> String {
    let output = Command::new(RAYLET)
        .args(args)
        .arg("--temp-dir")
        .arg(temp)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "raylet {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Stops the test's daemons even when an assertion fails.
pub struct Daemons<'a>(pub &'a Path);

impl Drop for Daemons<'_> {
    fn drop(&mut self) {
        let _ = Command::new(RAYLET)
            .args(["stop", "--force", "--temp-dir"])
            .arg(self.0)
            .output();
    }
}

/// The process records of the latest session's daemons.
pub fn daemon_records(temp: &Path) -> Vec<Value> {
    std::fs::read_dir(temp.join("session_latest/processes"))
        .unwrap()
        .flatten()
        .map(|e| serde_json::from_str::<Value>(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .collect()
}

/// The pids of the latest session's daemons in `role` ("head" or "node").
pub fn daemon_pids(temp: &Path, role: &str) -> Vec<u32> {
    daemon_records(temp)
        .into_iter()
        .filter(|record| record["role"] == role)
        .map(|record| record["pid"].as_u64().unwrap() as u32)
        .collect()
}
