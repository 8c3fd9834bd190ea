//! Scaling to zero, with real HTTP: a deployment with `min_replicas: 0`
//! deploys with no replica, its first request waits in the router's
//! bounded queue while the controller starts one (its cold start is
//! printed), it goes back to zero when idle, a full queue is refused with
//! 503, a request from the driver's own handle wakes it too, and the
//! proxy's request timeout bounds the wait.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Client, Sleeper, init, runtime, small};
use raylet::Cluster;
use raylet_serve::status::{DeploymentStatus, ReplicaState};
use raylet_serve::{
    Application, AutoscalingConfig, BoxError, Deployment, HttpOptions, Json, ReplicaContext, ServeInstance,
    register_deployment,
};

/// Scales between 0 and 1 replicas, back to 0 after 2 s without requests.
fn to_zero() -> AutoscalingConfig {
    AutoscalingConfig {
        min_replicas: 0,
        max_replicas: 1,
        upscale_delay: Duration::from_secs(30),
        downscale_delay: Duration::from_secs(2),
        metrics_interval: Duration::from_millis(200),
        look_back_period: Duration::from_secs(1),
        ..AutoscalingConfig::default()
    }
}

fn serve(cluster: &Cluster, app: Application, http: HttpOptions) -> ServeInstance {
    raylet_serve::run_with(cluster, app, http.port(0)).expect("a running application")
}

/// Waits up to `seconds` until `ready` holds of the only deployment.
fn wait_until(cluster: &Cluster, seconds: u64, what: &str, ready: impl Fn(&DeploymentStatus) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let status = raylet_serve::status(cluster).expect("the status");
        if ready(&status.apps[0].deployments[0]) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {status:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn no_replica(deployment: &DeploymentStatus) -> bool {
    deployment.replicas.is_empty()
}

#[test]
fn a_deployment_scaled_to_zero_starts_on_its_first_request_and_goes_back_to_zero() {
    let cluster = init();
    let sleeper = small::<Sleeper>("sleepy", 10)
        .autoscaling(to_zero())
        .max_queued_requests(1);
    let instance = serve(
        &cluster,
        Application::new("cold", "/").deployment(sleeper),
        HttpOptions::default(),
    );
    let status = instance.status().expect("the status");
    let deployment = &status.apps[0].deployments[0];
    assert!(no_replica(deployment), "it deploys with no replica: {status:#?}");
    assert_eq!(deployment.target_replicas, 0);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let http = runtime();

    let started = Instant::now();
    let first = http.block_on(client.post("/", "application/octet-stream", Vec::new()));
    let cold_start = started.elapsed();
    assert_eq!(first.status, 200, "{}", first.text());
    println!("cold start over HTTP (first request from zero replicas): {cold_start:?}");
    let started = Instant::now();
    let warm = http.block_on(client.post("/", "application/octet-stream", Vec::new()));
    assert_eq!(warm.status, 200, "{}", warm.text());
    println!("the next request, warm: {:?}", started.elapsed());

    wait_until(&cluster, 30, "back to zero after 2 s idle", no_replica);
    let burst = http.block_on(async {
        let requests: Vec<_> = (0..3)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.post("/", "application/octet-stream", Vec::new()).await })
            })
            .collect();
        let mut statuses = Vec::new();
        for request in requests {
            statuses.push(request.await.expect("a request").status);
        }
        statuses.sort_unstable();
        statuses
    });
    assert_eq!(
        burst,
        [200, 503, 503],
        "one waits in the queue of 1 and is answered, the others are refused"
    );

    wait_until(&cluster, 30, "back to zero again", no_replica);
    let handle = instance.handle::<Sleeper>("sleepy").expect("a handle");
    let started = Instant::now();
    let Json(replica) = http
        .block_on(handle.call(Bytes::new()))
        .expect("an answer through the driver's handle");
    println!(
        "cold start through the driver's handle: {:?} ({replica})",
        started.elapsed()
    );
}

/// Takes `Init` milliseconds to build, as a model that loads its weights.
struct SlowToLoad;
register_deployment!(SlowToLoad);

impl Deployment for SlowToLoad {
    type Init = u64;
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(load_ms: u64, _: &ReplicaContext) -> Result<Self, BoxError> {
        std::thread::sleep(Duration::from_millis(load_ms));
        Ok(SlowToLoad)
    }

    async fn call(&self, body: Bytes) -> Result<Bytes, BoxError> {
        Ok(body)
    }
}

#[test]
fn the_request_timeout_bounds_the_wait_for_a_cold_start() {
    let cluster = init();
    let stays = AutoscalingConfig {
        downscale_delay: Duration::from_secs(60),
        ..to_zero()
    };
    let slow = small::<SlowToLoad>("slow", 4000).autoscaling(stays);
    let http = HttpOptions::default().request_timeout(Duration::from_secs(1));
    let instance = serve(&cluster, Application::new("slow", "/").deployment(slow), http);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let started = Instant::now();
    let late = runtime().block_on(client.post("/", "application/octet-stream", b"hi".to_vec()));
    assert_eq!(late.status, 504, "{}", late.text());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered at the timeout, not when the replica ran"
    );
    wait_until(&cluster, 60, "the replica it woke starts anyway", |deployment| {
        deployment.replicas_in(ReplicaState::Running).count() == 1
    });
    let answered = runtime().block_on(client.post("/", "application/octet-stream", b"hi".to_vec()));
    assert_eq!((answered.status, answered.body.as_slice()), (200, &b"hi"[..]));
}
