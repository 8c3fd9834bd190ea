//! Files per second through `Dataset::read_binary` + `map_batches_with` (a
//! trivial model: each file's path, length and byte sum) in a pool of
//! actors on the embedded 2-CPU cluster: the raylet side of
//! `bench/compare_data.sh` (Ray Data's `read_binary_files` + `map_batches`).
//! Blocks hold one batch of files (`--files-per-block`, by default the batch
//! size), so that each actor call processes one batch, as in Ray.
//! Makes `--files` files of `--size` bytes in `--dir` (or reuses them when it
//! holds exactly that many), consumes the rows with `take_all` (or
//! `write_jsonl` into a fresh temporary directory with `--sink jsonl`), checks
//! that every file appears exactly once and prints `key value` lines:
//! `files`, `init_s`, `seconds` (the run, init excluded), `files_per_s`.
//!
//! `cargo run --release -p raylet-data --example data_throughput -- [--dir DIR] [--files 10000] [--size 1024]
//! [--batch-size 64] [--actors 2] [--files-per-block N] [--sink take_all|jsonl] [--make-only]`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use raylet_data::{ActorPoolStrategy, BatchModel, Dataset, FileBytes, FileSet, ModelError, register_batch_model};
use serde::{Deserialize, Serialize};

/// What the trivial model makes of a file.
#[derive(Debug, Serialize, Deserialize)]
struct Summary {
    path: String,
    size: u64,
    sum: u64,
}

#[derive(Serialize, Deserialize)]
struct Trivial;
register_batch_model!(Trivial);

impl BatchModel for Trivial {
    type In = FileBytes;
    type Out = Summary;
    type State = ();

    fn load(&self) -> Result<(), ModelError> {
        Ok(())
    }

    fn predict(&self, _: &mut (), batch: Vec<FileBytes>) -> Result<Vec<Summary>, ModelError> {
        Ok(batch
            .into_iter()
            .map(|file| Summary {
                size: file.bytes.len() as u64,
                sum: file.bytes.iter().map(|&b| u64::from(b)).sum(),
                path: file.path,
            })
            .collect())
    }
}

struct Args {
    dir: Option<PathBuf>,
    files: usize,
    size: usize,
    batch_size: usize,
    actors: usize,
    files_per_block: Option<usize>,
    jsonl: bool,
    make_only: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        dir: None,
        files: 10_000,
        size: 1024,
        batch_size: 64,
        actors: 2,
        files_per_block: None,
        jsonl: false,
        make_only: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        if flag == "--make-only" {
            args.make_only = true;
            continue;
        }
        let value = given.next().with_context(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .with_context(|| format!("{flag} {value}: not a count"))
        };
        match flag.as_str() {
            "--dir" => args.dir = Some(value.clone().into()),
            "--files" => args.files = number()?,
            "--size" => args.size = number()?,
            "--batch-size" => args.batch_size = number()?,
            "--actors" => args.actors = number()?,
            "--files-per-block" => args.files_per_block = Some(number()?),
            "--sink" if value == "take_all" || value == "jsonl" => args.jsonl = value == "jsonl",
            _ => bail!("unknown flag or value: {flag} {value} (see the example's doc comment)"),
        }
    }
    Ok(args)
}

/// The input files' paths and sizes: made in `dir` when it holds none, and
/// reused when it holds exactly `files` files. File `i` is `fNNNNN.bin`, its
/// byte `j` being `(i * 131 + j * 7) % 256`.
fn input_files(dir: &Path, files: usize, size: usize) -> anyhow::Result<BTreeMap<String, u64>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut found = list(dir)?;
    if found.is_empty() {
        for i in 0..files {
            let bytes: Vec<u8> = (0..size).map(|j| ((i * 131 + j * 7) % 256) as u8).collect();
            let path = dir.join(format!("f{i:05}.bin"));
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        }
        found = list(dir)?;
    }
    ensure!(
        found.len() == files,
        "{} holds {} files, not {files}: give an empty or missing --dir, or one made with --files {}",
        dir.display(),
        found.len(),
        found.len()
    );
    Ok(found)
}

fn list(dir: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        files.insert(entry.path().to_string_lossy().into_owned(), entry.metadata()?.len());
    }
    Ok(files)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let scratch = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| scratch.path().join("inputs"));
    let inputs = input_files(&dir, args.files, args.size)?;
    if args.make_only {
        println!("files {}\ndir {}", inputs.len(), dir.display());
        return Ok(());
    }

    let started = Instant::now();
    raylet::init_with(raylet::Config::default().num_cpus(2.0))?;
    let init_s = started.elapsed().as_secs_f64();

    let run_started = Instant::now();
    let dataset = Dataset::read_binary(FileSet::dir(&dir))
        .files_per_block(args.files_per_block.unwrap_or(args.batch_size))
        .show_progress(false)
        .map_batches_with(Trivial, args.batch_size, ActorPoolStrategy::fixed(args.actors));
    let out = scratch.path().join("out");
    let taken = match args.jsonl {
        true => dataset.write_jsonl(&out).map(|_| None)?,
        false => Some(dataset.take_all()?),
    };
    let seconds = run_started.elapsed().as_secs_f64();
    // Written rows are read back for the check, outside the timing.
    let rows = match taken {
        Some(rows) => rows,
        None => read_jsonl(&out)?,
    };

    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        *seen.entry(row.path.as_str()).or_default() += 1;
        ensure!(inputs.get(&row.path) == Some(&row.size), "unexpected row {row:?}");
    }
    let repeated = seen.values().filter(|&&n| n > 1).count();
    ensure!(
        rows.len() == inputs.len() && seen.len() == inputs.len() && repeated == 0,
        "{} rows for {} files: {} distinct, {repeated} repeated",
        rows.len(),
        inputs.len(),
        seen.len()
    );
    let sink = if args.jsonl { "jsonl" } else { "take_all" };
    println!(
        "files {}\nsink {sink}\ninit_s {init_s:.4}\nseconds {seconds:.4}",
        rows.len()
    );
    println!("files_per_s {:.1}", rows.len() as f64 / seconds);
    Ok(())
}

/// Every row of the JSON-lines files written to `dir`.
fn read_jsonl(dir: &Path) -> anyhow::Result<Vec<Summary>> {
    let mut rows = Vec::new();
    for (path, _) in list(dir)? {
        let name = Path::new(&path).file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("block_") && name.ends_with(".jsonl") {
            for line in std::fs::read_to_string(&path)?.lines() {
                rows.push(serde_json::from_str(line).with_context(|| format!("a row of {path}"))?);
            }
        }
    }
    Ok(rows)
}
