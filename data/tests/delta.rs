//! `read_delta` (feature `delta`): a Delta Lake table written by the
//! `deltalake` crate in two commits is read back whole, with a projection
//! and a filter, and a location that is not a table fails naming it.

use deltalake::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use deltalake::kernel::{DataType, PrimitiveType, StructField};
use deltalake::writer::{DeltaWriter, RecordBatchWriter};
use deltalake::{DeltaTable, ensure_table_uri};
use raylet_data::arrow::array::Int64Array as Int64Column;
use raylet_data::{Dataset, ParquetOptions, Predicate};

/// A table at `dir` with `id` (0..2000) and `x = id / 2`, in two commits.
async fn write_table(dir: &std::path::Path) {
    let url = ensure_table_uri(dir.to_str().unwrap()).unwrap();
    let mut table = DeltaTable::try_from_url(url)
        .await
        .unwrap()
        .create()
        .with_columns([
            StructField::new("id", DataType::Primitive(PrimitiveType::Long), false),
            StructField::new("x", DataType::Primitive(PrimitiveType::Double), false),
        ])
        .await
        .unwrap();
    for commit in 0..2i64 {
        let ids: Vec<i64> = (commit * 1000..(commit + 1) * 1000).collect();
        let batch = RecordBatch::try_from_iter([
            ("id", std::sync::Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
            (
                "x",
                std::sync::Arc::new(Float64Array::from_iter_values(ids.iter().map(|id| *id as f64 / 2.0))) as ArrayRef,
            ),
        ])
        .unwrap();
        let mut writer = RecordBatchWriter::for_table(&table).unwrap();
        writer.write(batch).await.unwrap();
        writer.flush_and_commit(&mut table).await.unwrap();
    }
}

fn ids(batches: &[raylet_data::RecordBatch]) -> Vec<i64> {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let column = b.column_by_name("id").unwrap();
            column.as_any().downcast_ref::<Int64Column>().unwrap().values().to_vec()
        })
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_delta_table_is_read_at_its_current_version() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
    let temp = tempfile::tempdir().unwrap();
    let table = temp.path().join("table");
    std::fs::create_dir_all(&table).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(write_table(&table));

    let location = table.to_str().unwrap();
    let all = Dataset::read_delta(location, ParquetOptions::default())
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(ids(&all), (0..2000).collect::<Vec<_>>());

    let some = ParquetOptions::default()
        .columns(["id"])
        .filter(Predicate::lt("id", 10_i64));
    let few = Dataset::read_delta(location, some)
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(ids(&few), (0..10).collect::<Vec<_>>());
    assert_eq!(few[0].num_columns(), 1);

    let error = Dataset::read_delta(temp.path().to_str().unwrap(), ParquetOptions::default())
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(error.contains("reading the Delta table"), "{error}");
}
