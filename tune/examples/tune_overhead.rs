//! The Tune overhead benchmark: many trivial trials, each reporting a few
//! times, on the embedded cluster with 2 CPUs and one CPU per trial (Ray
//! Tune's "100 trials x 10 reports" case). `--reuse-actors false` starts a
//! new trial actor for every trial, as Ray Tune does by default; `true`
//! (raylet-tune's default) runs the next trial on a finished trial's actor.
//! Prints one JSON line, `processes` being how many trial processes ran the
//! trials (each report carries its process's id):
//! `{"trials":100,"reports":10,"reuse_actors":true,"processes":2,"fit_s":..,"total_s":..}`.
//!
//! `cargo run --release -p raylet-tune --example tune_overhead -- [--trials N] [--reports N] [--reuse-actors true|false]`

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Instant;

use raylet_tune::search::{SearchSpace, uniform};
use raylet_tune::{
    Metrics, RunConfig, TrainableResult, TrialConfig, TrialContext, TuneConfig, Tuner, register_trainable,
};

/// Reports `x * i` for i in 1..=reports, and the process's id.
fn trivial(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    let reports: u64 = config.get("reports")?;
    let pid = f64::from(std::process::id());
    for i in 1..=reports {
        ctx.report(Metrics::new().with("score", x * i as f64).with("pid", pid), None)?;
    }
    Ok(())
}
register_trainable!(trivial);

/// The value after `name` on the command line, `default` when absent.
fn flag<T: FromStr>(args: &[String], name: &str, default: T) -> anyhow::Result<T> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("{name} needs a valid value")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let trials: usize = flag(&args, "--trials", 100)?;
    let reports: usize = flag(&args, "--reports", 10)?;
    let reuse_actors: bool = flag(&args, "--reuse-actors", TuneConfig::default().reuse_actors)?;
    let started = Instant::now();
    raylet::init_with(raylet::Config::default().num_cpus(2.0))?;
    let storage = tempfile::tempdir()?;
    let fit_started = Instant::now();
    let results = Tuner::new(trivial)
        .param_space(SearchSpace::new().with("x", uniform(0.0, 1.0)).with("reports", reports))
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            num_samples: trials,
            reuse_actors,
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
    let processes: BTreeSet<u64> = results
        .iter()
        .filter_map(|r| r.metrics.as_ref()?.get("pid"))
        .map(|pid| pid as u64)
        .collect();
    println!(
        "{{\"trials\":{trials},\"reports\":{reports},\"reuse_actors\":{reuse_actors},\"processes\":{},\
         \"fit_s\":{fit_s:.4},\"total_s\":{total_s:.4}}}",
        processes.len()
    );
    Ok(())
}
