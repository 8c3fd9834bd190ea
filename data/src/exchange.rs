//! All-to-all steps of a plan: `random_shuffle`, `repartition`, `sort`
//! and `groupby`. Each input block's task splits its rows into one part
//! per output block (at random, round robin, by ranges of the sort column
//! or by a hash of the group key) and yields the parts as a streaming
//! generator, so that they are objects of the driver's in the object store
//! (which spills them to disk when memory runs short) and no process holds
//! the whole dataset. Output block `j` then reads part `j` of every input
//! and merges them (shuffled, joined, sorted or aggregated).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::kernels::cmp;
use arrow::compute::{SortOptions, cast, take};
use arrow::datatypes::DataType;
use arrow::row::{RowConverter, SortField};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::block_rows::{BlockRows, RowData};
use crate::columnar;
use crate::registry;
use crate::rows_error::{RowsError, column_names};
use crate::stage::{StageKind, StageRun, StageSpec};

/// An all-to-all step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Exchange {
    /// Every row to a random output block, each block's rows in random order.
    RandomShuffle { seed: u64 },
    /// The rows spread evenly over `blocks` blocks.
    Repartition { blocks: usize },
    /// The rows in order of `column`.
    Sort { column: String, descending: bool },
    /// A row per value of `key`, with the aggregates of its rows.
    GroupBy { key: String, aggregate: GroupAggregate },
    /// The first `rows` rows, in the blocks' order.
    Limit { rows: u64 },
}

/// What `groupby` makes of each group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum GroupAggregate {
    Columns(Vec<Aggregation>),
    /// A registered Arrow function applied to each group's rows.
    Function(String),
}

/// One aggregate of a group's rows, named in the output as Ray names it:
/// `count()`, `sum(x)`, `mean(x)`, `min(x)`, `max(x)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Aggregation {
    Count,
    Sum(String),
    Mean(String),
    Min(String),
    Max(String),
}

/// How an input block's rows are split into parts, one per output block.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Partitioner {
    Random {
        seed: u64,
        parts: usize,
    },
    RoundRobin {
        parts: usize,
    },
    /// By the sort column against `parts - 1` boundaries (an Arrow IPC
    /// stream of one column).
    Range {
        column: String,
        descending: bool,
        boundaries: ByteBuf,
    },
    Hash {
        column: String,
        parts: usize,
    },
}

/// How an output block merges its parts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Reducer {
    Shuffle {
        seed: u64,
    },
    Concat,
    Sort {
        column: String,
        descending: bool,
    },
    Aggregate {
        key: String,
        aggregate: GroupAggregate,
    },
    /// The first `rows` rows of the one part.
    Take {
        rows: usize,
    },
    /// The first part's rows beside the rows of the others, of which each
    /// gives the range `(start, length)`.
    Zip {
        ranges: Vec<(usize, usize)>,
    },
}

impl Exchange {
    /// How output blocks merge their parts (a limit's blocks each take
    /// their own number of rows).
    pub fn reducer(&self, epoch: u64) -> Reducer {
        match self {
            Exchange::Limit { rows } => Reducer::Take { rows: *rows as usize },
            Exchange::RandomShuffle { seed } => Reducer::Shuffle {
                seed: mix(*seed, epoch),
            },
            Exchange::Repartition { .. } => Reducer::Concat,
            Exchange::Sort { column, descending } => Reducer::Sort {
                column: column.clone(),
                descending: *descending,
            },
            Exchange::GroupBy { key, aggregate } => Reducer::Aggregate {
                key: key.clone(),
                aggregate: aggregate.clone(),
            },
        }
    }
}

/// A seed for `seed`'s use in `epoch` (and for block `epoch` of a step).
pub(crate) fn mix(seed: u64, epoch: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&[seed.to_le_bytes(), epoch.to_le_bytes()].concat())
}

impl Partitioner {
    /// How many parts a block is split into.
    pub fn parts(&self) -> Result<usize, RowsError> {
        match self {
            Partitioner::Random { parts, .. } | Partitioner::RoundRobin { parts } | Partitioner::Hash { parts, .. } => {
                Ok(*parts)
            }
            Partitioner::Range { boundaries, .. } => Ok(boundary_column(boundaries)?.len() + 1),
        }
    }

    /// Block `block`'s rows, split into parts.
    pub fn split(&self, data: &RowData, block: usize) -> Result<Vec<RowData>, RowsError> {
        let parts = self.parts()?;
        let assigned = self.assign(data, block, parts)?;
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); parts];
        for (row, part) in assigned.into_iter().enumerate() {
            members[part as usize].push(row as u32);
        }
        members.iter().map(|rows| data.select(rows)).collect()
    }

    /// The part of each row.
    fn assign(&self, data: &RowData, block: usize, parts: usize) -> Result<Vec<u32>, RowsError> {
        let rows = data.len();
        match self {
            Partitioner::Random { seed, .. } => {
                use rand::Rng;
                let mut rng = StdRng::seed_from_u64(mix(*seed, block as u64));
                Ok((0..rows).map(|_| rng.random_range(0..parts as u32)).collect())
            }
            Partitioner::RoundRobin { .. } => {
                let per_part = rows.div_ceil(parts.max(1)).max(1);
                Ok((0..rows).map(|row| (row / per_part) as u32).collect())
            }
            Partitioner::Range {
                column,
                descending,
                boundaries,
            } => range_parts(&key_column(data, column)?, &boundary_column(boundaries)?, *descending),
            Partitioner::Hash { column, .. } => {
                let keys = key_rows(&key_column(data, column)?)?;
                Ok((0..rows)
                    .map(|row| (xxhash_rust::xxh3::xxh3_64(keys.row(row).as_ref()) % parts as u64) as u32)
                    .collect())
            }
        }
    }
}

/// The column `name` of Arrow rows, as one array.
fn key_column(data: &RowData, name: &str) -> Result<ArrayRef, RowsError> {
    let RowData::Arrow(batches) = data else {
        return Err(RowsError::KeysNotArrow(name.to_string()));
    };
    let Some(batch) = RowData::single_batch(batches)? else {
        return Ok(Arc::new(Int64Array::from(Vec::<i64>::new())));
    };
    batch.column_by_name(name).cloned().ok_or_else(|| RowsError::NoColumn {
        column: name.to_string(),
        columns: column_names(batch.schema_ref()),
    })
}

fn boundary_column(boundaries: &[u8]) -> Result<ArrayRef, RowsError> {
    let batches = columnar::decode_ipc(boundaries.to_vec())?;
    match batches.first() {
        Some(batch) => Ok(batch.column(0).clone()),
        None => Ok(Arc::new(Int64Array::from(Vec::<i64>::new()))),
    }
}

/// Per row, how many boundaries it is at or past (at or before, descending).
fn range_parts(keys: &ArrayRef, boundaries: &ArrayRef, descending: bool) -> Result<Vec<u32>, RowsError> {
    let mut parts = vec![0u32; keys.len()];
    for index in 0..boundaries.len() {
        let boundary = arrow::array::Scalar::new(boundaries.slice(index, 1));
        let past = match descending {
            false => cmp::gt_eq(keys, &boundary),
            true => cmp::lt_eq(keys, &boundary),
        }
        .map_err(RowsError::arrow("comparing with the sort boundaries"))?;
        for (row, is_past) in past.iter().enumerate() {
            parts[row] += u32::from(is_past.unwrap_or(descending));
        }
    }
    Ok(parts)
}

/// Keys in Arrow's row format: comparable and hashable as bytes.
fn key_rows(keys: &ArrayRef) -> Result<arrow::row::Rows, RowsError> {
    let converter =
        RowConverter::new(vec![SortField::new(keys.data_type().clone())]).map_err(RowsError::arrow("group keys"))?;
    converter
        .convert_columns(std::slice::from_ref(keys))
        .map_err(RowsError::arrow("group keys"))
}

/// `parts - 1` boundaries that cut the sampled keys into equal ranges,
/// as an Arrow IPC stream of one column.
pub(crate) fn boundaries(samples: Vec<ArrayRef>, parts: usize, descending: bool) -> Result<ByteBuf, RowsError> {
    let samples: Vec<&dyn Array> = samples.iter().map(|a| a.as_ref()).collect();
    if samples.is_empty() {
        return Ok(ByteBuf::new());
    }
    let all = arrow::compute::concat(&samples).map_err(RowsError::arrow("joining key samples"))?;
    let order = SortOptions {
        descending,
        nulls_first: false,
    };
    let sorted = arrow::compute::sort(&all, Some(order)).map_err(RowsError::arrow("sorting key samples"))?;
    let picks: Vec<u32> = (1..parts)
        .map(|k| (k * sorted.len() / parts).min(sorted.len().saturating_sub(1)) as u32)
        .collect();
    if sorted.is_empty() || picks.is_empty() {
        return Ok(ByteBuf::new());
    }
    let chosen = take(&sorted, &UInt32Array::from(picks), None).map_err(RowsError::arrow("picking boundaries"))?;
    let batch =
        RecordBatch::try_from_iter([("boundary", chosen)]).map_err(RowsError::arrow("a batch of boundaries"))?;
    columnar::encode_ipc(&[batch]).map(ByteBuf::from)
}

/// A sample of at most `count` keys of `column`, evenly spaced.
pub(crate) fn sample_keys(data: &RowData, column: &str, count: usize) -> Result<ArrayRef, RowsError> {
    let keys = key_column(data, column)?;
    let step = keys.len().div_ceil(count.max(1)).max(1);
    let picks: Vec<u32> = (0..keys.len()).step_by(step).map(|i| i as u32).collect();
    take(&keys, &UInt32Array::from(picks), None).map_err(RowsError::arrow("sampling keys"))
}

impl Reducer {
    /// Output block `block`'s rows, from its parts.
    pub fn reduce(&self, mut parts: Vec<RowData>, block: usize, run: &mut StageRun) -> Result<RowData, RowsError> {
        if let Reducer::Zip { ranges } = self {
            let left = parts.remove(0);
            let right = parts
                .iter()
                .zip(ranges)
                .map(|(part, (start, length))| {
                    part.select(&(*start as u32..(start + length) as u32).collect::<Vec<_>>())
                })
                .collect::<Result<Vec<_>, _>>()?;
            return left.zip(RowData::concat(right)?);
        }
        let joined = RowData::concat(parts)?;
        match self {
            Reducer::Zip { .. } => unreachable!("zipped above"),
            Reducer::Concat => Ok(joined),
            Reducer::Take { rows } => joined.select(&(0..(*rows).min(joined.len()) as u32).collect::<Vec<_>>()),
            Reducer::Shuffle { seed } => {
                let mut order: Vec<u32> = (0..joined.len() as u32).collect();
                order.shuffle(&mut StdRng::seed_from_u64(mix(*seed, block as u64)));
                joined.select(&order)
            }
            Reducer::Sort { column, descending } => {
                let keys = key_column(&joined, column)?;
                let order = SortOptions {
                    descending: *descending,
                    nulls_first: false,
                };
                let indices = arrow::compute::sort_to_indices(&keys, Some(order), None)
                    .map_err(RowsError::arrow("sorting rows"))?;
                joined.select(indices.values())
            }
            Reducer::Aggregate { key, aggregate } => aggregate_groups(&joined, key, aggregate, run),
        }
    }
}

/// The rows of each group of `key`, in key order: their indices.
fn groups(keys: &ArrayRef) -> Result<Vec<Vec<u32>>, RowsError> {
    let rows = key_rows(keys)?;
    let mut index: HashMap<&[u8], usize> = HashMap::new();
    let mut members: Vec<Vec<u32>> = Vec::new();
    let mut firsts = Vec::new();
    for row in 0..keys.len() {
        let bytes = rows.row(row).data();
        let group = *index.entry(bytes).or_insert_with(|| {
            members.push(Vec::new());
            firsts.push(row);
            members.len() - 1
        });
        members[group].push(row as u32);
    }
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|a, b| rows.row(firsts[*a]).cmp(&rows.row(firsts[*b])));
    Ok(order
        .into_iter()
        .map(|group| std::mem::take(&mut members[group]))
        .collect())
}

fn aggregate_groups(
    data: &RowData,
    key: &str,
    aggregate: &GroupAggregate,
    run: &mut StageRun,
) -> Result<RowData, RowsError> {
    let keys = key_column(data, key)?;
    let groups = groups(&keys)?;
    match aggregate {
        GroupAggregate::Columns(aggregations) => {
            let firsts = UInt32Array::from(groups.iter().map(|rows| rows[0]).collect::<Vec<_>>());
            let first_keys = take(&keys, &firsts, None).map_err(RowsError::arrow("picking group keys"))?;
            let mut columns = vec![(key.to_string(), first_keys)];
            for aggregation in aggregations {
                columns.push(aggregate_column(data, &groups, aggregation)?);
            }
            let batch = RecordBatch::try_from_iter(columns).map_err(RowsError::arrow("a batch of aggregates"))?;
            Ok(RowData::Arrow(vec![batch]))
        }
        GroupAggregate::Function(function) => {
            let registered = registry::find(function)?;
            let whole_groups = StageSpec {
                function: function.clone(),
                kind: StageKind::MapArrowBatches,
                batch_size: usize::MAX,
            };
            let mut run = StageRun::new(&whole_groups, run.on_error());
            let mut outputs = Vec::new();
            for rows in &groups {
                let group = BlockRows {
                    data: data.select(rows)?,
                    origins: vec![0; rows.len()],
                };
                match (registered.apply)(&group, &mut run) {
                    Ok(result) => outputs.push(result.data),
                    Err(failure) => return Err(RowsError::GroupFunction(failure.message)),
                }
            }
            RowData::concat(outputs)
        }
    }
}

/// One aggregate's output column over every group.
fn aggregate_column(
    data: &RowData,
    groups: &[Vec<u32>],
    aggregation: &Aggregation,
) -> Result<(String, ArrayRef), RowsError> {
    let values = |column: &str| -> Result<Float64Array, RowsError> {
        let array = cast(&key_column(data, column)?, &DataType::Float64).map_err(|source| RowsError::Aggregate {
            column: column.to_string(),
            source,
        })?;
        Ok(array
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("cast to Float64")
            .clone())
    };
    let per_group = |values: &Float64Array, fold: fn(&[f64]) -> Option<f64>| -> ArrayRef {
        let folded: Float64Array = groups
            .iter()
            .map(|rows| {
                let present: Vec<f64> = rows
                    .iter()
                    .filter(|row| values.is_valid(**row as usize))
                    .map(|row| values.value(*row as usize))
                    .collect();
                fold(&present)
            })
            .collect();
        Arc::new(folded)
    };
    Ok(match aggregation {
        Aggregation::Count => (
            "count()".into(),
            Arc::new(Int64Array::from_iter_values(
                groups.iter().map(|rows| rows.len() as i64),
            )),
        ),
        Aggregation::Sum(column) => (
            format!("sum({column})"),
            per_group(&values(column)?, |v| Some(v.iter().sum())),
        ),
        Aggregation::Mean(column) => (
            format!("mean({column})"),
            per_group(&values(column)?, |v| {
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            }),
        ),
        Aggregation::Min(column) => (
            format!("min({column})"),
            per_group(&values(column)?, |v| v.iter().copied().reduce(f64::min)),
        ),
        Aggregation::Max(column) => (
            format!("max({column})"),
            per_group(&values(column)?, |v| v.iter().copied().reduce(f64::max)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(keys: Vec<i64>, values: Vec<f64>) -> RowData {
        let batch = RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(keys)) as ArrayRef),
            ("v", Arc::new(Float64Array::from(values)) as ArrayRef),
        ])
        .unwrap();
        RowData::Arrow(vec![batch])
    }

    fn column_i64(data: &RowData, name: &str) -> Vec<i64> {
        let column = key_column(data, name).unwrap();
        column.as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()
    }

    #[test]
    fn range_parts_then_sorted_reduces_give_every_row_in_order() {
        let data = batch(vec![5, 1, 9, 3, 7, 2, 8], vec![0.0; 7]);
        let sample = sample_keys(&data, "k", 100).unwrap();
        let bounds = boundaries(vec![sample], 3, false).unwrap();
        let partitioner = Partitioner::Range {
            column: "k".into(),
            descending: false,
            boundaries: bounds,
        };
        let parts = partitioner.split(&data, 0).unwrap();
        assert_eq!(parts.len(), 3);
        let reducer = Reducer::Sort {
            column: "k".into(),
            descending: false,
        };
        let mut run = StageRun::reading("sort", crate::OnError::Fail);
        let mut all = Vec::new();
        for (j, part) in parts.into_iter().enumerate() {
            all.extend(column_i64(&reducer.reduce(vec![part], j, &mut run).unwrap(), "k"));
        }
        assert_eq!(all, vec![1, 2, 3, 5, 7, 8, 9]);
    }

    #[test]
    fn groups_aggregate_their_rows_and_shuffles_keep_every_row() {
        let data = batch(vec![2, 1, 2, 1, 3], vec![1.0, 10.0, 3.0, 20.0, 5.0]);
        let aggregate = GroupAggregate::Columns(vec![
            Aggregation::Count,
            Aggregation::Sum("v".into()),
            Aggregation::Mean("v".into()),
            Aggregation::Max("v".into()),
        ]);
        let mut run = StageRun::reading("groupby", crate::OnError::Fail);
        let RowData::Arrow(out) = aggregate_groups(&data, "k", &aggregate, &mut run).unwrap() else {
            panic!("Arrow rows")
        };
        let out = &out[0];
        let floats = |name: &str| {
            let column = out.column_by_name(name).unwrap();
            column
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert_eq!(column_i64(&RowData::Arrow(vec![out.clone()]), "k"), [1, 2, 3]);
        assert_eq!(floats("sum(v)"), [30.0, 4.0, 5.0]);
        assert_eq!(floats("mean(v)"), [15.0, 2.0, 5.0]);
        assert_eq!(floats("max(v)"), [20.0, 3.0, 5.0]);
        let error = aggregate_groups(&data, "nope", &aggregate, &mut run).err().unwrap();
        assert!(matches!(error, RowsError::NoColumn { .. }), "{error}");
        assert!(
            error.to_string().contains("no column nope (its columns: k, v)"),
            "{error}"
        );

        let parts = Partitioner::Random { seed: 7, parts: 2 }.split(&data, 0).unwrap();
        let shuffled = Reducer::Shuffle { seed: 7 }.reduce(parts, 0, &mut run).unwrap();
        let mut keys = column_i64(&shuffled, "k");
        keys.sort();
        assert_eq!(keys, [1, 1, 2, 2, 3]);
    }
}
