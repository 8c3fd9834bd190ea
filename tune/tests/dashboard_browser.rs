//! The dashboard in a real browser: headless Chromium logs in with the
//! cluster token and loads every page of an embedded cluster that ran
//! tasks, an actor, a placement group, a job, a Train run and a Tune
//! experiment; each page must show that content, with its charts, and no
//! script or console error. Screenshots of every page go to the test's
//! output directory.

use crate::browser;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use browser::{Browser, chromium_path};
use raylet::{Bundle, Config, Job, PlacementStrategy};
use raylet_models::digits;
use raylet_test_support::Need;
use raylet_train::digits::DigitsTraining;
use raylet_train::{RunConfig, ScalingConfig, Trainer};
use raylet_tune::search::{SearchSpace, grid};
use raylet_tune::{Metrics, Mode, TrainableResult, TrialConfig, TrialContext, TuneConfig, Tuner, register_trainable};
use serde_json::Value;

const JOB_LINE: &str = "the dashboard job says hello";

#[raylet::remote]
fn square(x: u64) -> u64 {
    x * x
}

#[raylet::actor]
pub struct Greeter {
    greeting: String,
}

#[raylet::actor]
impl Greeter {
    pub fn new(greeting: String) -> Self {
        Greeter { greeting }
    }

    pub fn greet(&self, name: String) -> String {
        format!("{} {name}", self.greeting)
    }
}

/// Reports `score = x * iteration` five times.
fn linear(config: &TrialConfig, ctx: &mut TrialContext) -> TrainableResult {
    let x: f64 = config.get("x")?;
    for i in 1..=5 {
        ctx.report(Metrics::new().with("score", x * i as f64), None)?;
    }
    Ok(())
}
register_trainable!(linear);

/// The job's driver: prints a line and ends.
#[test]
#[ignore = "the job that dashboard_pages_render_in_chromium submits runs it"]
fn dashboard_job_driver() {
    println!("{JOB_LINE}");
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn dashboard_pages_render_in_chromium() {
    let Some(chromium) = chromium_path() else {
        raylet_test_support::missing(Need::Chromium, &"no chromium or chromium-browser on the PATH");
        return;
    };
    let temp = tempfile::tempdir().unwrap();
    let config = Config::new().num_cpus(4.0).temp_dir(temp.path()).timeline(true);
    let cluster = raylet::init_with(config).unwrap();
    let local_dashboard = raylet_dashboard::LocalDashboard::start(&cluster, 0).unwrap();
    let dashboard = format!("http://{}", local_dashboard.address());

    let squares: Vec<_> = (1..=8).map(|x| square::remote(&cluster, x).unwrap()).collect();
    assert_eq!(cluster.get_all(&squares).unwrap().len(), 8);
    let greeter = Greeter::remote(&cluster, "hi".to_string())
        .name("greeter")
        .spawn()
        .unwrap();
    assert_eq!(greeter.greet("you".to_string()).get().unwrap(), "hi you");
    let group = cluster
        .placement_group(vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack)
        .unwrap();
    group.ready_timeout(Duration::from_secs(10)).unwrap();
    let block = cluster.put(&vec![3u8; 1 << 20]).unwrap();
    let job = Job::new(std::env::current_exe().unwrap())
        .args([
            "dashboard_browser::dashboard_job_driver",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .name("dashboard-job");
    let job = cluster.submit(job).unwrap();
    job.wait().unwrap();

    let storage = tempfile::tempdir().unwrap();
    let run = RunConfig {
        name: "digits-on-the-dashboard".into(),
        storage_path: storage.path().to_path_buf(),
        verbose: false,
        ..RunConfig::default()
    };
    let scaling = ScalingConfig {
        num_workers: 2,
        ..ScalingConfig::default()
    };
    let data = digits::load(0.2, 0);
    let training = DigitsTraining {
        epochs: 2,
        ..DigitsTraining::default()
    };
    Trainer::new(training)
        .scaling(scaling)
        .run_config(run)
        .dataset("train", data.train)
        .dataset("test", data.test)
        .fit()
        .unwrap();
    let tune_run = raylet_tune::RunConfig {
        name: "linear-search".into(),
        storage_path: storage.path().to_path_buf(),
        verbose: 0,
        ..raylet_tune::RunConfig::default()
    };
    Tuner::new(linear)
        .param_space(SearchSpace::new().with("x", grid([1.0, 2.0, 3.0])))
        .tune_config(TuneConfig {
            metric: Some("score".into()),
            mode: Mode::Max,
            ..TuneConfig::default()
        })
        .run_config(tune_run)
        .fit()
        .unwrap();

    let profile = tempfile::tempdir().unwrap();
    let mut browser = Browser::start(chromium, profile.path());
    browser.open(&format!("{dashboard}/ui/"));
    browser.wait_for("document.querySelector('form#login')", "the redirect to the login page");
    let fill = format!(
        "document.getElementById('token').value = {:?}; document.getElementById('login').submit(); true",
        cluster.token()
    );
    browser.eval(&fill);
    browser.wait_for(
        "location.pathname === '/ui/' && document.body.dataset.ready === 'true'",
        "the login to lead to the overview",
    );
    let shots = screenshot_dir();
    let node = cluster.status().unwrap().nodes[0].node_id.to_string();
    let pages: [(&str, Vec<String>, &str); 7] = [
        (
            "",
            vec![node.clone(), "CPU %".into()],
            "#utilization svg polyline.series",
        ),
        ("jobs", vec!["dashboard-job".into(), JOB_LINE.into()], "#job-logs"),
        ("actors", vec!["greeter".into(), "ALIVE".into()], "#actors tbody tr"),
        ("tasks", vec!["::square".into(), "FINISHED".into()], "#tasks tbody tr"),
        (
            "placement-groups",
            vec![group.id().to_string(), "CREATED".into()],
            "#placement-groups tbody tr",
        ),
        ("objects", vec![block.id().to_string()], "#stores .bar"),
        (
            "train",
            vec![
                "digits-on-the-dashboard".into(),
                "linear-search".into(),
                "trial_".into(),
            ],
            "#train-curves svg polyline.series",
        ),
    ];
    for (page, texts, element) in pages {
        browser.open(&format!("{dashboard}/ui/{page}"));
        let path = format!("/ui/{page}");
        browser.wait_for(
            &format!("location.pathname === {path:?} && document.body.dataset.ready === 'true'"),
            &format!("page {path} to render"),
        );
        browser.wait_for(
            &format!("document.querySelector({element:?})"),
            &format!("{element} on {path}"),
        );
        let shown = browser.eval("document.body.innerText").as_str().unwrap().to_string();
        for text in &texts {
            assert!(shown.contains(text.as_str()), "{path} does not show {text:?}:\n{shown}");
        }
        assert!(!shown.contains("Loading…"), "{path} still loads:\n{shown}");
        let errors = browser.eval("document.getElementById('errors').hidden");
        assert_eq!(errors, serde_json::json!(true), "{path} shows an error:\n{shown}");
        let name = if page.is_empty() { "overview" } else { page };
        let file = shots.join(format!("{name}.png"));
        browser.screenshot(&file);
        println!("screenshot of {path}: {}", file.display());
    }
    let trials = browser.eval("document.querySelectorAll('#trials tbody tr').length");
    assert_eq!(trials, serde_json::json!(3), "a row per trial");
    assert!(
        browser.errors.is_empty(),
        "the browser saw errors: {:#?}",
        browser.errors
    );
    let metrics = browser_fetch(&mut browser, "/metrics");
    check_train_and_tune_telemetry(&metrics, &mut browser, &cluster);
    std::io::stdout().flush().unwrap();
    cluster.shutdown().unwrap();
}

/// The text of an API route, fetched by the logged-in page.
fn browser_fetch(browser: &mut Browser, path: &str) -> String {
    let fetch = format!("fetch({path:?}).then((r) => r.text())");
    browser.eval(&fetch).as_str().unwrap().to_string()
}

/// `/metrics` has Train's step and allreduce times (the digits model's
/// gradients are small enough for the mesh algorithm) and Tune's trials by
/// state; the job's timeline has each gradient allreduce's phases.
fn check_train_and_tune_telemetry(metrics: &str, browser: &mut Browser, cluster: &raylet::Cluster) {
    let sample = |series: &str| -> f64 {
        let line = metrics.lines().find(|line| line.starts_with(series));
        let value = line
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok());
        value.unwrap_or_else(|| panic!("/metrics has no {series}:\n{metrics}"))
    };
    assert!(sample("raylet_train_step_seconds_count") > 10.0, "two epochs of steps");
    assert!(sample("raylet_train_allreduce_seconds_count{algorithm=\"mesh\"}") > 10.0);
    assert_eq!(
        sample("raylet_tune_trials{experiment=\"linear-search\",state=\"TERMINATED\"}"),
        3.0
    );
    assert_eq!(
        sample("raylet_tune_trials{experiment=\"linear-search\",state=\"RUNNING\"}"),
        0.0
    );
    let trace: Value = serde_json::from_str(&browser_fetch(
        browser,
        &format!("/api/timeline?job={}", cluster.job_id()),
    ))
    .unwrap();
    let names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["cat"] == "train.allreduce")
        .filter_map(|event| event["name"].as_str())
        .collect();
    for phase in ["copy_into_fusion_buffer", "allreduce", "copy_out_of_fusion_buffer"] {
        assert!(names.contains(&phase), "the timeline has no {phase} span: {names:?}");
    }
}
