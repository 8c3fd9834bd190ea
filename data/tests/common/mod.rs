//! Helpers of the Data tests: numbered input files, and the rows of an
//! output directory checked for inputs lost or repeated. Each test binary
//! uses a part of them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a numbered input file holds, and what becomes of it.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Parsed {
    pub path: String,
    pub number: u64,
    pub worker: u32,
}

impl Parsed {
    /// The number a numbered file holds, parsed in this worker.
    pub fn from_file(file: raylet_data::FileBytes) -> Result<Parsed, String> {
        let text = String::from_utf8(file.bytes).map_err(|e| format!("{}: {e}", file.path))?;
        let number = text.trim().parse().map_err(|e| format!("{}: {e}", file.path))?;
        Ok(Parsed {
            path: file.path,
            number,
            worker: std::process::id(),
        })
    }
}

/// `count` files `inputs/NNNN.txt`, each holding its number.
pub fn numbered_files(root: &Path, count: u64) -> PathBuf {
    let inputs = root.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    for n in 0..count {
        std::fs::write(inputs.join(format!("{n:04}.txt")), n.to_string()).unwrap();
    }
    inputs
}

/// Every JSON row in the `block_*` files of `dir`.
pub fn output_rows<T: for<'de> Deserialize<'de>>(dir: &Path) -> Vec<T> {
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "a temporary file was left: {name}");
        if name.starts_with("block_") {
            let text = std::fs::read_to_string(&path).unwrap();
            rows.extend(text.lines().map(|line| serde_json::from_str(line).unwrap()));
        }
    }
    rows
}

/// How many blocks the manifest of `dir` lists as written.
pub fn manifest_blocks(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("_manifest")).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.starts_with("block_") && name.ends_with(".json")
            })
            .count()
    })
}

/// How many times each number appears.
pub fn tally(rows: &[Parsed]) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for row in rows {
        *counts.entry(row.number).or_insert(0) += 1;
    }
    counts
}

pub fn assert_each_once(rows: &[Parsed], count: u64) {
    let counts = tally(rows);
    let missing: Vec<u64> = (0..count).filter(|n| !counts.contains_key(n)).collect();
    let repeated: Vec<(&u64, &usize)> = counts.iter().filter(|(_, c)| **c > 1).collect();
    assert!(missing.is_empty(), "inputs lost: {missing:?}");
    assert!(repeated.is_empty(), "inputs repeated: {repeated:?}");
    assert_eq!(rows.len() as u64, count);
}

/// Checks a run in which the worker processing input `number` SIGKILLed
/// itself (writing its pid to `root/killed_once` first): every input
/// appears once in `out`, and `number` was processed again elsewhere.
pub fn assert_retried_elsewhere(root: &Path, out: &Path, count: u64, number: u64) -> Vec<Parsed> {
    let killed: u32 = std::fs::read_to_string(root.join("killed_once"))
        .expect("a worker killed itself")
        .parse()
        .unwrap();
    let rows: Vec<Parsed> = output_rows(out);
    assert_each_once(&rows, count);
    let row = rows.iter().find(|r| r.number == number).unwrap();
    assert_ne!(
        row.worker, killed,
        "input {number} was processed again in another worker"
    );
    rows
}
