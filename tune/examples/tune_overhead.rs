//! The Tune overhead benchmark: many trivial trials, each reporting a few
//! times, on the embedded cluster with 2 CPUs and one CPU per trial (Ray
//! Tune's "100 trials x 10 reports" case). Prints one JSON line:
//! `{"trials":100,"reports":10,"fit_s":..,"total_s":..}`.
//!
//! `cargo run --release -p raylet-tune --example tune_overhead -- [--trials N] [--reports N]`

use std::time::Instant;

use raylet_tune::search::{SearchSpace, uniform};
use raylet_tune::{
    Metrics, RunConfig, TrainableResult, TrialConfig, TrialContext, TuneConfig, Tuner, register_trainable,
};

/// Reports `x * i` for i in 1..=reports.
fn trivial(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    let reports: u64 = config.get("reports")?;
    for i in 1..=reports {
        ctx.report(Metrics::new().with("score", x * i as f64), None)?;
    }
    Ok(())
}
register_trainable!(trivial);

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let trials = flag(&args, "--trials", 100);
    let reports = flag(&args, "--reports", 10);
    let started = Instant::now();
    raylet::init_with(raylet::Config::default().num_cpus(2.0))?;
    let storage = tempfile::tempdir()?;
    let fit_started = Instant::now();
    let results = Tuner::new(trivial)
        .param_space(SearchSpace::new().with("x", uniform(0.0, 1.0)).with("reports", reports))
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            num_samples: trials,
            ..TuneConfig::default()
        })
        .run_config(RunConfig {
            name: "overhead".into(),
            storage_path: storage.path().to_path_buf(),
            verbose: 0,
            ..RunConfig::default()
        })
        .fit()?;
    let fit_s = fit_started.elapsed().as_secs_f64();
    let total_s = started.elapsed().as_secs_f64();
    let reported: usize = results.iter().map(|r| r.metrics_history.len()).sum();
    assert_eq!(reported, trials * reports, "every report arrived");
    println!("{{\"trials\":{trials},\"reports\":{reports},\"fit_s\":{fit_s:.4},\"total_s\":{total_s:.4}}}");
    Ok(())
}
