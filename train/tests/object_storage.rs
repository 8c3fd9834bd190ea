//! A run kept in object storage, on a real S3-compatible server started by
//! the test: each committed checkpoint is whole in the bucket (its metadata
//! uploaded last), the run's metrics are there too, a run of the same name
//! on a node without the local copy resumes from the bucket, and
//! checkpoints the retention policy drops leave the bucket.

use raylet_models::digits;
use raylet_storage::testing::S3Server;
use raylet_train::digits::DigitsTraining;
use raylet_train::{CheckpointConfig, RunConfig, ScalingConfig, Trainer};

fn trainer(server: &S3Server, epochs: u64) -> Trainer<DigitsTraining> {
    let data = digits::load(0.2, 0);
    Trainer::new(DigitsTraining {
        epochs,
        ..DigitsTraining::default()
    })
    .scaling(ScalingConfig {
        num_workers: 2,
        ..ScalingConfig::default()
    })
    .run_config(RunConfig {
        name: "digits".into(),
        storage_path: "s3://runs/team".into(),
        checkpoint: CheckpointConfig {
            num_to_keep: Some(1),
            ..CheckpointConfig::default()
        },
        verbose: false,
        ..RunConfig::default()
    })
    .storage_options(server.options())
    .dataset("train", data.train)
    .dataset("test", data.test)
}

#[test]
fn a_run_in_a_bucket_commits_whole_checkpoints_and_resumes_from_them_on_another_node() {
    let server = S3Server::start();
    raylet::init_with(raylet::Config::default().num_cpus(4.0)).expect("an embedded cluster");
    server.create_bucket("runs");
    let first = trainer(&server, 3).fit().unwrap();
    let latest = first.checkpoint.clone().unwrap();
    assert_eq!(
        latest.remote_location(),
        Some("s3://runs/team/digits/checkpoint_000002")
    );
    let objects = server.objects("runs", "team/digits");
    println!("in the bucket after 3 epochs: {objects:?}");
    for name in [
        "checkpoint_000002/model.bpk",
        "checkpoint_000002/.raylet_checkpoint.json",
        "metrics.jsonl",
    ] {
        assert!(objects.iter().any(|o| o == name), "{name} in {objects:?}");
    }
    assert!(
        !objects.iter().any(|o| o.starts_with("checkpoint_000000/")),
        "the retention policy's dropped checkpoint left the bucket: {objects:?}"
    );

    // Another node has no local copy of the run: it resumes from the bucket.
    std::fs::remove_dir_all(&first.path).unwrap();
    let second = trainer(&server, 5).fit().unwrap();
    let resumed = second.metrics_history.first().unwrap();
    assert_eq!(
        resumed.index, 3,
        "the second run went on after the bucket's latest checkpoint"
    );
    let accuracy = second.metrics.get("accuracy").unwrap();
    println!(
        "resumed at report {}; accuracy after 5 epochs {accuracy:.3}",
        resumed.index
    );
    assert!(accuracy > 0.85, "{accuracy}");
    assert_eq!(
        second.checkpoint.unwrap().remote_location(),
        Some("s3://runs/team/digits/checkpoint_000004")
    );
}
