//! Batch inference with a trained tiny GPT over real standard library
//! files on an actor pool: every file gets exactly one row, with its loss
//! and a continuation of its first lines, the same rows as a run without
//! failures, even when the busiest worker process is SIGKILLed mid-run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_data::{Dataset, FileSet};
use raylet_lm::{FileScore, ScoringOptions, TrainedGpt, score_files};
use raylet_models::corpus::{Corpus, Split, stdlib_dir};

use crate::stdlib_sample::stdlib_sample;
use crate::training::{init, sample, trainer, training};

/// A checkpoint of the tiny model after a few steps on the sample.
fn trained_checkpoint(scratch: &Path) -> PathBuf {
    let result = trainer(training(&sample(scratch), 4), 1, scratch, "scorer")
        .fit()
        .unwrap();
    result.checkpoint.unwrap().path().to_path_buf()
}

/// Validation files of the standard library, about 150 KB of them.
fn validation_files(scratch: &Path) -> (PathBuf, usize) {
    let stdlib = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
    let dir = scratch.join("files");
    let files = stdlib_sample(&stdlib, Split::Validation, 150_000);
    std::fs::create_dir_all(&dir).unwrap();
    for (index, file) in files.iter().enumerate() {
        // Flat, and with no leading `_`: a file set leaves those out as hidden.
        let name = format!("m{index:02}-{}", file.relative_path.replace('/', "-"));
        std::fs::write(dir.join(name), &file.text).unwrap();
    }
    (dir, files.len())
}

fn rows(dir: &Path) -> Vec<FileScore> {
    let mut rows: Vec<FileScore> = Dataset::read_parquet(FileSet::dir(dir))
        .rows::<FileScore>()
        .show_progress(false)
        .take_all()
        .unwrap();
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    rows
}

/// CPU ticks each child process of this one has used.
fn children_cpu() -> Vec<(i32, u64)> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            (fields[1] == me).then(|| {
                (
                    pid,
                    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap(),
                )
            })
        })
        .collect()
}

/// Once `out` holds a Parquet file, SIGKILLs the child process that used
/// the most CPU in the next half second (a scoring actor); returns its pid
/// and the CPU ticks it used then.
fn kill_busiest_worker_once_a_block_is_written(out: PathBuf) -> Option<(i32, u64)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let written = std::fs::read_dir(&out)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".parquet"))
            })
            .unwrap_or(false);
        if written {
            let before = children_cpu();
            std::thread::sleep(Duration::from_millis(500));
            let busiest = children_cpu()
                .into_iter()
                .map(|(pid, ticks)| {
                    let earlier = before.iter().find(|(p, _)| *p == pid).map_or(0, |(_, t)| *t);
                    (ticks - earlier, pid)
                })
                .max()?;
            kill(Pid::from_raw(busiest.1), Signal::SIGKILL).ok()?;
            return Some((busiest.1, busiest.0));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn every_file_is_scored_once_even_when_a_scoring_worker_is_killed_mid_run() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let checkpoint = trained_checkpoint(scratch.path());
    let (files, count) = validation_files(scratch.path());
    let options = ScoringOptions {
        prompt_lines: 2,
        new_tokens: 16,
        files_per_block: 1,
        max_actors: 2,
    };

    let calm = scratch.path().join("calm");
    score_files(&checkpoint, FileSet::dir(&files), &calm, &options).unwrap();
    let expected = rows(&calm);
    assert_eq!(expected.len(), count);

    let out = scratch.path().join("killed");
    let killer = std::thread::spawn({
        let out = out.clone();
        move || kill_busiest_worker_once_a_block_is_written(out)
    });
    let summary = score_files(&checkpoint, FileSet::dir(&files), &out, &options).unwrap();
    let killed = killer.join().unwrap();
    let (pid, ticks) = killed.expect("a worker was killed");
    assert!(
        ticks >= 10,
        "worker {pid} was busy when killed: {ticks} ticks in half a second"
    );
    assert_eq!(summary.rows, count as u64);
    let scored = rows(&out);
    let paths = |rows: &[FileScore]| rows.iter().map(|r| r.path.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&scored), paths(&expected), "each file once");
    for (row, calm) in scored.iter().zip(&expected) {
        assert!(
            (row.loss - calm.loss).abs() < 1e-5,
            "{}: {} and {}",
            row.path,
            row.loss,
            calm.loss
        );
        assert_eq!((row.tokens, &row.continuation), (calm.tokens, &calm.continuation));
    }
    let gpt = TrainedGpt::load(&checkpoint, &burn::prelude::Device::flex()).unwrap();
    println!(
        "{count} files scored after {} steps; worker {pid} killed busy; mean loss {:.3} nats; {:?} -> {:?}",
        gpt.steps,
        scored.iter().map(|r| r.loss).sum::<f64>() / count as f64,
        scored[0].prompt,
        scored[0].continuation
    );
    assert!(
        scored
            .iter()
            .all(|r| r.tokens > 0 && r.loss.is_finite() && r.loss > 0.0)
    );

    let error = score_files(&files, FileSet::dir(&files), &scratch.path().join("none"), &options)
        .unwrap_err()
        .to_string();
    println!("scoring with a directory that is no checkpoint: {error}");
    assert!(error.contains("not a GPT run's checkpoint"), "{error}");
}
