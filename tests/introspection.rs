//! The head's record of tasks on a CLI cluster: `raylet list tasks` (with
//! filters), `raylet summary tasks`, `raylet timeline` and the task metrics
//! of `/metrics` follow a small job's tasks, actor calls, a failure and a
//! long run, with the timeline on and off; every observation of a histogram
//! a task records reaches `/metrics`; `raylet logs` shows what a task, an
//! actor and a worker printed.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{get, metrics, metrics_when, session_file, total};
use common::{Daemons, head_address, raylet};
use raylet::metrics::Histogram;
use raylet::{Cluster, Config};
use serde_json::Value;

#[raylet::remote]
fn square(x: u64) -> u64 {
    x * x
}

#[raylet::remote]
fn refuse(why: String) -> u64 {
    panic!("{why}")
}

#[raylet::remote]
fn nap(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

/// Aborts its worker the first time (the marker file does not exist yet).
#[raylet::remote(max_retries = 1)]
fn dies_once(marker: String) -> u32 {
    if std::fs::metadata(&marker).is_err() {
        std::fs::write(&marker, b"").unwrap();
        std::process::abort();
    }
    7
}

#[raylet::remote]
fn shout(word: String) -> usize {
    println!("shout: {word}");
    eprintln!("whisper: {word}");
    word.len()
}

#[raylet::actor]
pub struct Speaker {
    prefix: String,
}

#[raylet::actor]
impl Speaker {
    pub fn new(prefix: String) -> Self {
        Speaker { prefix }
    }

    pub fn say(&self, text: String) -> usize {
        println!("{} {text}", self.prefix);
        text.len()
    }
}

#[raylet::actor]
pub struct Tally {
    sum: u64,
}

#[raylet::actor]
impl Tally {
    pub fn new(sum: u64) -> Self {
        Tally { sum }
    }

    pub fn add(&mut self, by: u64) -> u64 {
        self.sum += by;
        self.sum
    }
}

/// More observations than a report held when histograms sent raw ones.
const OBSERVATIONS: u32 = 50_000;

/// Records `count` observations of 0 to 19 ms, evenly.
#[raylet::remote]
fn observe(count: u32) -> u32 {
    let latency = Histogram::new(
        "test_introspection_work_seconds",
        "Time per unit of work",
        &[0.001, 0.01],
        &["phase"],
    );
    for i in 0..count {
        latency.observe(&["work"], f64::from(i % 20) / 1000.0);
    }
    count
}

/// Squares 1..=10, fails one task, makes 3 actor calls; returns the job.
fn small_job(head: &str, temp: &Path, timeline: bool) -> String {
    let config = Config::new().address(head).temp_dir(temp).timeline(timeline);
    let cluster = raylet::init_with(config).unwrap();
    let squares: Vec<_> = (1..=10).map(|x| square::remote(&cluster, x).unwrap()).collect();
    assert_eq!(cluster.get_all(&squares).unwrap().iter().sum::<u64>(), 385);
    let refused = refuse::remote(&cluster, "no thanks".to_string()).unwrap();
    assert!(refused.get().is_err());
    let tally = Tally::remote(&cluster, 0).spawn().unwrap();
    for by in 1..=3 {
        tally.add(by).get().unwrap();
    }
    let job = cluster.job_id().to_string();
    cluster.shutdown().unwrap();
    job
}

/// Runs `observe` in a job of its own.
fn observing_job(head: &str, temp: &Path) {
    let cluster = raylet::init_with(Config::new().address(head).temp_dir(temp)).unwrap();
    assert_eq!(
        observe::remote(&cluster, OBSERVATIONS).unwrap().get().unwrap(),
        OBSERVATIONS
    );
    cluster.shutdown().unwrap();
}

fn list_tasks(temp: &Path, extra: &[&str]) -> Vec<Value> {
    let args = [&["list", "tasks", "--format", "json", "--limit", "1000"][..], extra].concat();
    serde_json::from_str(&raylet(temp, &args)).unwrap()
}

/// The complete ("X") events of a Chrome trace, by category.
fn trace_runs(trace: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut runs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for event in trace["traceEvents"].as_array().unwrap() {
        if event["ph"] == "X" {
            assert!(
                event["ts"].as_u64().unwrap() > 0 && event["pid"].as_u64().is_some(),
                "{event}"
            );
            assert!(
                event["tid"].as_u64().unwrap() > 0,
                "each run is on a worker's row: {event}"
            );
            let category = event["cat"].as_str().unwrap().to_string();
            runs.entry(category).or_default().push(event.clone());
        }
    }
    runs
}

#[test]
fn list_summary_timeline_and_metrics_follow_a_small_jobs_tasks() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    let start = [
        "start",
        "--head",
        "--port",
        "0",
        "--dashboard-port",
        "0",
        "--num-cpus",
        "2",
    ];
    raylet(temp.path(), &start);
    let head = head_address(temp.path());
    let dashboard = session_file(temp.path(), "dashboard_address");
    let token = session_file(temp.path(), "token");

    let job = small_job(&head, temp.path(), true);
    let tasks = list_tasks(temp.path(), &["--job", &job]);
    assert_eq!(tasks.len(), 14, "10 squares, 1 refusal, 3 actor calls: {tasks:#?}");
    let finished = tasks.iter().filter(|t| t["state"] == "FINISHED").count();
    assert_eq!(finished, 13, "{tasks:#?}");
    for task in &tasks {
        assert_eq!(task["job_id"], job.as_str());
        assert!(task["worker_pid"].as_u64().unwrap() > 0, "{task}");
        assert!(task["duration_ms"].as_f64().is_some(), "{task}");
        let submitted = task["submitted_ms"].as_f64().unwrap();
        assert!(task["scheduled_ms"].as_f64().unwrap() >= submitted, "{task}");
    }
    let failed = list_tasks(temp.path(), &["--job", &job, "--filter", "state=FAILED"]);
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert!(failed[0]["name"].as_str().unwrap().ends_with("refuse"), "{failed:#?}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("no thanks"),
        "{failed:#?}"
    );
    let calls = list_tasks(temp.path(), &["--filter", "kind=ACTOR_TASK"]);
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|call| call["actor_id"].is_string()), "{calls:#?}");
    let table = raylet(temp.path(), &["list", "tasks", "--format", "table", "--job", &job]);
    assert!(
        table.contains("14 of 14 tasks") && table.contains("introspection::square"),
        "{table}"
    );

    let summary = raylet(temp.path(), &["summary", "tasks", "--job", &job]);
    let square_row = summary.lines().find(|line| line.contains("::square "));
    assert!(square_row.is_some_and(|row| row.contains("FINISHED: 10")), "{summary}");
    assert!(summary.contains("FAILED: 1"), "{summary}");

    let trace_file = temp.path().join("trace.json");
    let printed = raylet(
        temp.path(),
        &["timeline", "--job", &job, "-o", trace_file.to_str().unwrap()],
    );
    assert!(printed.contains("Wrote 14 task runs"), "{printed}");
    assert!(!printed.contains("show no phases"), "the timeline was on: {printed}");
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace_file).unwrap()).unwrap();
    let runs = trace_runs(&trace);
    assert_eq!(runs["task"].len(), 11, "one event per executed task: {runs:#?}");
    assert_eq!(runs["actor_task"].len(), 3, "{runs:#?}");

    let samples = metrics(&dashboard, &token);
    let series = |state: &str| {
        format!(
            r#"raylet_tasks{{function="{}::square",state="{state}"}}"#,
            module_path!()
        )
    };
    assert_eq!(samples.get(&series("FINISHED")), Some(&10.0), "{samples:#?}");
    let scheduled = samples["raylet_task_scheduling_latency_seconds_count"];
    assert!(scheduled >= 14.0, "{scheduled}");
    let reports = r#"raylet_grpc_server_handling_seconds_count{method="raylet.v1.TaskEventService/ReportTaskEvents"}"#;
    assert!(samples[reports] >= 1.0);

    let plain = small_job(&head, temp.path(), false);
    let after = metrics(&dashboard, &token);
    assert_eq!(
        after.get(&series("FINISHED")),
        Some(&20.0),
        "the counts move with each job"
    );
    assert!(total(&after, "raylet_task_scheduling_latency_seconds_count") >= scheduled + 14.0);
    let printed = raylet(
        temp.path(),
        &["timeline", "--job", &plain, "-o", trace_file.to_str().unwrap()],
    );
    assert!(
        printed.contains("Wrote 14 task runs") && printed.contains("14 runs show no phases"),
        "{printed}"
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace_file).unwrap()).unwrap();
    assert_eq!(trace_runs(&trace)["task"].len(), 11);

    let (status, body) = get(&dashboard, &format!("/api/tasks/summary?job={plain}"), Some(&token));
    assert_eq!(status, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert!(
        summary
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["states"]["FINISHED"] == 10),
        "{summary}"
    );

    observing_job(&head, temp.path());
    let count = r#"test_introspection_work_seconds_count{phase="work"}"#;
    let all = |s: &BTreeMap<String, f64>| s.get(count).is_some_and(|c| *c >= f64::from(OBSERVATIONS));
    let samples = metrics_when(&dashboard, &token, all);
    assert_eq!(samples[count], f64::from(OBSERVATIONS), "every observation arrives");
    let bucket = |le: &str| samples[&format!(r#"test_introspection_work_seconds_bucket{{phase="work",le="{le}"}}"#)];
    assert_eq!(bucket("0.001"), 5_000.0, "0 and 1 ms, le being inclusive");
    assert_eq!(bucket("0.01"), 27_500.0, "0 to 10 ms");
    assert_eq!(bucket("+Inf"), 50_000.0);
    let sum = samples[r#"test_introspection_work_seconds_sum{phase="work"}"#];
    assert!((sum - 475.0).abs() < 1e-6, "2,500 times 0 + 1 + ... + 19 ms: {sum}");
}

#[test]
fn a_long_task_is_listed_as_running_until_it_finishes() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = head_address(temp.path());
    let cluster: Cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let long = nap::remote(&cluster, 4_000).unwrap();
    let queued = nap::remote(&cluster, 10).unwrap();
    let job = cluster.job_id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let states = loop {
        let tasks = list_tasks(temp.path(), &["--job", &job]);
        let states: Vec<String> = tasks.iter().map(|t| t["state"].as_str().unwrap().to_string()).collect();
        if states.contains(&"RUNNING".to_string()) {
            break states;
        }
        assert!(Instant::now() < deadline, "never listed as running: {tasks:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(states.len(), 2, "{states:?}");
    assert!(
        states.contains(&"PENDING_NODE_ASSIGNMENT".to_string()),
        "the second nap waits for the only CPU: {states:?}"
    );
    assert_eq!(cluster.get(&long).unwrap(), 4_000);
    assert_eq!(cluster.get(&queued).unwrap(), 10);
    cluster.shutdown().unwrap();
    let tasks = list_tasks(temp.path(), &["--job", &job]);
    assert!(tasks.iter().all(|t| t["state"] == "FINISHED"), "{tasks:#?}");
}

#[test]
fn raylet_logs_shows_what_a_task_an_actor_and_a_worker_printed() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "2"]);
    let head = head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let words = ["alpha", "beta"].map(|word| shout::remote(&cluster, word.to_string()).unwrap());
    assert_eq!(cluster.get_all(&words).unwrap(), vec![5, 4]);
    let speaker = Speaker::remote(&cluster, "speaker says".to_string()).spawn().unwrap();
    assert_eq!(speaker.say("hi".to_string()).get().unwrap(), 2);
    let job = cluster.job_id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let shouts = loop {
        let shouts = list_tasks(temp.path(), &["--job", &job, "--filter", "state=FINISHED"]);
        let shouts: Vec<Value> = shouts
            .into_iter()
            .filter(|task| task["name"].as_str().unwrap().ends_with("::shout"))
            .collect();
        if shouts.len() == 2 {
            break shouts;
        }
        assert!(Instant::now() < deadline, "the shouts were never recorded: {shouts:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    for task in &shouts {
        let id = task["task_id"].as_str().unwrap();
        let out = raylet(temp.path(), &["logs", "--task", id]);
        let err = raylet(temp.path(), &["logs", "--task", id, "--err"]);
        let word = match out.contains("alpha") {
            true => "alpha",
            false => "beta",
        };
        assert_eq!(out, format!("shout: {word}\n"), "only the task's own line");
        assert_eq!(err, format!("whisper: {word}\n"));
        let worker = task["worker_id"].as_str().unwrap();
        let whole = raylet(temp.path(), &["logs", "--worker", worker]);
        assert!(
            whole.contains(&format!("shout: {word}")) && whole.contains(":task_start:"),
            "{whole}"
        );
    }
    let actor = raylet(
        temp.path(),
        &["logs", "--actor", &speaker.id().to_string(), "--tail", "1"],
    );
    assert_eq!(actor, "speaker says hi\n");
    let missing = std::process::Command::new(common::RAYLET)
        .args(["logs", "--pid", "1", "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(
        message.contains("no log file") && message.contains("any alive node"),
        "{message}"
    );
    cluster.shutdown().unwrap();
}

#[test]
fn a_task_whose_worker_died_is_listed_failed_then_finished_on_its_retry() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let marker = temp.path().join("died").to_string_lossy().into_owned();
    assert_eq!(dies_once::remote(&cluster, marker).unwrap().get().unwrap(), 7);
    let job = cluster.job_id().to_string();
    cluster.shutdown().unwrap();
    let mut attempts = list_tasks(temp.path(), &["--job", &job]);
    attempts.sort_by_key(|task| task["attempt"].as_u64());
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!(attempts[0]["task_id"], attempts[1]["task_id"]);
    assert_eq!(attempts[0]["state"], "FAILED");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(
        error.contains("the worker process") && error.contains("signal 6"),
        "{error}"
    );
    assert_eq!(attempts[1]["state"], "FINISHED");
    assert!(
        attempts[1]["name"].as_str().unwrap().ends_with("::dies_once"),
        "the retry keeps its name"
    );
}
