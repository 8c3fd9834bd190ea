//! All-to-all steps on a real cluster: random_shuffle (typed and Arrow
//! rows, every row once), repartition, sort (rows in order across blocks),
//! groupby with column aggregates and a user function, and the local
//! shuffle buffer of iter_batches; bad keys fail naming the column.

use std::collections::BTreeMap;
use std::sync::Arc;

use raylet_data::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use raylet_data::{Aggregation, Arrow, Dataset, register_arrow_fn, register_map};
use serde::{Deserialize, Serialize};

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

fn plus_one(x: u64) -> Result<u64, String> {
    Ok(x + 1)
}
register_map!(plus_one);

/// Where a worker of the test process `driver` marks that it killed itself.
fn kill_marker(driver: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("raylet-data-shuffle-kill-{driver}"))
}

/// The first time a worker (a child of the test's driver) sees 1,500, it
/// marks it and SIGKILLs itself, in the middle of a shuffle's split.
fn dies_once_at_1500(x: u64) -> Result<u64, String> {
    let marker = kill_marker(std::os::unix::process::parent_id());
    if x == 1_500 && !marker.exists() {
        std::fs::write(&marker, std::process::id().to_string()).map_err(|e| e.to_string())?;
        nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    Ok(x)
}
register_map!(dies_once_at_1500);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Sale {
    store: i64,
    amount: f64,
}

/// The sale with the largest amount of a group (a store's sales).
fn largest_sale(group: RecordBatch) -> Result<RecordBatch, String> {
    let amounts = group.column_by_name("amount").ok_or("no amount")?;
    let amounts = amounts
        .as_any()
        .downcast_ref::<Float64Array>()
        .ok_or("amount is not Float64")?;
    let largest = (0..amounts.len())
        .max_by(|a, b| amounts.value(*a).total_cmp(&amounts.value(*b)))
        .ok_or("an empty group")?;
    Ok(group.slice(largest, 1))
}
register_arrow_fn!(largest_sale);

/// 4,000 sales over 7 stores, as Arrow rows in 8 blocks (from Parquet).
fn sales(dir: &std::path::Path) -> Dataset<Arrow> {
    let rows: Vec<Sale> = (0..4_000i64)
        .map(|n| Sale {
            store: (n * 31) % 7,
            amount: ((n * 7919) % 1000) as f64 / 4.0,
        })
        .collect();
    Dataset::from_items(rows)
        .items_per_block(500)
        .show_progress(false)
        .write_parquet(dir)
        .unwrap();
    Dataset::read_parquet(dir.to_str().unwrap()).show_progress(false)
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> &'a T {
    batch
        .column_by_name(name)
        .unwrap()
        .as_any()
        .downcast_ref::<T>()
        .unwrap()
}

#[test]
fn random_shuffle_moves_rows_across_blocks_and_keeps_each_once() {
    init();
    let dataset = || {
        Dataset::from_items((0..10_000u64).collect())
            .items_per_block(500)
            .show_progress(false)
    };
    let shuffled = dataset().random_shuffle(7).map(plus_one).take_all().unwrap();
    let mut sorted = shuffled.clone();
    sorted.sort();
    assert_eq!(sorted, (1..=10_000u64).collect::<Vec<_>>(), "every row once");
    let first: Vec<u64> = shuffled[..100].to_vec();
    let span = first.iter().max().unwrap() - first.iter().min().unwrap();
    assert!(span > 2_000, "the first rows come from many input blocks: {first:?}");

    let temp = tempfile::tempdir().unwrap();
    let summary = dataset().repartition(3).write_jsonl(temp.path()).unwrap();
    assert_eq!((summary.rows, summary.files.len()), (10_000, 3));
}

#[test]
fn a_worker_killed_while_splitting_a_shuffle_loses_and_repeats_no_row() {
    init();
    let marker = kill_marker(std::process::id());
    let _ = std::fs::remove_file(&marker);
    let mut rows = Dataset::from_items((0..3_000u64).collect())
        .items_per_block(100)
        .show_progress(false)
        .map(dies_once_at_1500)
        .random_shuffle(1)
        .take_all()
        .unwrap();
    assert!(marker.exists(), "a worker killed itself");
    std::fs::remove_file(&marker).unwrap();
    rows.sort();
    assert_eq!(rows, (0..3_000u64).collect::<Vec<_>>(), "every row once");
}

#[test]
fn sort_orders_arrow_rows_across_blocks_and_groupby_aggregates_each_key() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let batches = sales(temp.path()).sort("amount", true).take_all().unwrap();
    let amounts: Vec<f64> = batches
        .iter()
        .flat_map(|b| column::<Float64Array>(b, "amount").values().to_vec())
        .collect();
    assert_eq!(amounts.len(), 4_000);
    assert!(amounts.windows(2).all(|w| w[0] >= w[1]), "descending across blocks");

    let mut expected: BTreeMap<i64, (i64, f64, f64)> = BTreeMap::new();
    for n in 0..4_000i64 {
        let entry = expected.entry((n * 31) % 7).or_insert((0, 0.0, f64::MIN));
        let amount = ((n * 7919) % 1000) as f64 / 4.0;
        *entry = (entry.0 + 1, entry.1 + amount, entry.2.max(amount));
    }
    let aggregated = sales(&temp.path().join("again"))
        .groupby("store")
        .aggregate_columns(vec![
            Aggregation::Count,
            Aggregation::Sum("amount".into()),
            Aggregation::Max("amount".into()),
        ])
        .take_all()
        .unwrap();
    let mut got = BTreeMap::new();
    for batch in &aggregated {
        let stores = column::<Int64Array>(batch, "store");
        let counts = column::<Int64Array>(batch, "count()");
        let sums = column::<Float64Array>(batch, "sum(amount)");
        let maxes = column::<Float64Array>(batch, "max(amount)");
        for row in 0..batch.num_rows() {
            let previous = got.insert(
                stores.value(row),
                (counts.value(row), sums.value(row), maxes.value(row)),
            );
            assert!(previous.is_none(), "store {} in one row", stores.value(row));
        }
    }
    assert_eq!(got, expected);

    let largest: Vec<Sale> = sales(&temp.path().join("third"))
        .groupby("store")
        .aggregate(largest_sale)
        .rows::<Sale>()
        .take_all()
        .unwrap();
    assert_eq!(largest.len(), 7);
    for sale in largest {
        assert_eq!(sale.amount, expected[&sale.store].2, "store {}", sale.store);
    }

    let error = sales(&temp.path().join("fourth"))
        .sort("price", false)
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no column price (its columns: store, amount)"),
        "{error}"
    );
}

#[test]
fn a_local_shuffle_buffer_draws_batches_across_a_block() {
    init();
    let batches: Vec<Vec<u64>> = Dataset::from_items((0..1_000u64).collect())
        .items_per_block(1_000)
        .show_progress(false)
        .local_shuffle_buffer(1_000, 3)
        .iter_batches(100)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(batches.len(), 10);
    assert!(
        batches[0].iter().any(|x| *x >= 500),
        "the first batch draws from the whole block"
    );
    let mut all: Vec<u64> = batches.concat();
    all.sort();
    assert_eq!(all, (0..1_000u64).collect::<Vec<_>>());
}

#[test]
fn arrow_rows_shuffle_with_every_row_once() {
    init();
    let batch =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(0..3_000)) as ArrayRef)]).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let path = temp.path().join("ids.parquet");
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    for start in (0..3_000).step_by(300) {
        writer.write(&batch.slice(start, 300)).unwrap();
        writer.flush().unwrap();
    }
    writer.close().unwrap();
    let shuffled = Dataset::read_parquet(path.to_str().unwrap())
        .block_bytes(1)
        .show_progress(false)
        .random_shuffle(11)
        .take_all()
        .unwrap();
    let mut ids: Vec<i64> = shuffled
        .iter()
        .flat_map(|b| column::<Int64Array>(b, "id").values().to_vec())
        .collect();
    assert_ne!(ids, (0..3_000).collect::<Vec<_>>());
    ids.sort();
    assert_eq!(ids, (0..3_000).collect::<Vec<_>>());
}

#[test]
fn limit_union_and_zip_keep_rows_in_place() {
    init();
    let items = |range: std::ops::Range<u64>, per_block: usize| {
        Dataset::from_items(range.collect())
            .items_per_block(per_block)
            .show_progress(false)
    };
    let first = items(0..10_000, 100).map(plus_one).limit(250).take_all().unwrap();
    assert_eq!(first, (1..=250u64).collect::<Vec<_>>(), "the first rows, in order");

    let mut both = items(0..100, 30)
        .map(plus_one)
        .union(items(1_000..1_100, 40))
        .take_all()
        .unwrap();
    both.sort();
    assert_eq!(both, (1..=100u64).chain(1_000..1_100).collect::<Vec<_>>());

    let tens = Dataset::from_items((0..1_000u64).map(|x| x * 10).collect::<Vec<u64>>()).items_per_block(70);
    let mut pairs = items(0..1_000, 300).zip(tens).take_all().unwrap();
    pairs.sort();
    assert_eq!(pairs, (0..1_000u64).map(|x| (x, x * 10)).collect::<Vec<_>>());
    let error = items(0..10, 3).zip(items(0..11, 3)).take_all().unwrap_err().to_string();
    assert!(error.contains("as many rows: 10 and 11"), "{error}");

    let temp = tempfile::tempdir().unwrap();
    let zipped = sales(&temp.path().join("a"))
        .zip(sales(&temp.path().join("b")))
        .take_all()
        .unwrap();
    let names: Vec<String> = zipped[0].schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["store", "amount", "store_1", "amount_1"]);
    for batch in &zipped {
        assert_eq!(
            column::<Int64Array>(batch, "store"),
            column::<Int64Array>(batch, "store_1")
        );
    }
    assert_eq!(zipped.iter().map(RecordBatch::num_rows).sum::<usize>(), 4_000);
}
