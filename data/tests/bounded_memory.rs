//! Streaming keeps the driver's memory bounded: its peak RSS for 100,000
//! small files is within 1.5x of that for 10,000. Each run is a child
//! process (this test binary, running the ignored `memory_driver`) that
//! writes every file's parsed row to JSONL and prints its peak RSS.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Parsed, numbered_files};
use raylet_data::{Dataset, FileBytes, FileSet, register_map};

const INPUTS: &str = "RAYLET_DATA_MEMORY_INPUTS";

fn parse(file: FileBytes) -> Result<Parsed, String> {
    Parsed::from_file(file)
}
register_map!(parse);

/// The peak resident set of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
#[ignore = "the driver that the bounded-memory test runs in a child process"]
fn memory_driver() {
    let inputs = PathBuf::from(std::env::var(INPUTS).expect("run by the bounded-memory test"));
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let summary = Dataset::read_binary(FileSet::dir(&inputs))
        .files_per_block(64)
        .show_progress(false)
        .map(parse)
        .write_jsonl(inputs.with_extension("out"))
        .unwrap();
    println!("rows={} peak_rss_kib={}", summary.rows, peak_rss_kib());
}

/// Rows written and peak RSS of a driver over `inputs`.
fn run_driver(inputs: &Path) -> (u64, u64) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["memory_driver", "--exact", "--ignored", "--nocapture"])
        .env(INPUTS, inputs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("rows="))
        .expect("the driver's report");
    let value = |key: &str| -> u64 {
        let field = line.split_whitespace().find(|f| f.starts_with(key)).unwrap();
        field[key.len() + 1..].parse().unwrap()
    };
    (value("rows"), value("peak_rss_kib"))
}

#[test]
fn peak_driver_memory_for_100000_files_is_within_one_and_a_half_times_that_for_10000() {
    let small = tempfile::tempdir().unwrap();
    let large = tempfile::tempdir().unwrap();
    let small_inputs = numbered_files(small.path(), 10_000);
    let large_inputs = numbered_files(large.path(), 100_000);
    let (small_rows, small_rss) = run_driver(&small_inputs);
    let (large_rows, large_rss) = run_driver(&large_inputs);
    println!(
        "10,000 files: peak RSS {small_rss} KiB; 100,000 files: {large_rss} KiB ({:.2}x)",
        large_rss as f64 / small_rss as f64
    );
    assert_eq!((small_rows, large_rows), (10_000, 100_000));
    assert!(
        (large_rss as f64) <= 1.5 * small_rss as f64,
        "peak RSS grew from {small_rss} KiB to {large_rss} KiB with 10x the files"
    );
}
