//! Object metrics whose bytes cross a process, as they do in Ray: the
//! driver puts, and an actor in another worker process of the same node
//! gets (refs handed to it inside a `Vec`, so they are not resolved before
//! the call): 1,000 small values per round, which live with their owner, the
//! driver, and travel from it on request; or one value of 100 KiB, 1 MiB or
//! 10 MiB, above the inline limit, so written into the node's shared-memory
//! store and read by the reader as `SharedBytes`, a view of the mapping
//! with no copy, as Ray's reader gets a numpy view of plasma; and gets
//! alone, one by one, of 10,000 small values put once, sent along with the
//! call or reached through an object the reader gets first, so that each
//! get asks the owner. Beside them, a memcpy of the same bytes.

use raylet::{Cluster, ObjectRef, SharedBytes};

use super::{Metric, metric, once};

/// The sizes of the large-object rows, as the metrics name them.
const OBJECT_SIZES: [(&str, usize); 3] = [("100 KiB", 100 << 10), ("1 MiB", 1 << 20), ("10 MiB", 10 << 20)];

/// Small values put and got per round of the small-object row.
const SMALL_OBJECTS: usize = 1000;

/// Small values put once and got one by one in each round of the get row.
const GOT_ONE_BY_ONE: usize = 10_000;

/// Gets what other processes put.
#[raylet::actor]
pub struct Reader;

#[raylet::actor]
impl Reader {
    pub fn new() -> Self {
        Reader
    }

    /// Gets every value and returns how many there were.
    pub fn get_all(&self, refs: Vec<ObjectRef<u64>>) -> usize {
        let cluster = raylet::current().expect("actors run in a cluster");
        cluster.get_all(&refs).expect("the owner serves its values").len()
    }

    /// Gets the values one `get` at a time and returns their sum.
    pub fn get_each(&self, refs: Vec<ObjectRef<u64>>) -> u64 {
        refs.iter().map(|r| r.get().expect("the owner serves its values")).sum()
    }

    /// Gets the list of refs the first ref names, then each value one `get`
    /// at a time, and returns their sum.
    pub fn get_each_nested(&self, lists: Vec<ObjectRef<Vec<ObjectRef<u64>>>>) -> u64 {
        let refs = lists[0].get().expect("the owner serves the list");
        refs.iter().map(|r| r.get().expect("the owner serves its values")).sum()
    }

    /// Gets the first buffer, a view of the store's mapping, and returns
    /// its length.
    pub fn length(&self, refs: Vec<ObjectRef<SharedBytes>>) -> usize {
        refs[0].get().expect("the store serves the buffer").len()
    }
}

pub(super) fn object_metrics(cluster: &Cluster) -> Vec<Metric<'_>> {
    let mut small_reader = None;
    let mut metrics = vec![metric(
        "single client put and get in another process, small objects",
        SMALL_OBJECTS as f64,
        Box::new(move || {
            let reader = once(&mut small_reader, || reader(cluster))?;
            let refs = (0..SMALL_OBJECTS)
                .map(|i| cluster.put(&(i as u64)))
                .collect::<raylet::Result<Vec<_>>>()?;
            reader.get_all(refs).get().map(drop)
        }),
    )];
    metrics.push(get_one_by_one(cluster, true));
    metrics.push(get_one_by_one(cluster, false));
    for (label, size) in OBJECT_SIZES {
        metrics.push(sized_put_and_get(cluster, label, size));
    }
    for (label, size) in OBJECT_SIZES {
        metrics.push(memcpy(label, size));
    }
    metrics
}

fn reader(cluster: &Cluster) -> raylet::Result<ReaderHandle> {
    Reader::remote(cluster).num_cpus(0.0).spawn()
}

/// Rounds of one call that gets 10,000 small values its driver put before
/// the first round, one `get` at a time: a rate of gets per second. Either
/// the call's argument names the values, which the driver then sends along
/// with it, or it names a list of them the driver put, so that it sends
/// none and each `get` asks the driver, their owner.
fn get_one_by_one(cluster: &Cluster, sent_along: bool) -> Metric<'_> {
    let name = match sent_along {
        true => "single client get in another process, one by one, small objects",
        false => "single client get in another process, one by one, small objects not sent along",
    };
    let mut state = None;
    metric(
        name,
        GOT_ONE_BY_ONE as f64,
        Box::new(move || {
            let (reader, refs, list) = once(&mut state, || {
                let refs = (0..GOT_ONE_BY_ONE as u64)
                    .map(|i| cluster.put(&i))
                    .collect::<raylet::Result<Vec<_>>>()?;
                let list = cluster.put(&refs)?;
                Ok((reader(cluster)?, refs, list))
            })?;
            match sent_along {
                true => reader.get_each(refs.clone()).get().map(drop),
                false => reader.get_each_nested(vec![list.clone()]).get().map(drop),
            }
        }),
    )
}

/// A put of `size` written bytes, then a get of them in the reader's process.
fn sized_put_and_get<'a>(cluster: &'a Cluster, label: &str, size: usize) -> Metric<'a> {
    let name = format!("single client put and get in another process, {label}");
    let mut state = None;
    metric(
        name,
        1.0,
        Box::new(move || {
            let (reader, bytes) = once(&mut state, || {
                Ok((reader(cluster)?, SharedBytes::from(vec![1u8; size])))
            })?;
            let stored = cluster.put(bytes)?;
            reader.length(vec![stored]).get().map(drop)
        }),
    )
}

/// A copy of `size` written bytes into a buffer of the same size, as the
/// floor of what moving them costs.
fn memcpy(label: &str, size: usize) -> Metric<'static> {
    let (source, mut target) = (vec![1u8; size], vec![0u8; size]);
    metric(
        format!("memcpy {label}"),
        1.0,
        Box::new(move || {
            target.copy_from_slice(std::hint::black_box(&source));
            std::hint::black_box(&mut target);
            Ok(())
        }),
    )
}
