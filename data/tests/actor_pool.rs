//! Model stages in actor pools: each actor loads its model once, every
//! input still appears exactly once (also when an actor's worker is
//! SIGKILLed mid-run), pools grow with the backlog, and bad models or pools
//! are refused clearly.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Parsed, assert_each_once, assert_retried_elsewhere, numbered_files, output_rows};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_data::{
    ActorPoolStrategy, BatchModel, DataError, Dataset, FileBytes, FileSet, ModelError, register_batch_model,
};
use serde::{Deserialize, Serialize};

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

/// Parses numbered files; logs each load (its pid) in `dir/loads.log`, can
/// sleep per batch, SIGKILL itself once at a given file, or fail to load.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NumberModel {
    dir: PathBuf,
    delay_ms: u64,
    die_at: Option<u64>,
    broken: bool,
}
register_batch_model!(NumberModel);

impl NumberModel {
    fn new(dir: &Path) -> Self {
        NumberModel {
            dir: dir.to_path_buf(),
            delay_ms: 0,
            die_at: None,
            broken: false,
        }
    }
}

impl BatchModel for NumberModel {
    type In = FileBytes;
    type Out = Parsed;
    type State = u32;

    fn load(&self) -> Result<u32, ModelError> {
        if self.broken {
            return Err("the weights file is truncated".into());
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("loads.log"))
            .map_err(|e| e.to_string())?;
        let line = format!("{}\n", std::process::id());
        log.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
        Ok(std::process::id())
    }

    fn predict(&self, pid: &mut u32, batch: Vec<FileBytes>) -> Result<Vec<Parsed>, ModelError> {
        std::thread::sleep(Duration::from_millis(self.delay_ms));
        let marker = self.dir.join("killed_once");
        batch
            .into_iter()
            .map(|file| {
                let number: u64 = String::from_utf8_lossy(&file.bytes)
                    .trim()
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                if self.die_at == Some(number) && !marker.exists() {
                    std::fs::write(&marker, pid.to_string()).unwrap();
                    kill(Pid::this(), Signal::SIGKILL).unwrap();
                }
                Ok(Parsed {
                    path: file.path,
                    number,
                    worker: *pid,
                })
            })
            .collect()
    }
}

fn loads(dir: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(dir.join("loads.log")).unwrap_or_default();
    text.lines().map(|line| line.parse().unwrap()).collect()
}

#[test]
fn ten_thousand_files_through_an_actor_pool_appear_once_each_actor_loading_its_model_once() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 10_000);
    let out = root.path().join("out");
    let summary = Dataset::read_binary(FileSet::dir(&inputs))
        .files_per_block(100)
        .show_progress(false)
        .map_batches_with(NumberModel::new(root.path()), 32, ActorPoolStrategy::fixed(2))
        .write_jsonl(&out)
        .unwrap();
    let rows: Vec<Parsed> = output_rows(&out);
    assert_each_once(&rows, 10_000);
    assert_eq!(
        (summary.rows, summary.blocks_written, summary.max_actors),
        (10_000, 100, 2)
    );
    let loaded = loads(root.path());
    let workers: BTreeSet<u32> = rows.iter().map(|r| r.worker).collect();
    assert_eq!(loaded.len(), 2, "two actors, each loading the model once: {loaded:?}");
    assert_eq!(
        workers,
        loaded.iter().copied().collect(),
        "every row came from a loaded actor"
    );
    let mut per_worker: BTreeMap<u32, usize> = BTreeMap::new();
    for row in &rows {
        *per_worker.entry(row.worker).or_default() += 1;
    }
    println!("rows per actor: {per_worker:?}");
}

#[test]
fn a_pool_grows_with_the_backlog_up_to_its_maximum() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 200);
    let model = NumberModel {
        delay_ms: 50,
        ..NumberModel::new(root.path())
    };
    let summary = Dataset::read_binary(FileSet::dir(&inputs))
        .files_per_block(10)
        .show_progress(false)
        .map_batches_with(model, 10, ActorPoolStrategy::autoscaling(1, 2))
        .write_jsonl(root.path().join("out"))
        .unwrap();
    assert_eq!(summary.max_actors, 2, "{summary:?}");
    assert_eq!(loads(root.path()).len(), 2);
    assert_each_once(&output_rows(&root.path().join("out")), 200);
}

#[test]
fn an_actor_killed_mid_run_is_replaced_and_every_input_still_appears_once() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 2_000);
    let out = root.path().join("out");
    let model = NumberModel {
        die_at: Some(1_234),
        ..NumberModel::new(root.path())
    };
    let summary = Dataset::read_binary(FileSet::dir(&inputs))
        .show_progress(false)
        .map_batches_with(model, 16, ActorPoolStrategy::fixed(2))
        .write_jsonl(&out)
        .unwrap();
    assert_retried_elsewhere(root.path(), &out, 2_000, 1_234);
    assert_eq!(summary.rows, 2_000);
    assert_eq!(
        loads(root.path()).len(),
        3,
        "two actors, then the replacement of the killed one"
    );
}

#[test]
fn a_model_that_fails_to_load_an_unregistered_one_and_an_oversized_pool_are_refused() {
    init();
    let root = tempfile::tempdir().unwrap();
    let inputs = numbered_files(root.path(), 10);
    let dataset = || Dataset::read_binary(FileSet::dir(&inputs)).show_progress(false);

    let broken = NumberModel {
        broken: true,
        ..NumberModel::new(root.path())
    };
    let error = dataset()
        .map_batches_with(broken, 4, ActorPoolStrategy::fixed(1))
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(error.contains("the weights file is truncated"), "{error}");

    let error = dataset()
        .map_batches_with(NumberModel::new(root.path()), 4, ActorPoolStrategy::fixed(3))
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(error.contains("holds 2 actors"), "{error}");

    #[derive(Serialize, Deserialize)]
    struct Unregistered;
    impl BatchModel for Unregistered {
        type In = FileBytes;
        type Out = u64;
        type State = ();
        fn load(&self) -> Result<(), ModelError> {
            Ok(())
        }
        fn predict(&self, _: &mut (), batch: Vec<FileBytes>) -> Result<Vec<u64>, ModelError> {
            Ok(vec![0; batch.len()])
        }
    }
    let error = dataset()
        .map_batches_with(Unregistered, 4, ActorPoolStrategy::fixed(1))
        .take_all()
        .unwrap_err();
    assert!(matches!(error, DataError::NotRegistered(_)), "{error}");
}
