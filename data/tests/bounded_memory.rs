//! Streaming keeps memory bounded: the driver's peak RSS for 100,000 small
//! files is within 1.5x of that for 10,000, and a Parquet pipeline's
//! driver and workers hold as much at 40x the in-flight budget
//! (`max_blocks_in_flight` x block bytes) as at 10x, each block's rows
//! counted at every step. Each run is a child process (this test binary,
//! running an ignored driver) that prints its figures.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Parsed, numbered_files};
use std::sync::Arc;

use raylet_data::arrow::array::{ArrayRef, Float64Array, RecordBatch};
use raylet_data::{Dataset, FileBytes, FileSet, register_arrow_fn, register_map};

const INPUTS: &str = "RAYLET_DATA_MEMORY_INPUTS";
/// Rows of a row group (and so of a block) of the Parquet runs: 8 Float64
/// columns of 32,768 rows, 2 MiB.
const GROUP_ROWS: usize = 32_768;
const BLOCK_BYTES: u64 = 2 << 20;
const BLOCKS_IN_FLIGHT: usize = 2;

fn parse(file: FileBytes) -> Result<Parsed, String> {
    Parsed::from_file(file)
}
register_map!(parse);

/// The peak resident set of process `pid` (`self` for this one), in KiB.
fn peak_rss_kib_of(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmHWM:"));
    line.map_or(0, |l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
}

fn peak_rss_kib() -> u64 {
    peak_rss_kib_of("self")
}

/// The largest peak resident set among this process's children (its
/// cluster's workers), in KiB.
fn workers_peak_rss_kib() -> u64 {
    let me = std::process::id().to_string();
    let parent_of = |pid: &str| -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(") ").next()?.split_whitespace().nth(1).map(str::to_string)
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .filter(|pid| pid.parse::<u32>().is_ok() && parent_of(pid).as_deref() == Some(me.as_str()))
        .map(|pid| peak_rss_kib_of(&pid))
        .max()
        .unwrap_or(0)
}

/// Each row's columns, halved.
fn halved(batch: RecordBatch) -> Result<RecordBatch, String> {
    let halve = |column: &ArrayRef| -> ArrayRef {
        let values = column.as_any().downcast_ref::<Float64Array>().unwrap();
        Arc::new(values.unary::<_, raylet_data::arrow::datatypes::Float64Type>(|v| v / 2.0))
    };
    let columns: Vec<ArrayRef> = batch.columns().iter().map(halve).collect();
    RecordBatch::try_new(batch.schema(), columns).map_err(|e| e.to_string())
}
register_arrow_fn!(halved);

#[test]
#[ignore = "the driver that the Parquet bounded-memory test runs in a child process"]
fn parquet_memory_driver() {
    let inputs = PathBuf::from(std::env::var(INPUTS).expect("run by the bounded-memory test"));
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let summary = Dataset::read_parquet(inputs.to_str().unwrap())
        .block_bytes(BLOCK_BYTES)
        .max_blocks_in_flight(BLOCKS_IN_FLIGHT)
        .show_progress(false)
        .map_batches(halved, 8192)
        .write_parquet(inputs.with_extension("out"))
        .unwrap();
    let held = summary.memory.iter().map(|m| m.peak_block_bytes).max().unwrap_or(0);
    println!(
        "rows={} peak_rss_kib={} workers_peak_rss_kib={} block_held_kib={}",
        summary.rows,
        peak_rss_kib(),
        workers_peak_rss_kib(),
        held / 1024
    );
}

/// `groups` row groups of 8 Float64 columns in Parquet files under `dir`.
fn parquet_inputs(dir: &Path, groups: usize) -> PathBuf {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    let inputs = dir.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let properties = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .build();
    for file in 0..groups.div_ceil(10) {
        let out = std::fs::File::create(inputs.join(format!("part_{file}.parquet"))).unwrap();
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        for group in (file * 10..groups).take(10) {
            let columns = (0..8).map(|c| {
                let values = (0..GROUP_ROWS).map(|r| (group * GROUP_ROWS + r) as f64 + c as f64);
                (
                    format!("c{c}"),
                    Arc::new(Float64Array::from_iter_values(values)) as ArrayRef,
                )
            });
            let batch = RecordBatch::try_from_iter(columns).unwrap();
            let writer = writer.get_or_insert_with(|| {
                ArrowWriter::try_new(out.try_clone().unwrap(), batch.schema(), Some(properties.clone())).unwrap()
            });
            writer.write(&batch).unwrap();
        }
        writer.unwrap().close().unwrap();
    }
    inputs
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
    let report = driver_report("bounded_memory::memory_driver", inputs);
    (report("rows"), report("peak_rss_kib"))
}

/// The figures the driver `name` printed after its run over `inputs`.
fn driver_report(name: &str, inputs: &Path) -> impl Fn(&str) -> u64 + use<> {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--ignored", "--nocapture"])
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
    let line = line.to_string();
    move |key: &str| -> u64 {
        let field = line
            .split_whitespace()
            .find(|f| f.starts_with(&format!("{key}=")))
            .unwrap();
        field[key.len() + 1..].parse().unwrap()
    }
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

#[test]
fn a_parquet_pipeline_holds_as_much_at_40_times_its_in_flight_budget_as_at_10_times() {
    let budget_groups = BLOCKS_IN_FLIGHT;
    let (small, large) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let small_report = driver_report(
        "bounded_memory::parquet_memory_driver",
        &parquet_inputs(small.path(), 10 * budget_groups),
    );
    let large_report = driver_report(
        "bounded_memory::parquet_memory_driver",
        &parquet_inputs(large.path(), 40 * budget_groups),
    );
    for key in ["peak_rss_kib", "workers_peak_rss_kib"] {
        let (at_10, at_40) = (small_report(key), large_report(key));
        println!("{key}: {at_10} KiB at 10x the budget, {at_40} KiB at 40x");
        assert!(
            at_40 as f64 <= 1.25 * at_10 as f64 + 16.0 * 1024.0,
            "{key} grew from {at_10} KiB to {at_40} KiB with 4x the data"
        );
    }
    assert_eq!(large_report("rows"), (40 * budget_groups * GROUP_ROWS) as u64);
    let held = large_report("block_held_kib");
    println!(
        "a block's rows took at most {held} KiB at a step (blocks of {} KiB)",
        BLOCK_BYTES / 1024
    );
    assert!(
        held * 1024 <= 2 * BLOCK_BYTES && held * 1024 >= BLOCK_BYTES / 2,
        "{held} KiB counted"
    );
}
