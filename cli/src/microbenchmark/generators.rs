//! Generator metrics: items per second from a generator task to its caller
//! on the same node, which takes each reference as it comes and gets its
//! value; 1 KiB items travel inline, 1 MiB items through the node's
//! shared-memory store.

use raylet::{Cluster, ObjectRefStream};
use serde_bytes::ByteBuf;

use super::{Metric, metric};

/// The item sizes, as the metrics name them, and the items per call.
const ITEM_SIZES: [(&str, usize, u64); 2] = [("1 KiB", 1 << 10, 1000), ("1 MiB", 1 << 20, 100)];

/// Yields `count` items of `size` bytes.
#[raylet::remote(streaming)]
fn items_of(size: usize, count: u64) -> impl Iterator<Item = ByteBuf> {
    (0..count).map(move |i| ByteBuf::from(vec![i as u8; size]))
}

pub(super) fn generator_metrics(cluster: &Cluster) -> Vec<Metric<'_>> {
    ITEM_SIZES
        .iter()
        .map(|&(label, size, count)| {
            metric(
                format!("generator items ({label})"),
                count as f64,
                Box::new(move || take_all(items_of::remote(cluster, size, count)?, size)),
            )
        })
        .collect()
}

/// Gets every item as its reference comes.
fn take_all(items: ObjectRefStream<ByteBuf>, size: usize) -> raylet::Result<()> {
    for item in items {
        let value = item?.get()?;
        debug_assert_eq!(value.len(), size);
        std::hint::black_box(value);
    }
    Ok(())
}
