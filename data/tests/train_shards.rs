//! `Dataset::split` feeds Train workers disjoint shards: each worker of a
//! 2-worker run gets its shard in the train loop's configuration, reads it
//! there (its blocks run as tasks the worker submits) and records its rows;
//! together they hold every item once.

use std::path::PathBuf;

use raylet_data::{Dataset, register_map};
use raylet_train::{RunConfig, ScalingConfig, TrainContext, TrainError, TrainLoop, Trainer, register_train_loop};
use serde::{Deserialize, Serialize};

fn square(x: u64) -> Result<u64, String> {
    Ok(x * x)
}
register_map!(square);

/// Reads the worker's shard and writes its rows to `dir/rank_R.json`.
#[derive(Serialize, Deserialize)]
struct ReadShard {
    shards: Vec<Dataset<u64>>,
    dir: PathBuf,
}
register_train_loop!(ReadShard);

impl TrainLoop for ReadShard {
    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        let rank = context.rank();
        let shard = &self.shards[rank];
        let rows = shard.take_all().map_err(|e| TrainError::Loop(e.to_string()))?;
        let path = self.dir.join(format!("rank_{rank}.json"));
        std::fs::write(&path, serde_json::to_vec(&rows).unwrap()).map_err(|e| TrainError::Loop(e.to_string()))?;
        Ok(())
    }
}

#[test]
fn split_gives_each_train_worker_a_disjoint_shard_and_all_of_them_every_item() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let dir = tempfile::tempdir().unwrap();
    let dataset = Dataset::from_items((0..1_000u64).collect())
        .items_per_block(50)
        .map(square);
    let shards = dataset.split(2);
    Trainer::new(ReadShard {
        shards,
        dir: dir.path().to_path_buf(),
    })
    .scaling(ScalingConfig {
        num_workers: 2,
        ..ScalingConfig::default()
    })
    .run_config(RunConfig {
        name: "shards".into(),
        storage_path: dir.path().join("runs"),
        ..RunConfig::default()
    })
    .fit()
    .unwrap();
    let read = |rank: usize| -> Vec<u64> {
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("rank_{rank}.json"))).unwrap()).unwrap()
    };
    let (first, second) = (read(0), read(1));
    println!("rank 0 read {} rows, rank 1 {}", first.len(), second.len());
    assert_eq!((first.len(), second.len()), (500, 500), "10 blocks of 50 items each");
    assert!(first.iter().all(|x| !second.contains(x)), "the shards are disjoint");
    let mut all: Vec<u64> = first.into_iter().chain(second).collect();
    all.sort();
    assert_eq!(all, (0..1_000u64).map(|x| x * x).collect::<Vec<_>>());
}
