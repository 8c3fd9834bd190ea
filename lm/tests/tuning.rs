//! An ASHA search over the learning rate, the warmup and the width of the
//! tiny GPT, each trial a Train run on rows prepared from real standard
//! library text: every trial ends, ASHA stops the ones that fall behind
//! before their last report, and the search chooses the trial of the
//! lowest validation loss; it is printed beside the default configuration.

use raylet_lm::{PrepareOptions, prepare_corpus, tune_gpt};
use raylet_models::corpus::{Corpus, Split, stdlib_dir};
use raylet_tune::schedulers::Asha;
use raylet_tune::search::{BasicVariant, SearchSpace, choice, loguniform};
use raylet_tune::{Mode, ResultGrid, RunConfig, TrialResources, TrialStatus, TuneConfig, Tuner};

use crate::stdlib_sample::stdlib_sample;
use crate::training::init;

const STEPS: u64 = 30;
const REPORT_EVERY: u64 = 5;

fn search(space: SearchSpace, samples: usize, name: &str, storage: &std::path::Path) -> ResultGrid {
    Tuner::new(tune_gpt)
        .param_space(space)
        .tune_config(TuneConfig {
            metric: Some("validation_loss".into()),
            mode: Mode::Min,
            num_samples: samples,
            // One trial at a time: every trial meets ASHA's rungs after the
            // same earlier trials, so which ones it stops does not depend on
            // how fast each runs.
            max_concurrent_trials: Some(1),
            ..TuneConfig::default()
        })
        .searcher(BasicVariant::seeded(11))
        .scheduler(
            Asha::new()
                .max_t((STEPS / REPORT_EVERY) as f64)
                .grace_period(2.0)
                .reduction_factor(2.0),
        )
        .resources_per_trial(TrialResources {
            num_cpus: 0.0,
            ..TrialResources::default()
        })
        .run_config(RunConfig {
            name: name.into(),
            storage_path: storage.to_path_buf(),
            ..RunConfig::default()
        })
        .fit()
        .unwrap()
}

#[test]
fn asha_searches_the_learning_rate_warmup_and_width_of_tiny_by_validation_loss() {
    init();
    let scratch = tempfile::tempdir().unwrap();
    let stdlib = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
    let corpus = scratch.path().join("corpus");
    for (split, bytes) in [(Split::Train, 150_000), (Split::Validation, 30_000)] {
        for file in stdlib_sample(&stdlib, split, bytes) {
            let path = corpus.join(&file.relative_path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, &file.text).unwrap();
        }
    }
    let data = scratch.path().join("prepared");
    let options = PrepareOptions {
        vocab_size: 512,
        sequence_length: 32,
        files_per_block: 4,
        max_actors: 2,
    };
    prepare_corpus(&corpus, &data, &options).unwrap();
    let fixed = || {
        SearchSpace::new()
            .with("data_dir", data.to_str().unwrap())
            .with("steps", STEPS)
            .with("batch_size", 8)
            .with("report_every", REPORT_EVERY)
            .with("validation_rows", 32)
    };

    let samples = 6;
    let space = fixed()
        .with("lr", loguniform(3e-4, 3e-2))
        .with("warmup_steps", choice([2, 10]))
        .with("d_model", choice([64, 128]));
    let results = search(space, samples, "asha", scratch.path());
    let default = fixed().with("lr", 1e-3).with("warmup_steps", 20).with("d_model", 128);
    let default = search(default, 1, "default", scratch.path());

    assert_eq!(results.len(), samples);
    let reports = (STEPS / REPORT_EVERY) as usize;
    for result in results.iter() {
        assert_eq!(result.status, TrialStatus::Terminated, "{:?}", result.error);
    }
    for result in results.iter() {
        let losses: Vec<String> = result
            .metrics_history
            .iter()
            .map(|m| format!("{:.3}", m.get("validation_loss").unwrap()))
            .collect();
        println!("{}: {}", result.config, losses.join(" "));
    }
    let stopped_early = results.iter().filter(|r| r.metrics_history.len() < reports).count();
    assert!(stopped_early > 0, "ASHA stopped some trial before its last report");
    let last_loss = |r: &raylet_tune::TrialResult| r.metrics.as_ref().unwrap().get("validation_loss").unwrap();
    let best = results.best().unwrap();
    assert!(results.iter().all(|r| last_loss(best) <= last_loss(r)));
    let default = default.get(0).unwrap();
    println!(
        "ASHA ({samples} trials, {stopped_early} stopped early) chose {} at validation loss {:.3}; \
         the default config (lr 1e-3, warmup 20, d_model 128) reached {:.3}",
        best.config,
        last_loss(best),
        last_loss(default)
    );
}
