//! Trials that are Train runs: each trial's actor starts a 2-worker
//! data-parallel run of its own (a placement group and two worker actors
//! made from inside the trial actor), whose reports become the trial's.

use raylet_tune::digits::train_digits_on_workers;
use raylet_tune::search::{SearchSpace, grid};
use raylet_tune::{Mode, RunConfig, TrialResources, TrialStatus, TuneConfig, Tuner};

#[test]
fn each_trial_can_be_a_two_worker_train_run() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(train_digits_on_workers)
        .param_space(
            SearchSpace::new()
                .with("lr", grid([3e-3, 1e-2]))
                .with("hidden", 32)
                .with("batch_size", 64)
                .with("epochs", 4),
        )
        .tune_config(TuneConfig {
            metric: Some("accuracy".into()),
            mode: Mode::Max,
            max_concurrent_trials: Some(1),
            ..TuneConfig::default()
        })
        .resources_per_trial(TrialResources {
            num_cpus: 0.0,
            ..TrialResources::default()
        })
        .run_config(RunConfig {
            name: "train_trials".into(),
            storage_path: storage.path().to_path_buf(),
            ..RunConfig::default()
        })
        .fit()
        .unwrap();
    assert_eq!(results.len(), 2);
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{:?}", result.error);
        assert_eq!(result.metrics_history.len(), 4, "one report per epoch from rank 0");
        let accuracy = result.metrics.as_ref().unwrap().get("accuracy").unwrap();
        assert!(accuracy > 0.8, "{}: {accuracy}", result.trial_id);
        let train_run = result.path.join("train");
        assert!(
            train_run.join("checkpoint_000003").exists(),
            "the Train run checkpointed in the trial's directory"
        );
    }
    println!(
        "accuracies: {:?}",
        results
            .iter()
            .map(|r| r.metrics.as_ref().unwrap().get("accuracy"))
            .collect::<Vec<_>>()
    );
}
