//! Schedulers that pause, resume and re-seed trials, end to end: PBT's
//! exploit copies a donor's checkpoint into a trial, HyperBand pauses and
//! resumes trials from their checkpoints, and fractional GPUs bound how
//! many trials run at once.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raylet_tune::schedulers::{HyperBand, PopulationBasedTraining};
use raylet_tune::search::{SearchSpace, grid, uniform};
use raylet_tune::{
    Metrics, Mode, RunConfig, TrainableResult, TrialConfig, TrialContext, TrialResources, TrialStatus, TuneConfig,
    Tuner, register_trainable,
};
use serde::{Deserialize, Serialize};

/// What `counter` keeps in its checkpoints.
#[derive(Serialize, Deserialize)]
struct CounterState {
    value: f64,
    /// The number of the trial that wrote the checkpoint.
    writer: f64,
}

fn trial_number(id: &str) -> f64 {
    id.trim_start_matches("trial_").parse().unwrap()
}

/// Adds `rate` to a value each iteration, checkpointing it; after a
/// (re)start it reports the checkpoint it resumed from.
fn counter(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let rate: f64 = config.get("rate")?;
    let iterations: u64 = config.get("iterations")?;
    let own = trial_number(ctx.trial_id());
    let (mut value, mut resumed) = match ctx.checkpoint() {
        Some(checkpoint) => {
            let state: CounterState = checkpoint.load_state()?;
            (state.value, Some(state))
        }
        None => (0.0, None),
    };
    while ctx.iteration() < iterations {
        value += rate;
        let checkpoint = ctx.new_checkpoint()?;
        checkpoint.save_state(&CounterState { value, writer: own })?;
        let mut metrics = Metrics::new().with("value", value).with("rate", rate);
        if let Some(state) = resumed.take() {
            metrics.insert("resumed_value", state.value);
            metrics.insert("resumed_writer", state.writer);
        }
        ctx.report(metrics, Some(checkpoint))?;
    }
    Ok(())
}
register_trainable!(counter);

/// Holds its slot for a while and reports when it ran.
fn sleeper(_config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let started = now();
    std::thread::sleep(Duration::from_millis(400));
    let gpus = raylet::gpu_ids().len() as f64;
    ctx.report(
        Metrics::new()
            .with("started", started)
            .with("ended", now())
            .with("gpus", gpus),
        None,
    )?;
    Ok(())
}
register_trainable!(sleeper);

fn run_config(storage: &Path, name: &str) -> RunConfig {
    RunConfig {
        name: name.into(),
        storage_path: storage.to_path_buf(),
        verbose: 1,
        ..RunConfig::default()
    }
}

#[test]
fn pbt_exploit_copies_the_donors_checkpoint_into_the_trial() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(counter)
        .param_space(
            SearchSpace::new()
                .with("rate", grid([0.1, 0.2, 1.0, 2.0]))
                .with("iterations", 12),
        )
        .tune_config(TuneConfig {
            metric: Some("value".into()),
            mode: Mode::Max,
            num_samples: 1,
            max_concurrent_trials: Some(4),
            ..TuneConfig::default()
        })
        .resources_per_trial(TrialResources {
            num_cpus: 0.5,
            ..TrialResources::default()
        })
        .scheduler(
            PopulationBasedTraining::new()
                .time_attr("training_iteration")
                .perturbation_interval(3.0)
                .mutate("rate", uniform(0.05, 4.0))
                .seed(3),
        )
        .run_config(run_config(storage.path(), "pbt"))
        .fit()
        .unwrap();
    assert!(results.iter().all(|r| r.status == TrialStatus::Terminated));

    let mut exploits = 0;
    for result in results.iter() {
        for (position, report) in result.metrics_history.iter().enumerate() {
            let (Some(resumed_value), Some(writer)) = (report.get("resumed_value"), report.get("resumed_writer"))
            else {
                continue;
            };
            if writer == trial_number(&result.trial_id) {
                continue;
            }
            exploits += 1;
            let iteration = report.get("training_iteration").unwrap();
            let donor = results.iter().find(|r| trial_number(&r.trial_id) == writer).unwrap();
            let donor_had = donor
                .metrics_history
                .iter()
                .any(|m| m.get("training_iteration") == Some(iteration - 1.0) && m.get("value") == Some(resumed_value));
            assert!(
                donor_had,
                "{} resumed at iteration {iteration} from {}'s value {resumed_value}, which it never reported",
                result.trial_id, donor.trial_id
            );
            let rate = report.get("rate").unwrap();
            assert!(
                (report.get("value").unwrap() - (resumed_value + rate)).abs() < 1e-9,
                "the state jumped"
            );
            if position > 0 {
                let before = result.metrics_history[position - 1].get("value").unwrap();
                assert_ne!(
                    before + rate,
                    report.get("value").unwrap(),
                    "the value came from the donor"
                );
            }
        }
    }
    assert!(exploits > 0, "no trial exploited another");
    println!("{exploits} exploits, each resuming from its donor's checkpointed value");
}

#[test]
fn hyperband_pauses_trials_at_milestones_and_resumes_them_from_their_checkpoints() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(counter)
        .param_space(
            SearchSpace::new()
                .with("rate", grid([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]))
                .with("iterations", 9),
        )
        .tune_config(TuneConfig {
            metric: Some("value".into()),
            mode: Mode::Max,
            ..TuneConfig::default()
        })
        .scheduler(HyperBand::new().max_t(9.0).reduction_factor(3.0))
        .run_config(run_config(storage.path(), "hyperband"))
        .fit()
        .unwrap();
    let mut lengths: Vec<(f64, usize)> = results
        .iter()
        .map(|r| (r.config.get::<f64>("rate").unwrap(), r.metrics_history.len()))
        .collect();
    lengths.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("rate and iterations per trial: {lengths:?}");
    let iterations: Vec<usize> = lengths.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        iterations,
        vec![1, 1, 1, 1, 1, 1, 3, 3, 9],
        "9 trials to milestone 1, 3 to 3, 1 to 9"
    );
    let mut resumes = 0;
    for result in results.iter() {
        let steps: Vec<f64> = result
            .metrics_history
            .iter()
            .map(|m| m.get("training_iteration").unwrap())
            .collect();
        let expected: Vec<f64> = (1..=steps.len()).map(|i| i as f64).collect();
        assert_eq!(
            steps, expected,
            "{}: a resumed trial goes on from its checkpoint",
            result.trial_id
        );
        for pair in result.metrics_history.windows(2) {
            if let Some(resumed) = pair[1].get("resumed_value") {
                assert_eq!(
                    Some(resumed),
                    pair[0].get("value"),
                    "resumed from its own latest checkpoint"
                );
                resumes += 1;
            }
        }
    }
    assert!(resumes >= 2, "paused trials were resumed: {resumes}");
}

#[test]
fn fractional_gpus_bound_how_many_trials_run_at_once() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0).num_gpus(1.0)).unwrap();
    let storage = tempfile::tempdir().unwrap();
    let results = Tuner::new(sleeper)
        .param_space(SearchSpace::new().with("x", grid([1, 2, 3, 4, 5, 6])))
        .resources_per_trial(TrialResources {
            num_cpus: 0.0,
            num_gpus: 0.5,
            ..TrialResources::default()
        })
        .tune_config(TuneConfig {
            reuse_actors: false,
            ..TuneConfig::default()
        })
        .run_config(run_config(storage.path(), "gpus"))
        .fit()
        .unwrap();
    let spans: Vec<(f64, f64)> = results
        .iter()
        .map(|r| {
            let m = r.metrics.as_ref().unwrap();
            (m.get("started").unwrap(), m.get("ended").unwrap())
        })
        .collect();
    let most_at_once = spans
        .iter()
        .map(|(start, _)| spans.iter().filter(|(s, e)| s <= start && start < e).count())
        .max()
        .unwrap();
    assert_eq!(most_at_once, 2, "two half-GPU trials fit on one GPU: {spans:?}");
    for result in results.iter() {
        assert_eq!(
            result.metrics.as_ref().unwrap().get("gpus"),
            Some(1.0),
            "each trial sees its GPU"
        );
    }
}
