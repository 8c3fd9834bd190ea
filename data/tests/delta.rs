//! `read_delta` over Delta Lake tables that delta-rs wrote
//! (`fixtures/make_delta_tables.py`): the current version through a
//! checkpoint and the commits after it (a delete's removed file, still on
//! disk, is not read), the same from the JSON commits alone, in an S3
//! bucket too, with a projection and a filter; and tables it would read
//! wrong (deletion vectors, partitions, a gap in the log) or that are not
//! tables are refused, naming why.

use std::path::{Path, PathBuf};

use raylet_data::arrow::array::Int64Array;
use raylet_data::{Dataset, ParquetOptions, Predicate, RecordBatch};
use raylet_storage::Storage;
use raylet_storage::testing::S3Server;

/// The ids the fixture table's current version holds.
fn current_ids() -> Vec<i64> {
    (0..1500).chain(2000..2100).collect()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/delta")
        .join(name)
}

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|batch| {
            let column = batch.column_by_name("id").unwrap();
            column.as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()
        })
        .collect();
    ids.sort();
    ids
}

fn read(location: &str) -> Result<Vec<RecordBatch>, raylet_data::DataError> {
    Dataset::read_delta(location, ParquetOptions::default())
        .show_progress(false)
        .take_all()
}

fn refusal(location: &Path) -> String {
    read(location.to_str().unwrap()).unwrap_err().to_string()
}

/// A copy of the fixture table in `dir`, without its checkpoint.
fn copy_without_checkpoint(dir: &Path) -> PathBuf {
    let copy = dir.join("table");
    for (name, bytes) in files_under(&fixture("table")) {
        if name.contains(".checkpoint.") || name.ends_with("_last_checkpoint") {
            continue;
        }
        let path = copy.join(&name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    copy
}

/// Every file under `dir`, by its path relative to it.
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => folders.push(path),
                false => {
                    let name = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                    files.push((name, std::fs::read(&path).unwrap()));
                }
            }
        }
    }
    files
}

#[test]
fn a_table_is_read_at_its_current_version_through_its_checkpoint_and_the_commits_after_it() {
    init();
    let table = fixture("table");
    let location = table.to_str().unwrap();
    assert_eq!(ids(&read(location).unwrap()), current_ids());
    assert_eq!(ids(&read(&format!("file://{location}")).unwrap()), current_ids());

    let some = ParquetOptions::default()
        .columns(["id"])
        .filter(Predicate::lt("id", 10_i64));
    let few = Dataset::read_delta(location, some)
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(ids(&few), (0..10).collect::<Vec<_>>());
    assert_eq!(few[0].num_columns(), 1);
}

#[test]
fn the_json_commits_alone_give_the_same_rows_and_a_gap_in_them_is_refused() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let table = copy_without_checkpoint(temp.path());
    assert_eq!(ids(&read(table.to_str().unwrap()).unwrap()), current_ids());

    std::fs::remove_file(table.join("_delta_log/00000000000000000001.json")).unwrap();
    let error = refusal(&table);
    assert!(error.contains("commit 2 follows 0") && error.contains("gap"), "{error}");
}

#[test]
fn tables_it_would_read_wrong_and_folders_that_are_not_tables_are_refused_naming_why() {
    init();
    let error = refusal(&fixture("partitioned"));
    assert!(error.contains("partitioned") && error.contains("\"part\""), "{error}");

    let temp = tempfile::tempdir().unwrap();
    let table = copy_without_checkpoint(temp.path());
    let protocol = r#"{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],"writerFeatures":["deletionVectors"]}}"#;
    std::fs::write(table.join("_delta_log/00000000000000000004.json"), protocol).unwrap();
    let error = refusal(&table);
    assert!(error.contains("deletionVectors"), "{error}");

    let error = refusal(temp.path());
    assert!(
        error.contains("reading the Delta table") && error.contains("is not a Delta table"),
        "{error}"
    );
}

#[test]
fn a_table_in_a_bucket_reads_as_it_does_on_disk() {
    let server = S3Server::start();
    init();
    server.create_bucket("lake");
    let bucket = Storage::open("s3://lake/table", &server.options()).unwrap();
    for (name, bytes) in files_under(&fixture("table")) {
        bucket.write(&name, bytes.into()).unwrap();
    }
    let rows = Dataset::read_delta("s3://lake/table", ParquetOptions::default())
        .storage_options(server.options())
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(ids(&rows), current_ids());
}
