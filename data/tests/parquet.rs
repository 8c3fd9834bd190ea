//! Parquet sources and sinks on real files and on a real S3-compatible
//! server: projection, filters with row-group skipping, Arrow batch
//! functions, typed rows read from columns, exactly-once outputs with a
//! worker killed mid-run, and clear errors for bad inputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_data::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use raylet_data::arrow::compute::kernels::numeric::mul;
use raylet_data::{Dataset, OnError, ParquetOptions, Predicate, register_arrow_fn};
use serde::{Deserialize, Serialize};

use raylet_storage::testing::S3Server;

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

/// A row of the test tables.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Reading {
    id: i64,
    x: f64,
}

/// The same row after `doubled`.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Doubled {
    id: i64,
    x: f64,
    doubled: f64,
}

/// Adds `doubled = x * 2`; the first time any worker sees id 5000, it
/// SIGKILLs itself (a marker in the folder the `tag` column names says so).
fn doubled(batch: RecordBatch) -> Result<RecordBatch, String> {
    let ids = batch.column_by_name("id").ok_or("no id column")?;
    let ids = ids.as_any().downcast_ref::<Int64Array>().ok_or("id is not Int64")?;
    if let Some(tag) = batch.column_by_name("tag")
        && ids.values().contains(&5000)
    {
        let tags = tag
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or("tag is not a string")?;
        let marker = Path::new(tags.value(0)).join("killed_once");
        if !marker.exists() {
            std::fs::write(&marker, std::process::id().to_string()).unwrap();
            kill(Pid::this(), Signal::SIGKILL).unwrap();
        }
    }
    let x = batch.column_by_name("x").ok_or("no x column")?;
    let doubled = mul(x, &Float64Array::new_scalar(2.0)).map_err(|e| e.to_string())?;
    let id = batch.column_by_name("id").expect("checked above").clone();
    RecordBatch::try_from_iter([("id", id), ("x", x.clone()), ("doubled", doubled)]).map_err(|e| e.to_string())
}
register_arrow_fn!(doubled);

/// Writes `files` Parquet files of `rows` rows each (ids counting up across
/// files, `x = id / 2`, `tag` the folder), in row groups of `group` rows.
fn write_tables(dir: &Path, files: i64, rows: i64, group: usize, tag: &Path) {
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    std::fs::create_dir_all(dir).unwrap();
    for file in 0..files {
        let ids: Vec<i64> = (file * rows..(file + 1) * rows).collect();
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
            (
                "x",
                Arc::new(Float64Array::from_iter_values(ids.iter().map(|id| *id as f64 / 2.0))) as ArrayRef,
            ),
            (
                "tag",
                Arc::new(StringArray::from(vec![tag.to_string_lossy().into_owned(); ids.len()])) as ArrayRef,
            ),
        ])
        .unwrap();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .build();
        let out = std::fs::File::create(dir.join(format!("part_{file}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(out, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
}

fn ids_of<T>(rows: &[T], id: impl Fn(&T) -> i64) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for row in rows {
        *counts.entry(id(row)).or_default() += 1;
    }
    counts
}

#[test]
fn parquet_reads_columns_and_matching_rows_and_writes_through_arrow_functions() {
    init();
    let temp = tempfile::tempdir().unwrap();
    write_tables(&temp.path().join("in"), 3, 4000, 1000, temp.path());
    let options = ParquetOptions::default()
        .columns(["id", "x"])
        .filter(Predicate::ge("id", 9500_i64));
    let readings: Vec<Reading> = Dataset::read_parquet_with(temp.path().join("in").to_str().unwrap(), options)
        .show_progress(false)
        .rows::<Reading>()
        .take_all()
        .unwrap();
    let counts = ids_of(&readings, |r| r.id);
    assert_eq!(counts.len(), 2500, "ids 9500..12000");
    assert!(counts.keys().copied().eq(9500..12000) && counts.values().all(|c| *c == 1));
    assert!(readings.iter().all(|r| r.x == r.id as f64 / 2.0));

    let batches = Dataset::read_parquet(temp.path().join("in").to_str().unwrap())
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 12_000);
    assert_eq!(
        batches[0].schema().fields().len(),
        3,
        "every column without a projection"
    );

    let out = temp.path().join("out");
    let summary = Dataset::read_parquet(temp.path().join("in").to_str().unwrap())
        .show_progress(false)
        .map_batches(doubled, 700)
        .write_parquet(&out)
        .unwrap();
    assert_eq!(summary.rows, 12_000);
    assert_eq!(summary.files.len(), summary.blocks_written);
    let written: Vec<Doubled> = Dataset::read_parquet(out.to_str().unwrap())
        .show_progress(false)
        .rows::<Doubled>()
        .take_all()
        .unwrap();
    let counts = ids_of(&written, |r| r.id);
    assert!(counts.keys().copied().eq(0..12_000) && counts.values().all(|c| *c == 1));
    assert!(written.iter().all(|r| r.doubled == r.x * 2.0));
    let again = Dataset::read_parquet(temp.path().join("in").to_str().unwrap())
        .show_progress(false)
        .map_batches(doubled, 700)
        .write_parquet(&out)
        .unwrap();
    assert_eq!(
        (again.blocks_written, again.blocks_skipped),
        (0, summary.blocks_written)
    );
}

#[test]
fn bad_parquet_inputs_fail_naming_them_or_are_skipped_and_listed() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let input = temp.path().join("in");
    write_tables(&input, 2, 100, 50, temp.path());
    std::fs::write(input.join("part_9_corrupt.parquet"), b"PAR1 this is not a parquet file").unwrap();
    let dataset = || Dataset::read_parquet(input.to_str().unwrap()).show_progress(false);
    let error = dataset().take_all().unwrap_err().to_string();
    assert!(
        error.contains("part_9_corrupt.parquet") && error.contains("not a readable Parquet file"),
        "{error}"
    );

    let summary = dataset()
        .on_error(OnError::Skip)
        .write_parquet(temp.path().join("skipped"))
        .unwrap();
    assert_eq!(summary.rows, 200);
    assert_eq!(summary.errors.len(), 1);
    assert!(
        summary.errors[0].source.contains("part_9_corrupt.parquet"),
        "{:?}",
        summary.errors
    );

    std::fs::remove_file(input.join("part_9_corrupt.parquet")).unwrap();
    let missing = ParquetOptions::default().columns(["id", "height"]);
    let error = Dataset::read_parquet_with(input.to_str().unwrap(), missing)
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no column height") && error.contains("id, x, tag"),
        "{error}"
    );
    let error = Dataset::read_parquet(temp.path().join("nothing_here").to_str().unwrap())
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(error.contains("nothing_here"), "{error}");
}

#[test]
fn a_parquet_dataset_in_a_bucket_is_written_back_exactly_once_with_a_worker_killed() {
    let server = S3Server::start();
    init();
    server.create_bucket("lake");
    let temp = tempfile::tempdir().unwrap();
    write_tables(&temp.path().join("in"), 4, 2500, 500, temp.path());
    let uploaded = Dataset::read_parquet(temp.path().join("in").to_str().unwrap())
        .storage_options(server.options())
        .show_progress(false)
        .write_parquet("s3://lake/readings")
        .unwrap();
    assert_eq!(uploaded.rows, 10_000);

    let summary = Dataset::read_parquet("s3://lake/readings")
        .storage_options(server.options())
        .show_progress(false)
        .max_blocks_in_flight(2)
        .map_batches(doubled, 256)
        .write_parquet("s3://lake/predictions")
        .unwrap();
    assert!(
        temp.path().join("killed_once").exists(),
        "a worker killed itself mid-run"
    );
    assert_eq!(summary.rows, 10_000);
    let written: Vec<Doubled> = Dataset::read_parquet("s3://lake/predictions")
        .storage_options(server.options())
        .show_progress(false)
        .rows::<Doubled>()
        .take_all()
        .unwrap();
    let counts = ids_of(&written, |r| r.id);
    assert!(
        counts.keys().copied().eq(0..10_000) && counts.values().all(|c| *c == 1),
        "every id once in the bucket"
    );
    let objects = server.objects("lake", "predictions");
    let parquet_files = objects.iter().filter(|name| name.ends_with(".parquet")).count();
    assert_eq!(parquet_files, summary.blocks_written, "{objects:?}");
    assert!(
        objects.iter().any(|name| name == "_manifest/dataset.json"),
        "{objects:?}"
    );

    let error = Dataset::read_parquet("s3://no-such-bucket/x")
        .storage_options(server.options())
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(error.contains("s3://no-such-bucket/x"), "{error}");
}
