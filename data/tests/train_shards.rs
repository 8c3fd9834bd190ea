//! `Dataset::split` and `Dataset::streaming_split` feed Train workers
//! disjoint shards: each worker of a 2-worker run gets its shard in the
//! train loop's configuration, reads it there and records its rows;
//! together they hold every item once (in every epoch of a streaming split).
//! An equal streaming split gives both as many rows in every epoch, so
//! workers that allreduce at every batch finish every epoch.

use std::path::PathBuf;

use raylet_data::{DataShard, Dataset, OnError, register_filter, register_map};
use raylet_train::collective::ReduceOp;
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

/// Reads the worker's streaming shard for `epochs` epochs in batches of 16
/// and writes each epoch's rows to `dir/rank_R_epoch_E.json`; with
/// `allreduce`, it allreduces each batch's row count with the other workers
/// after the batch, as a training step would its gradients.
#[derive(Serialize, Deserialize)]
struct StreamShard {
    shards: Vec<DataShard<u64>>,
    epochs: u64,
    dir: PathBuf,
    allreduce: bool,
}
register_train_loop!(StreamShard);

impl TrainLoop for StreamShard {
    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        let rank = context.rank();
        let mut shard = self.shards[rank].clone();
        for epoch in 0..self.epochs {
            let mut rows = Vec::new();
            for batch in shard.iter_batches(16) {
                let batch = batch.map_err(|e| TrainError::Loop(e.to_string()))?;
                if self.allreduce {
                    context.group().allreduce(&mut [batch.len() as f64], ReduceOp::Sum)?;
                }
                rows.extend(batch);
            }
            let path = self.dir.join(format!("rank_{rank}_epoch_{epoch}.json"));
            std::fs::write(&path, serde_json::to_vec(&rows).unwrap()).map_err(|e| TrainError::Loop(e.to_string()))?;
        }
        Ok(())
    }
}

/// Keeps a number unless it is a multiple of 3 or of 7: blocks of one size
/// so keep rows in uneven numbers.
fn not_a_multiple_of_3_or_7(x: &u64) -> bool {
    !x.is_multiple_of(3) && !x.is_multiple_of(7)
}
register_filter!(not_a_multiple_of_3_or_7);

/// A user's own error type: any type that displays can fail a row.
#[derive(Debug)]
struct Unlucky(u64);

impl std::fmt::Display for Unlucky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is unlucky", self.0)
    }
}

fn fails_on_13(x: u64) -> Result<u64, Unlucky> {
    match x {
        13 => Err(Unlucky(x)),
        _ => Ok(x),
    }
}
register_map!(fails_on_13);

fn trainer<L: TrainLoop>(train_loop: L, dir: &std::path::Path) -> Trainer<L> {
    Trainer::new(train_loop)
        .scaling(ScalingConfig {
            num_workers: 2,
            ..ScalingConfig::default()
        })
        .run_config(RunConfig {
            name: "shards".into(),
            storage_path: dir.join("runs"),
            ..RunConfig::default()
        })
}

/// What each of 2 Train workers read of a streaming split of `dataset` in
/// each of 2 epochs: `[epoch] -> (rank 0's rows, rank 1's)`, in reading order.
fn stream_two_epochs(dataset: Dataset<u64>) -> Vec<(Vec<u64>, Vec<u64>)> {
    let dir = tempfile::tempdir().unwrap();
    let split = dataset.streaming_split(2).unwrap();
    let train_loop = StreamShard {
        shards: split.shards(),
        epochs: 2,
        dir: dir.path().to_path_buf(),
        allreduce: false,
    };
    trainer(train_loop, dir.path()).fit().unwrap();
    epochs_read(dir.path())
}

/// What ranks 0 and 1 wrote of each of 2 epochs in `dir`.
fn epochs_read(dir: &std::path::Path) -> Vec<(Vec<u64>, Vec<u64>)> {
    let read = |rank: usize, epoch: u64| -> Vec<u64> {
        let path = dir.join(format!("rank_{rank}_epoch_{epoch}.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    (0..2)
        .map(|epoch| {
            let (first, second) = (read(0, epoch), read(1, epoch));
            println!(
                "epoch {epoch}: rank 0 read {} rows, rank 1 {}",
                first.len(),
                second.len()
            );
            (first, second)
        })
        .collect()
}

#[test]
fn split_gives_each_train_worker_a_disjoint_shard_and_all_of_them_every_item() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let dir = tempfile::tempdir().unwrap();
    let dataset = Dataset::from_items((0..1_000u64).collect())
        .items_per_block(50)
        .map(square);
    let shards = dataset.split(2);
    let train_loop = ReadShard {
        shards,
        dir: dir.path().to_path_buf(),
    };
    trainer(train_loop, dir.path()).fit().unwrap();
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

#[test]
fn a_streaming_split_gives_every_item_once_per_epoch_to_whichever_worker_asks() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let dataset = Dataset::from_items((0..1_000u64).collect())
        .items_per_block(20)
        .max_blocks_in_flight(4)
        .map(square);
    for (epoch, (first, second)) in stream_two_epochs(dataset).into_iter().enumerate() {
        assert_eq!(first.len() % 20 + second.len() % 20, 0, "whole blocks of 20 items");
        let mut all: Vec<u64> = first.into_iter().chain(second).collect();
        all.sort();
        assert_eq!(all, (0..1_000u64).map(|x| x * x).collect::<Vec<_>>(), "epoch {epoch}");
    }
}

#[test]
fn a_failing_row_of_a_streaming_split_reaches_its_consumers_naming_the_input() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
    let split = Dataset::from_items((0..100u64).collect())
        .items_per_block(10)
        .map(fails_on_13)
        .streaming_split(2)
        .unwrap();
    let errors: Vec<String> = split
        .shards()
        .into_iter()
        .map(|mut shard| {
            let failure = shard.iter_batches(10).find_map(Result::err);
            failure.expect("the run fails").to_string()
        })
        .collect();
    for error in &errors {
        assert!(
            error.contains("fails_on_13 failed on item 13: 13 is unlucky"),
            "{error}"
        );
    }
}

/// Fails on the last item, 20, so that the last block has no rows.
fn fails_on_20(x: u64) -> Result<u64, Unlucky> {
    match x {
        20 => Err(Unlucky(x)),
        _ => Ok(x),
    }
}
register_map!(fails_on_20);

#[test]
fn a_row_left_out_by_an_equal_splits_last_block_reaches_a_consumer() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
    // One block at a time, so the last block (item 20 alone) is dealt last.
    let split = Dataset::from_items((0..21u64).collect())
        .items_per_block(10)
        .max_blocks_in_flight(1)
        .map(fails_on_20)
        .on_error(OnError::Skip)
        .streaming_split_equal(2)
        .unwrap();
    let readers: Vec<_> = split
        .shards()
        .into_iter()
        .map(|mut shard| {
            std::thread::spawn(move || {
                let mut batches = shard.iter_batches(4);
                let rows: usize = batches.by_ref().map(|batch| batch.unwrap().len()).sum();
                let skipped: Vec<String> = batches.skipped().iter().map(|e| e.source.clone()).collect();
                (rows, skipped)
            })
        })
        .collect();
    let read: Vec<(usize, Vec<String>)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!((read[0].0, read[1].0), (10, 10), "{read:?}");
    let skipped: Vec<&String> = read.iter().flat_map(|(_, skipped)| skipped).collect();
    assert_eq!(skipped.len(), 1, "the row error is kept, once: {read:?}");
    assert!(skipped[0].contains("20"), "{skipped:?}");
}

#[test]
fn a_shuffled_streaming_split_gives_every_item_once_per_epoch_in_an_order_of_its_own() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let dataset = Dataset::from_items((0..1_000u64).collect())
        .items_per_block(50)
        .max_blocks_in_flight(4)
        .map(square)
        .random_shuffle(5)
        .local_shuffle_buffer(100, 9);
    let mut orders = Vec::new();
    for (epoch, (first, second)) in stream_two_epochs(dataset).into_iter().enumerate() {
        assert!(!first.is_sorted(), "rank 0 reads shuffled rows");
        let mut all: Vec<u64> = first.into_iter().chain(second).collect();
        orders.push(all.clone());
        all.sort();
        assert_eq!(all, (0..1_000u64).map(|x| x * x).collect::<Vec<_>>(), "epoch {epoch}");
    }
    assert_ne!(orders[0], orders[1], "each epoch has an order of its own");
}

#[test]
fn workers_allreducing_at_every_batch_of_an_equal_split_of_uneven_blocks_finish_every_epoch() {
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    let dir = tempfile::tempdir().unwrap();
    let kept: Vec<u64> = (0..1_001u64).filter(not_a_multiple_of_3_or_7).collect();
    let split = Dataset::from_items((0..1_001u64).collect())
        .items_per_block(25)
        .max_blocks_in_flight(4)
        .filter(not_a_multiple_of_3_or_7)
        .streaming_split_equal(2)
        .unwrap();
    let train_loop = StreamShard {
        shards: split.shards(),
        epochs: 2,
        dir: dir.path().to_path_buf(),
        allreduce: true,
    };
    trainer(train_loop, dir.path()).fit().unwrap();
    for (epoch, (first, second)) in epochs_read(dir.path()).into_iter().enumerate() {
        assert_eq!(first.len(), second.len(), "epoch {epoch}: both ranks read as many rows");
        let mut all: Vec<u64> = first.into_iter().chain(second).collect();
        all.sort_unstable();
        let read = all.len();
        all.dedup();
        assert_eq!(all.len(), read, "epoch {epoch}: no row read twice");
        assert!(all.iter().all(|x| kept.binary_search(x).is_ok()), "epoch {epoch}");
        assert_eq!(
            read,
            kept.len() / 2 * 2,
            "epoch {epoch}: of {} rows, only the one that does not divide by 2 is dropped",
            kept.len()
        );
    }
}
