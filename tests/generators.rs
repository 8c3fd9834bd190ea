//! Multiple returns and streaming generators end to end on the embedded
//! cluster: real worker processes, items as objects of their own (inline
//! and in the shared-memory store), backpressure, retries after `kill -9`
//! without duplicates, errors, cancellation, and actor methods.

use std::path::Path;
use std::time::{Duration, Instant};

use raylet::Error;
use raylet::prelude::*;
use serde_bytes::ByteBuf;

fn cluster() -> Cluster {
    raylet::init_with(Config::new().num_cpus(2.0).num_gpus(0.0)).unwrap()
}

/// Bytes above the inline limit, so that the value lives in the store.
const LARGE: usize = 300 * 1024;

#[raylet::remote(num_returns = 3)]
fn split(n: u64) -> (u64, String, ByteBuf) {
    (n * 2, format!("n={n}"), ByteBuf::from(vec![n as u8; LARGE]))
}

#[raylet::remote(num_returns = 2)]
fn divide(a: u64, b: u64) -> Result<(u64, u64), String> {
    if b == 0 {
        return Err(format!("cannot divide {a} by zero"));
    }
    Ok((a / b, a % b))
}

#[raylet::remote]
fn blob_len(blob: ByteBuf) -> usize {
    blob.len()
}

#[raylet::remote]
fn add_one(x: u64) -> u64 {
    x + 1
}

#[test]
fn each_of_several_returns_is_an_object_of_its_own() {
    let cluster = cluster();
    let (double, label, blob) = split::remote(&cluster, 7).unwrap();
    assert_eq!(label.get().unwrap(), "n=7");
    assert_eq!(blob_len::remote(&cluster, &blob).unwrap().get().unwrap(), LARGE);
    assert_eq!(add_one::remote(&cluster, &double).unwrap().get().unwrap(), 15);
    let (ready, _) = cluster.wait(std::slice::from_ref(&double), 1, None);
    assert_eq!(ready.len(), 1);
    assert_eq!(blob.get().unwrap().into_vec(), vec![7u8; LARGE]);
    let (quotient, remainder) = divide::remote(&cluster, 17, 5).unwrap();
    assert_eq!((quotient.get().unwrap(), remainder.get().unwrap()), (3, 2));
}

#[test]
fn several_returns_fail_together() {
    let cluster = cluster();
    let (quotient, remainder) = divide::remote(&cluster, 1, 0).unwrap();
    for result in [quotient.get(), remainder.get()] {
        let error = result.unwrap_err().to_string();
        assert!(error.contains("cannot divide 1 by zero"), "{error}");
    }
}

/// Yields `n` items, `i * 10`; before item 2 it waits for `dir/go`.
#[raylet::remote(streaming)]
fn tens_after_go(dir: String, n: u64) -> impl Iterator<Item = u64> {
    (0..n).map(move |i| {
        if i == 2 {
            wait_for_file(&Path::new(&dir).join("go"));
        }
        i * 10
    })
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_generator_streams_refs_before_it_ends_and_they_can_be_passed_on() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut items = tens_after_go::remote(&cluster, dir.path().display().to_string(), 6).unwrap();
    let first = items.next().unwrap().unwrap();
    let second = items.next().unwrap().unwrap();
    assert_eq!(first.get().unwrap(), 0);
    // The generator waits for `go`: these refs came from a running task.
    assert_eq!(add_one::remote(&cluster, &second).unwrap().get().unwrap(), 11);
    assert_eq!(items.completed().get_timeout(Duration::from_millis(50)).ok(), None);
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let rest: Vec<u64> = items.by_ref().map(|item| item.unwrap().get().unwrap()).collect();
    assert_eq!(rest, vec![20, 30, 40, 50]);
    assert_eq!(items.completed().get().unwrap(), 6);
    assert!(items.next().is_none());
}

/// An async generator: a stream of `n` squares.
#[raylet::remote(streaming)]
async fn squares(n: u64) -> impl futures_util::Stream<Item = u64> {
    futures_util::stream::unfold(0, move |i| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        (i < n).then_some((i * i, i + 1))
    })
}

#[test]
fn an_async_generator_streams_to_an_async_caller() {
    use futures_util::StreamExt;
    let cluster = cluster();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let squares = runtime.block_on(async {
        let mut items = squares::remote(&cluster, 20).unwrap();
        let mut squares = Vec::new();
        while let Some(item) = items.next_async().await {
            squares.push(item.unwrap().get_async().await.unwrap());
            if squares.len() == 10 {
                break;
            }
        }
        while let Some(item) = StreamExt::next(&mut items).await {
            squares.push(item.unwrap().get_async().await.unwrap());
        }
        squares
    });
    assert_eq!(squares, (0..20u64).map(|i| i * i).collect::<Vec<_>>());
}

#[raylet::remote(streaming)]
fn fails_at(n: u64) -> impl Iterator<Item = Result<u64, String>> {
    (0..=n).map(move |i| match i == n {
        true => Err(format!("item {i} cannot be made")),
        false => Ok(i),
    })
}

#[test]
fn an_error_ends_the_stream_after_the_items_before_it() {
    let cluster = cluster();
    let mut items = fails_at::remote(&cluster, 3).unwrap();
    let got: Vec<u64> = (0..3).map(|_| items.next().unwrap().unwrap().get().unwrap()).collect();
    assert_eq!(got, vec![0, 1, 2]);
    let error = items.next().unwrap().unwrap_err().to_string();
    assert!(error.contains("item 3 cannot be made"), "{error}");
    assert!(items.next().is_none());
}

/// Yields `n` items, recording in `dir/made` how many it has made.
#[raylet::remote(streaming)]
fn counted(dir: String, n: u64) -> impl Iterator<Item = u64> {
    (0..n).inspect(move |i| record_made(Path::new(&dir), i + 1))
}

fn record_made(dir: &Path, made: u64) {
    std::fs::write(dir.join("made.tmp"), made.to_string()).unwrap();
    std::fs::rename(dir.join("made.tmp"), dir.join("made")).unwrap();
}

fn made(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("made"))
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_generator_pauses_at_its_bound_until_the_caller_takes_items() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut items = counted::options()
        .generator_backpressure(4)
        .remote(&cluster, dir.path().display().to_string(), 100)
        .unwrap();
    for taken in 0..10u64 {
        // The generator runs ahead to the bound, and makes no item past it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while made(dir.path()) < taken + 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
        let ahead = made(dir.path());
        assert!(
            ahead >= taken + 4,
            "the generator stalled at {ahead} with {taken} taken"
        );
        assert!(
            ahead <= taken + 5,
            "the generator ran to {ahead} with {taken} taken and a bound of 4"
        );
        assert_eq!(items.next().unwrap().unwrap().get().unwrap(), taken);
    }
}

/// One large item: its index, the worker's resident memory (anonymous and
/// shared, in KiB) as it made it, and 1 MiB.
type LargeItem = (u64, u64, u64, ByteBuf);

#[raylet::remote(streaming)]
fn megabytes(count: u64) -> impl Iterator<Item = LargeItem> {
    (0..count).map(|i| {
        let (anonymous, shared) = resident_kib();
        (i, anonymous, shared, ByteBuf::from(vec![i as u8; 1 << 20]))
    })
}

/// This process's resident anonymous and shared memory, in KiB.
fn resident_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    };
    (field("RssAnon:"), field("RssShmem:"))
}

#[test]
fn a_slow_consumer_keeps_the_generators_memory_flat() {
    let cluster = cluster();
    let count = 2048;
    let mut items = megabytes::options()
        .generator_backpressure(4)
        .remote(&cluster, count)
        .unwrap();
    let mut samples = Vec::new();
    for expected in 0..count {
        let (index, anonymous, shared, payload) = items.next().unwrap().unwrap().get().unwrap();
        assert_eq!((index, payload.len(), payload[0]), (expected, 1 << 20, expected as u8));
        samples.push((anonymous, shared));
        if expected % 256 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(items.next().is_none());
    let settled = samples[64];
    let peak_anonymous = samples[64..].iter().map(|s| s.0).max().unwrap();
    let peak_shared = samples[64..].iter().map(|s| s.1).max().unwrap();
    println!(
        "worker RSS over 2 GiB in 1 MiB items: anonymous {} -> peak {} KiB, shared {} -> peak {} KiB",
        settled.0, peak_anonymous, settled.1, peak_shared
    );
    assert!(
        peak_anonymous < settled.0 + 32 * 1024,
        "the worker's anonymous memory grew from {} to {peak_anonymous} KiB",
        settled.0
    );
    assert!(
        peak_shared < settled.1 + 32 * 1024,
        "the worker's shared memory grew from {} to {peak_shared} KiB",
        settled.1
    );
}

/// Yields `(i, pid)` for i in 0..10. The first attempt writes its pid to
/// `dir/pid` after 5 items and waits to be killed.
#[raylet::remote(streaming)]
fn killed_after_five(dir: String) -> impl Iterator<Item = (u64, u32)> {
    let dir = std::path::PathBuf::from(dir);
    let first = !dir.join("attempted").exists();
    std::fs::write(dir.join("attempted"), b"").unwrap();
    (0..10).map(move |i| {
        if i == 5 && first {
            std::fs::write(dir.join("pid.tmp"), std::process::id().to_string()).unwrap();
            std::fs::rename(dir.join("pid.tmp"), dir.join("pid")).unwrap();
            std::thread::sleep(Duration::from_secs(120));
        }
        (i, std::process::id())
    })
}

fn kill_when_told(dir: &Path) -> u32 {
    wait_for_file(&dir.join("pid"));
    let pid: u32 = std::fs::read_to_string(dir.join("pid")).unwrap().parse().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    pid
}

#[test]
fn a_retried_generator_delivers_each_item_once() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut items = killed_after_five::remote(&cluster, dir.path().display().to_string()).unwrap();
    let mut got: Vec<(u64, u32)> = (0..5).map(|_| items.next().unwrap().unwrap().get().unwrap()).collect();
    let killed = kill_when_told(dir.path());
    got.extend(items.by_ref().map(|item| item.unwrap().get().unwrap()));
    let indices: Vec<u64> = got.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, (0..10).collect::<Vec<_>>());
    assert!(got[..5].iter().all(|(_, pid)| *pid == killed));
    assert!(got[5..].iter().all(|(_, pid)| *pid != killed));
    assert_eq!(items.completed().get().unwrap(), 10);
}

#[test]
fn a_generator_without_retries_ends_with_its_workers_exit() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut items = killed_after_five::options()
        .max_retries(0)
        .remote(&cluster, dir.path().display().to_string())
        .unwrap();
    for expected in 0..5 {
        assert_eq!(items.next().unwrap().unwrap().get().unwrap().0, expected);
    }
    kill_when_told(dir.path());
    let error = match items.next() {
        Some(Err(Error::Task(error))) => error,
        other => panic!("expected the worker's death, got {other:?}"),
    };
    assert_eq!(error.kind, TaskErrorKind::WorkerCrashed, "{error}");
    assert!(error.to_string().contains("signal 9"), "{error}");
    assert!(items.next().is_none());
}

/// Yields for ever, one item every 10 ms.
#[raylet::remote(streaming)]
fn endless() -> impl Iterator<Item = u64> {
    (0..).inspect(|_| std::thread::sleep(Duration::from_millis(10)))
}

#[raylet::remote(num_cpus = 2)]
fn whole_node() -> u64 {
    1
}

#[test]
fn cancelling_a_stream_stops_its_generator() {
    let cluster = cluster();
    let mut items = endless::remote(&cluster).unwrap();
    for expected in 0..3 {
        assert_eq!(items.next().unwrap().unwrap().get().unwrap(), expected);
    }
    items.cancel();
    let ended = items.by_ref().find_map(Result::err);
    match ended {
        Some(Error::Task(error)) => assert_eq!(error.kind, TaskErrorKind::Cancelled, "{error}"),
        other => panic!("expected a cancellation, got {other:?}"),
    }
    // Its worker is free again: a task that needs every CPU runs.
    let all = whole_node::remote(&cluster).unwrap();
    assert_eq!(all.get_timeout(Duration::from_secs(60)).unwrap(), 1);
}

#[test]
fn dropping_a_stream_stops_its_generator() {
    let cluster = cluster();
    let mut items = endless::remote(&cluster).unwrap();
    assert_eq!(items.next().unwrap().unwrap().get().unwrap(), 0);
    drop(items);
    let all = whole_node::remote(&cluster).unwrap();
    assert_eq!(all.get_timeout(Duration::from_secs(60)).unwrap(), 1);
}

#[raylet::actor]
pub struct Source {
    base: u64,
}

#[raylet::actor]
impl Source {
    pub fn new(base: u64) -> Self {
        Source { base }
    }

    #[raylet::method(streaming)]
    pub fn count(&self, n: u64) -> impl Iterator<Item = u64> + use<> {
        let base = self.base;
        (0..n).map(move |i| base + i)
    }

    #[raylet::method(num_returns = 2)]
    pub fn bump(&mut self, by: u64) -> (u64, String) {
        self.base += by;
        (self.base, format!("base={}", self.base))
    }
}

#[test]
fn actor_methods_stream_and_return_several_values() {
    let cluster = cluster();
    let source = Source::remote(&cluster, 100).spawn().unwrap();
    let counted: Vec<u64> = source
        .count(5)
        .unwrap()
        .map(|item| item.unwrap().get().unwrap())
        .collect();
    assert_eq!(counted, vec![100, 101, 102, 103, 104]);
    let (base, label) = source.bump(10);
    assert_eq!(label.get().unwrap(), "base=110");
    assert_eq!(base.get().unwrap(), 110);
    let after: Vec<u64> = source
        .count(2)
        .unwrap()
        .map(|item| item.unwrap().get().unwrap())
        .collect();
    assert_eq!(after, vec![110, 111]);
}

#[raylet::remote(streaming)]
fn seven() -> impl Iterator<Item = u64> {
    0..7
}

#[test]
fn generator_tasks_show_their_items_in_the_task_list_and_the_timeline() {
    let cluster = raylet::init_with(Config::new().num_cpus(2.0).num_gpus(0.0).timeline(true)).unwrap();
    let items = seven::remote(&cluster).unwrap();
    assert_eq!(items.count(), 7);
    let token = raylet_common::auth::AuthToken::parse(&cluster.token()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let record = loop {
        let listing = runtime
            .block_on(raylet_state::list_tasks(&cluster.head_address(), &token, None, 100))
            .unwrap();
        let finished = listing
            .tasks
            .into_iter()
            .find(|task| task.name.ends_with("seven") && task.state == "FINISHED" && task.items_yielded.is_some());
        match finished {
            Some(record) => break record,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            None => panic!("the generator's record never showed its items"),
        }
    };
    assert_eq!(record.items_yielded, Some(7));
    let trace = runtime
        .block_on(raylet_state::chrome_trace(&cluster.head_address(), &token, None))
        .unwrap();
    let run = trace
        .trace_events
        .iter()
        .find(|event| event["ph"] == "X" && event["name"].as_str().is_some_and(|name| name.ends_with("seven")))
        .expect("the generator's run is on the timeline");
    assert_eq!(run["args"]["items"].as_str(), Some("7"), "{run}");
}

#[raylet::actor]
pub struct Doorway {
    dir: String,
}

#[raylet::actor]
impl Doorway {
    pub fn new(dir: String) -> Self {
        Doorway { dir }
    }

    /// Yields 0, waits for `dir/go`, then yields 1.
    #[raylet::method(streaming)]
    pub fn through(&self) -> impl Iterator<Item = u64> + use<> {
        let go = Path::new(&self.dir).join("go");
        (0..2).inspect(move |&i| {
            if i == 1 {
                wait_for_file(&go);
            }
        })
    }

    pub fn open(&self) -> bool {
        std::fs::write(Path::new(&self.dir).join("go"), b"").is_ok()
    }

    /// Yields `n` items, recording in `dir/made` how many it has made.
    #[raylet::method(streaming)]
    pub fn counted(&self, n: u64) -> impl Iterator<Item = u64> + use<> {
        let dir = self.dir.clone();
        (0..n).inspect(move |i| record_made(Path::new(&dir), i + 1))
    }
}

#[test]
fn a_concurrent_actors_generator_waits_without_holding_up_its_other_calls() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let doorway = Doorway::remote(&cluster, dir.path().display().to_string())
        .max_concurrency(2)
        .spawn()
        .unwrap();
    let mut items = doorway.through().unwrap();
    assert_eq!(items.next().unwrap().unwrap().get().unwrap(), 0);
    assert!(doorway.open().get_timeout(Duration::from_secs(30)).unwrap());
    assert_eq!(items.next().unwrap().unwrap().get().unwrap(), 1);
    assert!(items.next().is_none());
}

#[test]
fn dropping_an_actor_methods_stream_stops_its_generator() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let doorway = Doorway::remote(&cluster, dir.path().display().to_string())
        .spawn()
        .unwrap();
    drop(doorway.counted(1_000_000).unwrap());
    // The actor runs one call at a time: this call runs after the other ended.
    assert!(doorway.open().get_timeout(Duration::from_secs(60)).unwrap());
    let made = made(dir.path());
    assert!(made < 1_000, "the dropped generator made {made} items");
}

#[test]
fn cancelling_an_actor_methods_stream_stops_its_generator() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let doorway = Doorway::remote(&cluster, dir.path().display().to_string())
        .spawn()
        .unwrap();
    let mut items = doorway.counted(1_000_000).unwrap();
    items.cancel();
    match items.by_ref().find_map(Result::err) {
        Some(Error::Task(error)) => assert_eq!(error.kind, TaskErrorKind::Cancelled, "{error}"),
        other => panic!("expected a cancellation, got {other:?}"),
    }
    assert!(doorway.open().get_timeout(Duration::from_secs(60)).unwrap());
    let made = made(dir.path());
    assert!(made < 1_000, "the cancelled generator made {made} items");
}
