//! Routing by the fullness replicas report (`Deployment::fullness`, as an
//! LLM server reports its key/value cache): requests go to the emptier of
//! two replicas, a replica that reports itself full gets none while the
//! other has room, and when both are full requests wait in the router's
//! bounded queue until a stream's end reports room.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Client, deploy, init, runtime, small};
use futures_util::{Stream, StreamExt};
use raylet_serve::{
    Application, BodyStream, BoxError, Deployment, DeploymentHandle, Json, ReplicaContext, ServeError,
    register_deployment,
};

/// The index at the end of a replica's name (`replica:app:deployment:1`).
fn replica_index(context: &ReplicaContext) -> Result<usize, BoxError> {
    Ok(context.replica.rsplit(':').next().unwrap_or_default().parse()?)
}

/// Reports the fullness its `Init` gives its replica (by index), and
/// answers with its replica's name.
struct Steady {
    replica: String,
    fullness: f64,
}
register_deployment!(Steady);

impl Deployment for Steady {
    type Init = Vec<f64>;
    type UserConfig = ();
    type Request = Bytes;
    type Response = Json<String>;

    fn new(fullness: Vec<f64>, context: &ReplicaContext) -> Result<Self, BoxError> {
        let fullness = fullness
            .get(replica_index(context)?)
            .ok_or("no fullness for this replica")?;
        Ok(Steady {
            replica: context.replica.clone(),
            fullness: *fullness,
        })
    }

    async fn call(&self, _: Bytes) -> Result<Json<String>, BoxError> {
        Ok(Json(self.replica.clone()))
    }

    fn fullness(&self) -> Option<f64> {
        Some(self.fullness)
    }
}

/// Sends `count` requests one after another; counts the answers by
/// replica.
fn answers_by_replica(client: &Client, count: usize) -> BTreeMap<String, usize> {
    runtime().block_on(async {
        let mut served = BTreeMap::new();
        for _ in 0..count {
            let answer = client.post("/", "application/octet-stream", Vec::new()).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            let replica = answer.json().as_str().expect("a replica name").to_string();
            *served.entry(replica).or_default() += 1;
        }
        served
    })
}

#[test]
fn requests_go_to_the_replica_that_reports_itself_emptier() {
    let cluster = init();
    let steady = small::<Steady>("steady", vec![0.6, 0.2]).num_replicas(2);
    let instance = deploy(&cluster, Application::new("emptier", "/").deployment(steady));
    let client = Client::new(instance.address(), Some(cluster.token()));
    let started = Instant::now();
    let served = answers_by_replica(&client, 40);
    let elapsed = started.elapsed();
    println!("40 requests over {elapsed:?}, by replica: {served:?}");
    let fuller = served.get("replica:emptier:steady:0").copied().unwrap_or(0);
    let emptier = served.get("replica:emptier:steady:1").copied().unwrap_or(0);
    assert_eq!(fuller + emptier, 40, "{served:?}");
    // The fuller replica gets a request before it first reports, and one
    // each time its report expires (a second): it is tried again.
    let tries_of_the_fuller = 2 + elapsed.as_secs() as usize;
    assert!(fuller <= tries_of_the_fuller, "{served:?} in {elapsed:?}");
}

#[test]
fn a_replica_reporting_itself_full_gets_nothing_while_the_other_has_room() {
    let cluster = init();
    let steady = small::<Steady>("steady", vec![1.0, 0.5])
        .num_replicas(2)
        .max_ongoing_requests(32);
    let instance = deploy(&cluster, Application::new("full", "/").deployment(steady));
    let client = Client::new(instance.address(), Some(cluster.token()));
    let sequential = answers_by_replica(&client, 20);
    let concurrent = runtime().block_on(async {
        let requests: Vec<_> = (0..20)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.post("/", "application/octet-stream", Vec::new()).await })
            })
            .collect();
        let mut replicas = Vec::new();
        for request in requests {
            let answer = request.await.expect("a request task");
            assert_eq!(answer.status, 200, "{}", answer.text());
            replicas.push(answer.json().as_str().expect("a replica name").to_string());
        }
        replicas
    });
    let only_the_other = BTreeMap::from([("replica:full:steady:1".to_string(), 20)]);
    assert_eq!(sequential, only_the_other);
    assert!(
        concurrent.iter().all(|replica| replica == "replica:full:steady:1"),
        "{concurrent:?}"
    );
}

/// Streams its replica's name with how many streams it holds, then holds
/// the stream until the file the request names exists; it is full when it
/// holds as many as its `Init` says.
struct Holder {
    replica: String,
    capacity: u32,
    held: Arc<AtomicU32>,
}
register_deployment!(Holder);

/// A stream [`Holder`] holds, counted until it is dropped.
struct HeldStream(Arc<AtomicU32>);

impl Drop for HeldStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Deployment for Holder {
    type Init = u32;
    type UserConfig = ();
    type Request = Json<String>;
    type Response = Bytes;
    const STREAMING: bool = true;

    fn new(capacity: u32, context: &ReplicaContext) -> Result<Self, BoxError> {
        Ok(Holder {
            replica: context.replica.clone(),
            capacity,
            held: Arc::new(AtomicU32::new(0)),
        })
    }

    async fn call(&self, _: Json<String>) -> Result<Bytes, BoxError> {
        Err("Holder only streams".into())
    }

    fn stream(&self, Json(release): Json<String>) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        let held = self.held.fetch_add(1, Ordering::SeqCst) + 1;
        let counted = HeldStream(self.held.clone());
        let first = Bytes::from(format!("{} holding {held}", self.replica));
        let released = async move {
            while !Path::new(&release).exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(counted);
            Ok(Bytes::from("released"))
        };
        futures_util::stream::iter([Ok(first)]).chain(futures_util::stream::once(released))
    }

    fn fullness(&self) -> Option<f64> {
        Some(f64::from(self.held.load(Ordering::SeqCst)) / f64::from(self.capacity))
    }
}

/// Opens a stream held until `release` exists; returns its first chunk
/// (the replica and how many streams it holds) and the rest.
async fn open(handle: &DeploymentHandle<Holder>, release: &Path) -> raylet_serve::Result<(String, BodyStream)> {
    let mut stream = handle.stream(Json(release.display().to_string())).await?;
    let first = stream.next().await.expect("a first chunk")?;
    Ok((String::from_utf8_lossy(&first).into_owned(), stream))
}

/// Reads a stream to its end; returns its last chunk.
async fn rest(mut stream: BodyStream) -> String {
    let mut last = String::new();
    while let Some(chunk) = stream.next().await {
        last = String::from_utf8_lossy(&chunk.expect("a chunk")).into_owned();
    }
    last
}

#[test]
fn when_both_replicas_are_full_requests_wait_until_a_streams_end_reports_room() {
    let cluster = init();
    let holder = small::<Holder>("holder", 1)
        .num_replicas(2)
        .max_ongoing_requests(8)
        .max_queued_requests(1);
    let instance = deploy(&cluster, Application::new("holding", "/").deployment(holder));
    let handle = instance.handle::<Holder>("holder").expect("a handle");
    let releases = tempfile::tempdir().expect("a temporary directory");
    let release = |name: &str| releases.path().join(name);
    runtime().block_on(async {
        let (first_a, a) = open(&handle, &release("a")).await.expect("stream a");
        let (first_b, b) = open(&handle, &release("b")).await.expect("stream b");
        let replica_a = first_a.strip_suffix(" holding 1").expect("a holds one stream");
        let replica_b = first_b.strip_suffix(" holding 1").expect("b holds one stream");
        assert_ne!(replica_a, replica_b, "b goes to the replica with room");

        let waiting = |name: &'static str| {
            let (handle, release) = (handle.clone(), release(name));
            tokio::spawn(async move { open(&handle, &release).await })
        };
        let (c, d) = (waiting("c"), waiting("d"));
        let (refused, queued) = match futures_util::future::select(c, d).await {
            futures_util::future::Either::Left((c, d)) => (c, d),
            futures_util::future::Either::Right((d, c)) => (d, c),
        };
        let refused = refused.expect("a request task");
        assert!(
            matches!(refused, Err(ServeError::BackPressure { .. })),
            "one of two waits in the queue of 1, the other is refused: {:?}",
            refused.map(|(first, _)| first)
        );

        std::fs::write(release("a"), "").expect("releasing a");
        assert_eq!(rest(a).await, "released");
        let a_ended = Instant::now();
        let (first, queued) = queued.await.expect("a request task").expect("the queued stream");
        println!("the queued stream started {:?} after a ended", a_ended.elapsed());
        assert_eq!(first, format!("{replica_a} holding 1"), "it runs where a ended, alone");

        for name in ["b", "c", "d"] {
            std::fs::write(release(name), "").expect("releasing");
        }
        assert_eq!(rest(b).await, "released");
        assert_eq!(rest(queued).await, "released");
    });
}
