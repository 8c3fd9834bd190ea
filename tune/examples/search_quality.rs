//! Search quality on standard test functions: the best value a searcher
//! finds within a budget of sequential trials, over several seeds. Prints
//! one JSON line with every seed's best and their median.
//!
//! `cargo run --release -p raylet-tune --example search_quality -- --function branin|hartmann6 --budget 100 --seeds 10 [--first-seed 0] --searcher tpe|random`

use raylet_tune::search::{BasicVariant, SearchSetup, SearchSpace, Searcher, Suggestion, Tpe, uniform};
use raylet_tune::{Metrics, Mode, TrialConfig};

/// Branin on [-5, 10] x [0, 15]; its minimum is 0.397887.
fn branin(config: &TrialConfig) -> f64 {
    let x1: f64 = config.get("x1").unwrap();
    let x2: f64 = config.get("x2").unwrap();
    let pi = std::f64::consts::PI;
    let (b, c, t) = (5.1 / (4.0 * pi * pi), 5.0 / pi, 1.0 / (8.0 * pi));
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

/// Hartmann6 on [0, 1]^6; its minimum is -3.32237.
fn hartmann6(config: &TrialConfig) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    let x: Vec<f64> = (0..6).map(|i| config.get(&format!("x{i}")).unwrap()).collect();
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-inner).exp()
        })
        .sum::<f64>()
}

fn flag<'a>(args: &'a [String], name: &str, default: &'a str) -> &'a str {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, String::as_str)
}

/// The best value `searcher` finds in `budget` trials, one after another.
fn best(searcher: &mut dyn Searcher, space: &SearchSpace, objective: fn(&TrialConfig) -> f64, budget: usize) -> f64 {
    searcher
        .setup(&SearchSetup {
            space,
            metric: Some("loss"),
            mode: Mode::Min,
            num_samples: budget,
        })
        .expect("a valid space");
    let mut best = f64::INFINITY;
    for trial in 0..budget {
        let id = format!("trial_{trial}");
        let Suggestion::Config(config) = searcher.suggest(&id) else {
            break;
        };
        let loss = objective(&config);
        best = best.min(loss);
        searcher.on_trial_complete(&id, Some(&Metrics::new().with("loss", loss)));
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let function = flag(&args, "--function", "branin");
    let budget: usize = flag(&args, "--budget", "100").parse().expect("--budget N");
    let seeds: u64 = flag(&args, "--seeds", "10").parse().expect("--seeds N");
    let first_seed: u64 = flag(&args, "--first-seed", "0").parse().expect("--first-seed N");
    let searcher_name = flag(&args, "--searcher", "tpe");
    let (space, objective): (SearchSpace, fn(&TrialConfig) -> f64) = match function {
        "branin" => (
            SearchSpace::new()
                .with("x1", uniform(-5.0, 10.0))
                .with("x2", uniform(0.0, 15.0)),
            branin,
        ),
        "hartmann6" => (
            (0..6).fold(SearchSpace::new(), |s, i| s.with(&format!("x{i}"), uniform(0.0, 1.0))),
            hartmann6,
        ),
        other => panic!("unknown --function {other}: branin or hartmann6"),
    };
    let bests: Vec<f64> = (first_seed..first_seed + seeds)
        .map(|seed| match searcher_name {
            "tpe" => best(&mut Tpe::seeded(seed), &space, objective, budget),
            "random" => best(&mut BasicVariant::seeded(seed), &space, objective, budget),
            other => panic!("unknown --searcher {other}: tpe or random"),
        })
        .collect();
    let mut sorted = bests.clone();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() % 2 {
        1 => sorted[sorted.len() / 2],
        _ => (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0,
    };
    let bests: Vec<String> = bests.iter().map(|b| format!("{b:.6}")).collect();
    println!(
        "{{\"function\":\"{function}\",\"searcher\":\"{searcher_name}\",\"budget\":{budget},\"seeds\":{seeds},\"first_seed\":{first_seed},\"median\":{median:.6},\"best\":[{}]}}",
        bests.join(",")
    );
}
