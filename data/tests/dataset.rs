//! Datasets end to end on the embedded cluster: blocks run in tasks on
//! worker processes (this test binary), and outputs are checked row by row
//! for inputs lost or repeated, also when a worker is SIGKILLed, a driver is
//! killed and rerun, or an input is corrupt.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use common::{Parsed, assert_each_once, assert_retried_elsewhere, numbered_files, output_rows};
use raylet_data::{
    DataError, Dataset, FileBytes, FileSet, OnError, TextLine, register_batch_fn, register_filter, register_flat_map,
    register_map,
};

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

fn double(x: u64) -> Result<u64, String> {
    Ok(x * 2)
}
register_map!(double);

fn multiple_of_three(x: &u64) -> bool {
    x.is_multiple_of(3)
}
register_filter!(multiple_of_three);

fn with_successor(x: u64) -> Result<Vec<u64>, String> {
    Ok(vec![x, x + 1])
}
register_flat_map!(with_successor);

/// Parses a batch of files that each hold a number.
fn parse_numbers(files: Vec<FileBytes>) -> Result<Vec<Parsed>, String> {
    files.into_iter().map(Parsed::from_file).collect()
}
register_batch_fn!(parse_numbers);

/// Parses one file; the first time any worker sees file 0500, it SIGKILLs
/// itself (a marker file beside the inputs says it did).
fn parse_or_die_once(file: FileBytes) -> Result<Parsed, String> {
    let path = Path::new(&file.path);
    let marker = path.parent().unwrap().parent().unwrap().join("killed_once");
    if path.ends_with("0500.txt") && !marker.exists() {
        std::fs::write(&marker, std::process::id().to_string()).unwrap();
        kill(Pid::this(), Signal::SIGKILL).unwrap();
    }
    Parsed::from_file(file)
}
register_map!(parse_or_die_once);

/// Parses one file slowly, so that a driver can be killed mid-run.
fn parse_slowly(file: FileBytes) -> Result<Parsed, String> {
    std::thread::sleep(Duration::from_millis(20));
    Parsed::from_file(file)
}
register_map!(parse_slowly);

fn line_length(line: TextLine) -> Result<(String, u64, usize), String> {
    Ok((line.path, line.line, line.text.len()))
}
register_map!(line_length);

/// A file's number doubled, as a file `doubled/NNNN.txt`; `0003.txt` gets
/// the name in the file `bad_name` beside the inputs' directory, if any.
fn doubled_file(file: FileBytes) -> Result<FileBytes, String> {
    let path = Path::new(&file.path);
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let number: u64 = String::from_utf8_lossy(&file.bytes)
        .trim()
        .parse()
        .map_err(|e| format!("{e}"))?;
    let bad_name = std::fs::read_to_string(path.parent().unwrap().parent().unwrap().join("bad_name"));
    let path = match bad_name {
        Ok(bad) if name == "0003.txt" => bad,
        _ => format!("doubled/{name}"),
    };
    Ok(FileBytes {
        path,
        bytes: (number * 2).to_string().into_bytes(),
    })
}
register_map!(doubled_file);

fn unregistered(x: u64) -> Result<u64, String> {
    Ok(x)
}

#[test]
fn transforms_run_in_the_blocks_tasks_and_every_item_comes_back_once() {
    init();
    let mut rows = Dataset::from_items((0..10_000u64).collect())
        .items_per_block(700)
        .show_progress(false)
        .map(double)
        .filter(multiple_of_three)
        .flat_map(with_successor)
        .take_all()
        .unwrap();
    rows.sort();
    let expected: Vec<u64> = (0..10_000u64)
        .map(|x| x * 2)
        .filter(|x| x.is_multiple_of(3))
        .flat_map(|x| [x, x + 1])
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn ten_thousand_files_through_map_batches_appear_exactly_once_in_the_output() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 10_000);
    let out = root.path().join("out");
    let summary = Dataset::read_binary(FileSet::glob(&format!("{}/*.txt", inputs.display())))
        .files_per_block(64)
        .show_progress(false)
        .map_batches(parse_numbers, 16)
        .write_jsonl(&out)
        .unwrap();
    let rows: Vec<Parsed> = output_rows(&out);
    assert_each_once(&rows, 10_000);
    for row in &rows {
        assert_eq!(
            row.path,
            inputs.join(format!("{:04}.txt", row.number)).to_string_lossy()
        );
    }
    assert_eq!(
        (summary.rows, summary.blocks_written, summary.blocks_skipped),
        (10_000, 157, 0)
    );
    assert_eq!(summary.files.len(), 157, "one output file per block of 64 files");
    let workers: std::collections::BTreeSet<u32> = rows.iter().map(|r| r.worker).collect();
    assert!(!workers.contains(&std::process::id()), "no block ran in the driver");
}

#[test]
fn a_worker_killed_mid_run_is_retried_and_every_input_still_appears_once() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 1_000);
    let out = root.path().join("out");
    let summary = Dataset::read_binary(FileSet::dir(&inputs))
        .show_progress(false)
        .map(parse_or_die_once)
        .write_jsonl(&out)
        .unwrap();
    assert_retried_elsewhere(root.path(), &out, 1_000, 500);
    assert_eq!(summary.rows, 1_000);
}

const DRIVER_DIR: &str = "RAYLET_DATA_TEST_DIR";

fn slow_dataset(root: &Path) -> Dataset<Parsed> {
    Dataset::read_binary(FileSet::dir(root.join("inputs")))
        .files_per_block(8)
        .max_blocks_in_flight(2)
        .show_progress(false)
        .map(parse_slowly)
}

/// The driver that the resume test runs in a child process and kills.
#[test]
#[ignore = "the driver that a_killed_driver_rerun_skips_written_blocks runs in a child process and kills"]
fn interrupted_driver() {
    let root = PathBuf::from(std::env::var(DRIVER_DIR).expect("run by the resume test"));
    init();
    slow_dataset(&root).write_jsonl(root.join("out")).unwrap();
}

#[test]
fn a_killed_driver_rerun_skips_written_blocks_and_completes_the_output() {
    let root = tempfile::tempdir().unwrap();
    numbered_files(root.path(), 400);
    let out = root.path().join("out");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["dataset::interrupted_driver", "--exact", "--ignored", "--nocapture"])
        .env(DRIVER_DIR, root.path())
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::manifest_blocks(&out) < 5 {
        assert!(Instant::now() < deadline, "the child wrote no 5 blocks in 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the child driver exited early");
        std::thread::sleep(Duration::from_millis(10));
    }
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    // The blocks the manifest lists: a block's file may be in place and not
    // yet listed when the kill comes, and then it is written again.
    let written_before: BTreeMap<PathBuf, Vec<u8>> = std::fs::read_dir(out.join("_manifest"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let block = name.strip_prefix("block_")?.strip_suffix(".json")?.to_string();
            Some(out.join(format!("block_{block}.jsonl")))
        })
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    assert!(
        written_before.len() < 50,
        "killed too late: {} of 50 blocks written",
        written_before.len()
    );

    init();
    let summary = slow_dataset(root.path()).write_jsonl(&out).unwrap();
    println!(
        "{} blocks written before the kill; the rerun: {summary:?}",
        written_before.len()
    );
    assert!(summary.blocks_skipped >= 5, "{summary:?}");
    assert_eq!(summary.blocks_skipped + summary.blocks_written, 50);
    let rows: Vec<Parsed> = output_rows(&out);
    assert_each_once(&rows, 400);
    for (path, bytes) in written_before {
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{} was written again",
            path.display()
        );
    }
}

#[test]
fn a_corrupt_file_fails_the_run_naming_it_or_is_skipped_and_recorded() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = root.path().join("text");
    std::fs::create_dir_all(&inputs).unwrap();
    for n in 0..20 {
        std::fs::write(
            inputs.join(format!("{n:02}.txt")),
            format!("line one of {n}\nline two\n"),
        )
        .unwrap();
    }
    let corrupt = inputs.join("07.txt");
    std::fs::File::create(&corrupt)
        .unwrap()
        .write_all(&[0xff, 0xfe, b'\n', 0x80])
        .unwrap();
    let dataset = || {
        Dataset::read_text(FileSet::dir(&inputs))
            .files_per_block(4)
            .show_progress(false)
            .map(line_length)
    };

    let error = dataset().write_jsonl(root.path().join("strict")).unwrap_err();
    assert!(matches!(error, DataError::Row { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&*corrupt.to_string_lossy()) && message.contains("read_text"),
        "{message}"
    );

    let lenient = root.path().join("lenient");
    let summary = dataset().on_error(OnError::Skip).write_jsonl(&lenient).unwrap();
    assert_eq!(summary.rows, 38, "two lines from each of the 19 good files");
    assert_eq!(summary.errors.len(), 1);
    assert_eq!(summary.errors[0].source, corrupt.to_string_lossy());
    let errors = std::fs::read_to_string(lenient.join("_errors.jsonl")).unwrap();
    assert_eq!(errors.lines().count(), 1);
    assert!(errors.contains("07.txt") && errors.contains("read_text"), "{errors}");
    let rows: Vec<(String, u64, usize)> = output_rows(&lenient);
    assert_eq!(rows.len(), 38);
    assert!(rows.iter().all(|(path, _, _)| !path.ends_with("07.txt")));
}

#[test]
fn unregistered_functions_and_another_datasets_output_directory_are_refused() {
    init();
    let error = Dataset::from_items(vec![1u64, 2, 3])
        .map(unregistered)
        .take_all()
        .unwrap_err();
    assert!(error.to_string().contains("unregistered` is not registered"), "{error}");

    let out = tempfile::tempdir().unwrap();
    let first = Dataset::from_items((0..10u64).collect())
        .show_progress(false)
        .map(double);
    assert_eq!(first.write_jsonl(out.path()).unwrap().rows, 10);
    let again = first.write_jsonl(out.path()).unwrap();
    assert_eq!(
        (again.blocks_written, again.blocks_skipped, again.rows),
        (0, 1, 10),
        "a rerun of a finished write"
    );
    let other = Dataset::from_items((0..20u64).collect())
        .show_progress(false)
        .map(double);
    let error = other.write_jsonl(out.path()).unwrap_err().to_string();
    assert!(error.contains("holds the outputs of another dataset"), "{error}");
    let rows: Vec<u64> = output_rows(out.path());
    assert_eq!(rows.len(), 10, "the first dataset's output is untouched");
}

#[test]
fn write_files_writes_each_row_to_its_name_once_and_refuses_names_outside_the_directory() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 300);
    let dataset = || {
        Dataset::read_binary(FileSet::dir(&inputs))
            .files_per_block(32)
            .show_progress(false)
            .map(doubled_file)
    };
    let out = root.path().join("out");
    let summary = dataset().write_files(&out).unwrap();
    assert_eq!(
        (summary.rows, summary.blocks_written, summary.files.len()),
        (300, 10, 300)
    );
    let written: Vec<_> = std::fs::read_dir(out.join("doubled")).unwrap().collect();
    assert_eq!(written.len(), 300, "a file per row and no temporary left");
    for n in 0..300u64 {
        let text = std::fs::read_to_string(out.join(format!("doubled/{n:04}.txt"))).unwrap();
        assert_eq!(text, (n * 2).to_string());
    }
    let again = dataset().write_files(&out).unwrap();
    assert_eq!(
        (again.blocks_written, again.blocks_skipped),
        (0, 10),
        "a rerun skips every block"
    );

    for (bad, says) in [
        ("/etc/escaped", "must be relative"),
        ("../escaped", "must be relative"),
        (
            "doubled/0004.txt",
            "two rows are both to be written to doubled/0004.txt",
        ),
        (
            "doubled/0100.txt",
            "two rows are both to be written to doubled/0100.txt",
        ),
        ("_manifest/dataset.json", "own record"),
    ] {
        let out = root.path().join(format!("bad_{}", bad.replace('/', "_")));
        std::fs::write(root.path().join("bad_name"), bad).unwrap();
        let error = dataset().write_files(&out).unwrap_err().to_string();
        assert!(error.contains(says), "{bad}: {error}");
        assert!(!root.path().join("escaped").exists() && !Path::new("/etc/escaped").exists());
    }
}
