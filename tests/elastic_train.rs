//! An elastic Train run on hosts made of network namespaces (a head and up
//! to four one-CPU nodes, each a real `raylet` daemon), with this test
//! process as the driver: a run of 2 to 4 workers starts on the two nodes
//! there are, grows when two more join, goes on with the survivors when a
//! node is killed with SIGKILL, and ends as accurate as a run of a fixed 2
//! workers. Its train loop is ZeRO stage 3 over the digits, so every
//! change of size also resumes sharded state gathered into a checkpoint.
//! Skipped with a message where namespaces cannot be made; CI runs it as root.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use nix::sys::signal::Signal;
use raylet::{Cluster, Config};
use raylet_models::digits::{Digit, DigitsMlp, batch, load};
use raylet_train::collective::ReduceOp;
use raylet_train::sharding::{DataParallel, ShardingStrategy};
use raylet_train::{
    FailureConfig, Metrics, Report, RunConfig, ScalingConfig, TrainContext, TrainError, TrainLoop, Trainer,
    WorkerResources,
};
use serde::{Deserialize, Serialize};

use crate::common;

use common::netns::{TestNetwork, start_daemon};

const HEAD_PORT: &str = "6390";
const EPOCHS: u64 = 24;

/// The digits MLP trained with ZeRO stage 3, a checkpoint every epoch, and
/// a pause per epoch that leaves the test time to add and kill nodes.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PacedDigits {
    pause_ms: u64,
}

/// An epoch's progress in a checkpoint.
#[derive(Serialize, Deserialize)]
struct Epoch(u64);

raylet_train::register_train_loop!(PacedDigits);

impl TrainLoop for PacedDigits {
    fn reports(&self) -> Option<u64> {
        Some(EPOCHS)
    }

    fn run(self, context: &mut TrainContext) -> Result<(), TrainError> {
        let device = Device::flex().autodiff();
        device.seed(3);
        let train: Vec<Digit> = context.dataset_shard("train")?;
        let test: Vec<Digit> = context.dataset_shard("test")?;
        let (mut model, mut optimizer, mut first) = (DigitsMlp::new(64, &device), AdamConfig::new().init(), 0);
        if let Some(checkpoint) = context.checkpoint() {
            model = checkpoint.load_model(model)?;
            optimizer = checkpoint.load_optimizer(optimizer)?;
            first = checkpoint.load_state::<Epoch>()?.0 + 1;
        }
        let mut parallel = DataParallel::new(context.group(), model, optimizer, ShardingStrategy::Parameters)?;
        let local = context.local_batch_size(64);
        let learning_rate = context.learning_rate(3e-3, 64);
        for epoch in first..EPOCHS {
            std::thread::sleep(Duration::from_millis(self.pause_ms));
            for step in train.chunks_exact(local) {
                let model = parallel.model(context.group())?;
                let (pixels, labels) = batch(step, &device);
                let loss = CrossEntropyLoss::new(None, &device).forward(model.forward(pixels), labels);
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                parallel.step(context.group(), learning_rate, model, grads, &Device::flex())?;
            }
            let model = parallel.model(context.group())?;
            let mut counts = [model.count_correct(&test, &device) as f64, test.len() as f64];
            context.group().allreduce(&mut counts, ReduceOp::Sum)?;
            let metrics = Metrics::new()
                .with("epoch", epoch as f64)
                .with("accuracy", counts[0] / counts[1]);
            let checkpoint = match parallel.gathered(context.group())? {
                Some((model, optimizer)) => {
                    let checkpoint = context.new_checkpoint()?;
                    checkpoint.save_model(&model)?;
                    checkpoint.save_optimizer(&optimizer)?;
                    checkpoint.save_state(&Epoch(epoch))?;
                    Some(checkpoint)
                }
                None => None,
            };
            context.report(metrics, checkpoint)?;
        }
        Ok(())
    }
}

/// The head and four node hosts, the head and `n1`, `n2` started.
struct ElasticCluster {
    driver: Cluster,
    head: String,
    token: String,
    network: TestNetwork,
}

impl ElasticCluster {
    fn start(temp: &Path) -> Option<Self> {
        let network = TestNetwork::create(40, &["head", "n1", "n2", "n3", "n4"], temp)?;
        let head = format!("{}:{HEAD_PORT}", network.host("head").ip);
        start_daemon(&network, "head", &["--head", "--port", HEAD_PORT, "--num-cpus", "0"]);
        let token = std::fs::read_to_string(network.host("head").temp.join("session_latest/token")).unwrap();
        let token = token.trim().to_string();
        let driver = raylet::init_with(Config::new().address(&head).token(&token).temp_dir(temp)).unwrap();
        let cluster = ElasticCluster {
            driver,
            head,
            token,
            network,
        };
        cluster.add_nodes(&["n1", "n2"]);
        Some(cluster)
    }

    /// Starts a one-CPU node on each host and waits until they are alive.
    fn add_nodes(&self, hosts: &[&str]) {
        let alive = self.driver.status().unwrap().alive().count();
        for host in hosts {
            let joining = ["--address", &self.head, "--token", &self.token, "--num-cpus", "1"];
            start_daemon(&self.network, host, &joining);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.driver.status().unwrap().alive().count() < alive + hosts.len() {
            assert!(Instant::now() < deadline, "the nodes on {hosts:?} did not join");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn trainer(scaling: ScalingConfig, name: &str, storage: &Path) -> Trainer<PacedDigits> {
    let digits = load(0.2, 0);
    Trainer::new(PacedDigits { pause_ms: 400 })
        .scaling(ScalingConfig {
            resources_per_worker: WorkerResources {
                num_cpus: 1.0,
                ..WorkerResources::default()
            },
            ..scaling
        })
        .run_config(RunConfig {
            name: name.into(),
            storage_path: storage.to_path_buf(),
            failure: FailureConfig {
                max_failures: 3,
                collective_timeout: Duration::from_secs(20),
            },
            ..RunConfig::default()
        })
        .dataset("train", digits.train)
        .dataset("test", digits.test)
}

fn accuracy(report: &Report) -> f64 {
    report.metrics.get("accuracy").unwrap()
}

#[test]
fn an_elastic_run_grows_when_nodes_join_and_goes_on_without_a_killed_one() {
    let temp = tempfile::tempdir().unwrap();
    let Some(cluster) = ElasticCluster::start(temp.path()) else {
        return;
    };
    let storage = temp.path().join("runs");
    let fixed = trainer(
        ScalingConfig {
            num_workers: 2,
            ..ScalingConfig::default()
        },
        "fixed",
        &storage,
    )
    .fit_on(&cluster.driver, &mut |_| ControlFlow::Continue(()))
    .unwrap();

    let mut added = false;
    let mut killed_at: Option<usize> = None;
    let mut on_report = |report: &Report| {
        if !added && report.index >= 1 {
            assert_eq!(
                report.world_size, 2,
                "the run starts with the 2 workers there is room for"
            );
            cluster.add_nodes(&["n3", "n4"]);
            added = true;
        } else if killed_at.is_none() && report.world_size >= 3 {
            cluster.network.signal_host("n1", Signal::SIGKILL);
            killed_at = Some(report.world_size);
        }
        ControlFlow::Continue(())
    };
    let elastic = trainer(ScalingConfig::elastic(2, 4), "elastic", &storage)
        .fit_on(&cluster.driver, &mut on_report)
        .unwrap();

    let sizes: Vec<(u64, u32, usize)> = elastic
        .metrics_history
        .iter()
        .map(|r| (r.index, r.attempt, r.world_size))
        .collect();
    eprintln!("elastic reports (index, try, workers): {sizes:?}");
    let grown = killed_at.expect("the run grew to 3 or 4 workers");
    let after_kill = elastic
        .metrics_history
        .iter()
        .skip_while(|r| r.world_size != grown)
        .find(|r| r.world_size < grown)
        .expect("the run went on with fewer workers after the kill");
    assert!(after_kill.world_size >= 2, "{sizes:?}");
    assert!(elastic.failures >= 1, "the kill failed a try");
    let last = elastic.metrics_history.last().unwrap();
    assert_eq!(last.index, EPOCHS - 1);
    let (fixed_accuracy, elastic_accuracy) = (accuracy(fixed.metrics_history.last().unwrap()), accuracy(last));
    eprintln!("final accuracy: fixed 2 workers {fixed_accuracy:.4}, elastic {elastic_accuracy:.4}");
    assert!(
        (fixed_accuracy - elastic_accuracy).abs() <= 0.01,
        "fixed {fixed_accuracy} vs elastic {elastic_accuracy}"
    );
}
