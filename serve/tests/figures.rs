//! A deployment's own figures in the status: each replica reports them
//! with its load, and the controller sums or averages them over the
//! running replicas, as each asks.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Client, deploy, init, runtime, small};
use raylet_serve::{Application, BoxError, Combine, Deployment, Figure, ReplicaContext, register_deployment};

/// Counts its requests; reports the count (summed), 1 (summed: the
/// replicas) and ten times its replica's index (averaged).
struct Counted {
    index: f64,
    answered: AtomicU64,
}
register_deployment!(Counted);

impl Deployment for Counted {
    type Init = ();
    type UserConfig = ();
    type Request = Bytes;
    type Response = Bytes;

    fn new(_: (), context: &ReplicaContext) -> Result<Self, BoxError> {
        let index = context.replica.rsplit(':').next().unwrap_or_default().parse()?;
        Ok(Counted {
            index,
            answered: AtomicU64::new(0),
        })
    }

    async fn call(&self, body: Bytes) -> Result<Bytes, BoxError> {
        self.answered.fetch_add(1, Ordering::Relaxed);
        Ok(body)
    }

    fn figures(&self) -> Vec<Figure> {
        vec![
            Figure::new("requests", self.answered.load(Ordering::Relaxed) as f64, Combine::Sum),
            Figure::new("replicas", 1.0, Combine::Sum),
            Figure::new("index_x10", 10.0 * self.index, Combine::Mean),
        ]
    }
}

#[test]
fn replicas_figures_are_summed_or_averaged_into_the_deployments_status() {
    let cluster = init();
    let counted = small::<Counted>("counted", ()).num_replicas(2);
    let instance = deploy(&cluster, Application::new("figures", "/").deployment(counted));
    let client = Client::new(instance.address(), Some(cluster.token()));
    runtime().block_on(async {
        for _ in 0..20 {
            assert_eq!(
                client.post("/", "application/octet-stream", Vec::new()).await.status,
                200
            );
        }
    });
    let expected = vec![
        Figure::new("requests", 20.0, Combine::Sum),
        Figure::new("replicas", 2.0, Combine::Sum),
        Figure::new("index_x10", 5.0, Combine::Mean),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = instance.status().expect("the status");
        let figures = &status.apps[0].deployments[0].figures;
        if *figures == expected {
            println!("the deployment's figures: {figures:?}");
            return;
        }
        assert!(Instant::now() < deadline, "figures {figures:?}, expected {expected:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
