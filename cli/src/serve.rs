//! `raylet serve deploy|status|delete`: Serve applications operated through
//! what the Serve controller keeps on the head, without linking raylet-serve:
//! each application's desired state under `apps/<name>` in the key-value
//! namespace `_raylet_serve`, and the status it publishes for the dashboard
//! as the `serve` section's `status` entry. A deploy runs the user's binary
//! as a job with the application's YAML file shipped beside it (in its
//! working directory, named in `RAYLET_SERVE_DEPLOY_FILE`: an environment
//! variable holds at most 128 KiB on Linux), and
//! succeeds only when the job, having exited 0, recorded that it deployed
//! (under `deploys/<job id>` in the same namespace): a binary that does
//! not link raylet-serve exits 0 having deployed nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use raylet::{Job, JobStatus};
use raylet_common::auth::AuthToken;
use raylet_proto::v1::KvDeleteRequest;
use raylet_proto::v1::kv_service_client::KvServiceClient;
use serde::Deserialize;
use serde_json::Value;

use crate::args::{ClusterArgs, OutputFormat, ServeCommand, ServeDeleteArgs, ServeDeployArgs, StatusArgs};

/// The head's key-value namespace of the controller's desired state.
const SERVE_NAMESPACE: &str = "_raylet_serve";
/// The dashboard section the controller publishes its status in.
const STATUS_SECTION: &str = "serve";
/// The variable that names the application's YAML file, shipped with the
/// deploy job into its working directory.
const DEPLOY_FILE_VARIABLE: &str = "RAYLET_SERVE_DEPLOY_FILE";
/// Where a deploy job records, under its job id, that it deployed.
const DEPLOYED_PREFIX: &str = "deploys/";
/// What `raylet serve status` says when no controller published a status.
const NOT_RUNNING: &str = "Serve is not running on this cluster";
/// How long a call waits to reach the head.
const PATIENCE: Duration = Duration::from_secs(2);
/// The age past which a status is stale: the controller publishes about once a second.
const STALE_AFTER: Duration = Duration::from_secs(10);
/// How often `raylet serve delete` reads the status while it waits.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

pub fn serve(command: ServeCommand) -> anyhow::Result<ExitCode> {
    match command {
        ServeCommand::Deploy(args) => deploy(args),
        ServeCommand::Status(args) => status(args).map(|()| ExitCode::SUCCESS),
        ServeCommand::Delete(args) => delete(args).map(|()| ExitCode::SUCCESS),
    }
}

/// The status the controller published last, as JSON; `None` when no
/// controller ever published one.
async fn published_status(address: &str, token: &AuthToken) -> anyhow::Result<Option<Value>> {
    let entries = raylet::dashboard_entries(address, token, STATUS_SECTION)
        .await
        .with_context(|| format!("reading the Serve status from the head at {address}"))?;
    Ok(entries.into_iter().next())
}

fn status(args: StatusArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let published = crate::runtime()?.block_on(published_status(&address, &token))?;
    let output = match (published, args.format) {
        (None, OutputFormat::Json) => {
            eprintln!("{NOT_RUNNING}");
            "null".to_string()
        }
        (None, OutputFormat::Text) => NOT_RUNNING.to_string(),
        (Some(status), OutputFormat::Json) => serde_json::to_string_pretty(&status)?,
        (Some(status), OutputFormat::Text) => {
            let status: ServeStatus = serde_json::from_value(status)
                .context("the Serve status on the head is not in the form this CLI reads; see it with --format json")?;
            render(&status, unix_ms_now())
        }
    };
    println!("{output}");
    Ok(())
}

fn unix_ms_now() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    since_epoch.as_millis() as u64
}

/// The controller's status, as `raylet serve status` draws it: the fields
/// of the published JSON that the table shows.
#[derive(Debug, Deserialize)]
struct ServeStatus {
    updated_at_ms: u64,
    controller: ControllerStatus,
    proxies: Vec<ProxyStatus>,
    #[serde(default)]
    proxy_failures: Vec<ProxyFailureStatus>,
    apps: Vec<AppStatus>,
}

#[derive(Debug, Deserialize)]
struct ControllerStatus {
    node_id: String,
    pid: u32,
}

#[derive(Debug, Deserialize)]
struct ProxyStatus {
    node_id: String,
    address: String,
}

#[derive(Debug, Deserialize)]
struct ProxyFailureStatus {
    node_id: String,
    failures: u32,
    last_error: String,
    retry_in_ms: u64,
}

#[derive(Debug, Deserialize)]
struct AppStatus {
    name: String,
    route_prefix: String,
    public: bool,
    state: String,
    message: String,
    deployments: Vec<DeploymentStatus>,
}

#[derive(Debug, Deserialize)]
struct DeploymentStatus {
    name: String,
    class: String,
    version: String,
    target_replicas: u32,
    replicas: Vec<ReplicaStatus>,
    requests: RequestCounts,
    autoscaling: Option<AutoscalingStatus>,
    /// The deployment's own figures (tokens per second, latencies); none
    /// in a status from before they were reported.
    #[serde(default)]
    figures: Vec<Figure>,
}

#[derive(Debug, Deserialize)]
struct Figure {
    name: String,
    value: f64,
}

#[derive(Debug, Deserialize)]
struct ReplicaStatus {
    #[serde(default)]
    name: String,
    state: String,
    ongoing: u32,
    /// What it waits for before it can be placed; empty when it does not.
    #[serde(default)]
    waiting: String,
}

#[derive(Debug, Deserialize)]
struct RequestCounts {
    total: u64,
    errors: u64,
}

#[derive(Debug, Deserialize)]
struct AutoscalingStatus {
    min_replicas: u32,
    max_replicas: u32,
    target_ongoing_requests: f64,
    desired: u32,
    average_ongoing: f64,
    queued: u32,
    decision: String,
}

/// The status as text: the controller, then tables of the applications,
/// the deployments (each with its autoscaling decision and its figures
/// under it, then the replicas that wait for resources) and the proxies
/// (then those that fail to start). `now_ms` dates the status.
fn render(status: &ServeStatus, now_ms: u64) -> String {
    let mut out = String::new();
    let published = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(status.updated_at_ms));
    let age = Duration::from_millis(now_ms.saturating_sub(status.updated_at_ms));
    let _ = writeln!(
        out,
        "======== Serve status: {published} ({}) ========",
        describe_age(age)
    );
    let controller = &status.controller;
    let _ = writeln!(
        out,
        "Controller: pid {} on node {}",
        controller.pid,
        short(&controller.node_id)
    );
    section(&mut out, "Applications", app_lines(&status.apps));
    let deployments: Vec<(&AppStatus, &DeploymentStatus)> = status
        .apps
        .iter()
        .flat_map(|app| app.deployments.iter().map(move |deployment| (app, deployment)))
        .collect();
    let mut lines = deployment_lines(&deployments);
    lines.extend(titled("Waiting", waiting_lines(&status.apps)));
    section(&mut out, "Deployments", lines);
    let mut lines = proxy_lines(&status.proxies);
    lines.extend(titled("Failing to start", proxy_failure_lines(&status.proxy_failures)));
    section(&mut out, "Proxies", lines);
    out.trim_end().to_string()
}

/// How old the status is; a controller publishes about once a second, so
/// an old one is marked stale.
fn describe_age(age: Duration) -> String {
    if age <= STALE_AFTER {
        return format!("{:.1} s ago", age.as_secs_f64());
    }
    let whole = humantime::format_duration(Duration::from_secs(age.as_secs()));
    format!("{whole} ago: stale, the controller may be down")
}

/// A titled part of the status: its lines, or "(none)".
fn section(out: &mut String, title: &str, lines: Vec<String>) {
    let _ = writeln!(out, "\n{title}\n{}", "-".repeat(64));
    match lines.is_empty() {
        true => {
            let _ = writeln!(out, "(none)");
        }
        false => {
            let _ = writeln!(out, "{}", lines.join("\n"));
        }
    }
}

fn app_lines(apps: &[AppStatus]) -> Vec<String> {
    if apps.is_empty() {
        return Vec::new();
    }
    let header = ["NAME", "ROUTE", "PUBLIC", "STATE", "MESSAGE"]
        .map(String::from)
        .to_vec();
    let rows = apps.iter().map(|app| {
        let public = if app.public { "yes" } else { "no" };
        let message = app.message.lines().collect::<Vec<_>>().join(" ");
        let message = if message.is_empty() { "-".to_string() } else { message };
        vec![
            app.name.clone(),
            app.route_prefix.clone(),
            public.into(),
            app.state.clone(),
            message,
        ]
    });
    aligned(&std::iter::once(header).chain(rows).collect::<Vec<_>>())
}

/// A row per deployment, each followed by its autoscaling line if it
/// scales and a line per figure it reports.
fn deployment_lines(deployments: &[(&AppStatus, &DeploymentStatus)]) -> Vec<String> {
    if deployments.is_empty() {
        return Vec::new();
    }
    let header = [
        "APP",
        "DEPLOYMENT",
        "CLASS",
        "VERSION",
        "TARGET",
        "REPLICAS",
        "ONGOING",
        "REQUESTS",
        "ERRORS",
    ]
    .map(String::from)
    .to_vec();
    let rows = deployments
        .iter()
        .map(|(app, deployment)| deployment_row(app, deployment));
    let mut table = aligned(&std::iter::once(header).chain(rows).collect::<Vec<_>>()).into_iter();
    let mut lines: Vec<String> = table.next().into_iter().collect();
    for ((_, deployment), row) in deployments.iter().zip(table) {
        lines.push(row);
        lines.extend(deployment.autoscaling.as_ref().map(autoscaling_line));
        lines.extend(deployment.figures.iter().map(figure_line));
    }
    lines
}

/// A figure to three decimals, e.g. `  tokens_per_s: 812.5`.
fn figure_line(figure: &Figure) -> String {
    let rounded = (figure.value * 1000.0).round() / 1000.0;
    format!("  {}: {rounded}", figure.name)
}

fn deployment_row(app: &AppStatus, deployment: &DeploymentStatus) -> Vec<String> {
    let ongoing: u32 = deployment.replicas.iter().map(|replica| replica.ongoing).sum();
    vec![
        app.name.clone(),
        deployment.name.clone(),
        deployment.class.clone(),
        deployment.version.clone(),
        deployment.target_replicas.to_string(),
        replica_counts(&deployment.replicas),
        ongoing.to_string(),
        deployment.requests.total.to_string(),
        deployment.requests.errors.to_string(),
    ]
}

/// How many replicas are in each state, e.g. `2 RUNNING, 1 STARTING`.
fn replica_counts(replicas: &[ReplicaStatus]) -> String {
    let mut counts = BTreeMap::new();
    for replica in replicas {
        *counts.entry(replica.state.as_str()).or_insert(0) += 1;
    }
    match counts.is_empty() {
        true => "0".to_string(),
        false => {
            let counts: Vec<String> = counts.iter().map(|(state, count)| format!("{count} {state}")).collect();
            counts.join(", ")
        }
    }
}

/// The autoscaler's bounds, inputs and decision, e.g. `autoscaling 1..3
/// replicas, 2 ongoing each: average 5.6 ongoing, 0 queued, desired 3:
/// scale up to 3 in 0.4 s`.
fn autoscaling_line(autoscaling: &AutoscalingStatus) -> String {
    format!(
        "  autoscaling {}..{} replicas, {} ongoing each: average {:.1} ongoing, {} queued, desired {}: {}",
        autoscaling.min_replicas,
        autoscaling.max_replicas,
        autoscaling.target_ongoing_requests,
        autoscaling.average_ongoing,
        autoscaling.queued,
        autoscaling.desired,
        autoscaling.decision
    )
}

/// `title:` and the lines, each indented by a space, as the autoscaler's
/// `Waiting:` lines are; nothing when there are no lines.
fn titled(title: &str, lines: Vec<String>) -> Vec<String> {
    if lines.is_empty() {
        return lines;
    }
    let body = lines.into_iter().map(|line| format!(" {line}"));
    std::iter::once(format!("{title}:")).chain(body).collect()
}

/// A line per replica that waits for resources: its name and what for.
fn waiting_lines(apps: &[AppStatus]) -> Vec<String> {
    let replicas = apps
        .iter()
        .flat_map(|app| &app.deployments)
        .flat_map(|deployment| &deployment.replicas);
    replicas
        .filter(|replica| !replica.waiting.is_empty())
        .map(|replica| format!("{} {}", replica.name, replica.waiting))
        .collect()
}

/// A line per node whose proxy fails to start, e.g. `node ab12cd34: 3
/// failed starts, next try in 4 s; last: Address already in use`.
fn proxy_failure_lines(failures: &[ProxyFailureStatus]) -> Vec<String> {
    failures
        .iter()
        .map(|failure| {
            format!(
                "node {}: {} failed starts, next try in {} s; last: {}",
                short(&failure.node_id),
                failure.failures,
                failure.retry_in_ms.div_ceil(1000),
                failure.last_error.lines().collect::<Vec<_>>().join(" ")
            )
        })
        .collect()
}

fn proxy_lines(proxies: &[ProxyStatus]) -> Vec<String> {
    if proxies.is_empty() {
        return Vec::new();
    }
    let header = vec!["ADDRESS".to_string(), "NODE".to_string()];
    let rows = proxies
        .iter()
        .map(|proxy| vec![proxy.address.clone(), short(&proxy.node_id)]);
    aligned(&std::iter::once(header).chain(rows).collect::<Vec<_>>())
}

/// Rows of cells as lines, each column as wide as its widest cell.
fn aligned(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            let cells = rows.iter().filter_map(|row| row.get(column));
            cells.map(|cell| cell.chars().count()).max().unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect()
}

/// The first 8 characters of a node id.
fn short(node_id: &str) -> String {
    node_id.chars().take(8).collect()
}

fn delete(args: ServeDeleteArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let timeout = Duration::from_secs(args.timeout);
    crate::runtime()?.block_on(async {
        delete_desired_state(&address, &token, &args.app).await?;
        wait_until_gone(&address, &token, &args.app, timeout).await
    })?;
    println!("deleted {}", args.app);
    Ok(())
}

/// Deletes the application's desired state, which tells the controller to
/// tear it down; an application without one is an error.
async fn delete_desired_state(address: &str, token: &AuthToken, app: &str) -> anyhow::Result<()> {
    let channel = raylet_proto::channel::connect(address, token, PATIENCE)
        .await
        .with_context(|| format!("connecting to the head at {address}"))?;
    let request = KvDeleteRequest {
        namespace: SERVE_NAMESPACE.to_string(),
        key: format!("apps/{app}").into_bytes(),
    };
    let deleted = KvServiceClient::new(channel)
        .kv_delete(request)
        .await
        .map_err(raylet_proto::Error::from)
        .with_context(|| format!("deleting Serve application `{app}` at the head at {address}"))?
        .into_inner()
        .deleted;
    ensure!(
        deleted,
        "no Serve application `{app}` (`raylet serve status` lists the applications)"
    );
    Ok(())
}

/// Polls the published status until it no longer lists `app`.
async fn wait_until_gone(address: &str, token: &AuthToken, app: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while lists_app(published_status(address, token).await?.as_ref(), app) {
        if Instant::now() >= deadline {
            bail!(
                "the Serve controller did not tear down `{app}` within {} s: the status still lists it \
                 (`raylet serve status` shows its state)",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Deletes the record deploy job `job` leaves once it deployed; returns
/// whether there was one.
async fn take_deploy_record(address: &str, token: &AuthToken, job: &str) -> anyhow::Result<bool> {
    let channel = raylet_proto::channel::connect(address, token, PATIENCE)
        .await
        .with_context(|| format!("connecting to the head at {address}"))?;
    let request = KvDeleteRequest {
        namespace: SERVE_NAMESPACE.to_string(),
        key: format!("{DEPLOYED_PREFIX}{job}").into_bytes(),
    };
    let reply = KvServiceClient::new(channel)
        .kv_delete(request)
        .await
        .map_err(raylet_proto::Error::from)
        .with_context(|| format!("reading whether job {job} deployed, at the head at {address}"))?;
    Ok(reply.into_inner().deleted)
}

/// What keeps `app` from running in a published status, a line each: its
/// replicas that wait and what for, and the proxies that fail to start.
fn problems(status: &Value, app: &str) -> Vec<String> {
    let Ok(status) = serde_json::from_value::<ServeStatus>(status.clone()) else {
        return Vec::new();
    };
    let apps: Vec<AppStatus> = status.apps.into_iter().filter(|listed| listed.name == app).collect();
    let mut lines = waiting_lines(&apps);
    lines.extend(proxy_failure_lines(&status.proxy_failures));
    lines
}

fn lists_app(status: Option<&Value>, app: &str) -> bool {
    let apps = status.and_then(|status| status["apps"].as_array());
    apps.is_some_and(|apps| apps.iter().any(|listed| listed["name"] == app))
}

fn deploy(args: ServeDeployArgs) -> anyhow::Result<ExitCode> {
    let app = AppFile::read(&args.file)?;
    let timeout = Duration::from_secs(args.timeout);
    crate::runtime()?.block_on(run_deploy_job(&args.cluster, &app, timeout))
}

/// An application's YAML file, checked as far as the CLI can: the rest is
/// raylet-serve's to check, in the deploy job.
#[derive(Debug)]
struct AppFile {
    /// The file, shipped with the deploy job as it is.
    path: PathBuf,
    name: String,
    /// The binary, relative to the current directory or absolute.
    binary: PathBuf,
}

/// The fields of an application's YAML file that the CLI reads.
#[derive(Deserialize)]
struct AppFileFields {
    binary: PathBuf,
    name: String,
    deployments: Vec<serde_yaml_ng::Value>,
}

impl AppFile {
    fn read(path: &Path) -> anyhow::Result<AppFile> {
        let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let fields: AppFileFields = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("{} is not a Serve application's YAML", path.display()))?;
        ensure!(!fields.name.is_empty(), "{}: `name` is empty", path.display());
        ensure!(
            !fields.deployments.is_empty(),
            "{}: `deployments` lists no deployment",
            path.display()
        );
        let directory = path.parent().unwrap_or(Path::new(""));
        let binary = directory.join(&fields.binary);
        check_executable(&binary, path)?;
        Ok(AppFile {
            path: path.to_path_buf(),
            name: fields.name,
            binary,
        })
    }
}

/// Fails unless `binary`, named by the YAML file `file`, is an executable file.
fn check_executable(binary: &Path, file: &Path) -> anyhow::Result<()> {
    let named = || format!("the binary {} that {} names", binary.display(), file.display());
    let metadata = match fs::metadata(binary) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} does not exist: build it first (a relative `binary` is taken from the YAML file's directory)",
            named()
        ),
        other => other.with_context(named)?,
    };
    ensure!(metadata.is_file(), "{} is not a file", named());
    ensure!(
        metadata.permissions().mode() & 0o111 != 0,
        "{} is not executable",
        named()
    );
    Ok(())
}

/// Runs the application's binary as a job that deploys it, printing its
/// output; exits with the job's status.
async fn run_deploy_job(cluster: &ClusterArgs, app: &AppFile, timeout: Duration) -> anyhow::Result<ExitCode> {
    let client = crate::job::connect(cluster).await?;
    let file_name = app.path.file_name().unwrap_or_default().to_string_lossy();
    let job = Job::new(&app.binary)
        .name(format!("serve deploy {}", app.name))
        .files([&app.path])
        .env(DEPLOY_FILE_VARIABLE, file_name);
    let submitted = client
        .submit(&job)
        .await
        .with_context(|| format!("submitting {}", app.binary.display()))?;
    let id = submitted.id;
    eprintln!("job {id} deploys Serve application `{}`", app.name);
    let Ok(ended) = tokio::time::timeout(timeout, crate::job::follow_to_end(&client, id)).await else {
        let (address, token) = cluster.head()?;
        let waiting = match published_status(&address, &token).await {
            Ok(Some(status)) => problems(&status, &app.name),
            _ => Vec::new(),
        };
        let waiting: String = titled("Waiting", waiting)
            .iter()
            .map(|line| format!("\n{line}"))
            .collect();
        bail!(
            "Serve application `{}` was not deployed within {} s; its deploy job {id} goes on \
             (raylet job logs --follow {id}; raylet serve status){waiting}",
            app.name,
            timeout.as_secs(),
        );
    };
    let info = ended?;
    if info.status == JobStatus::Succeeded {
        let (address, token) = cluster.head()?;
        if !take_deploy_record(&address, &token, &id.to_string()).await? {
            eprintln!(
                "error: {} exited 0 without deploying Serve application `{}`: a binary that deploys links \
                 raylet-serve and registers the file's deployment classes (raylet_serve::register_deployment!); \
                 raylet-serve then deploys the file before main and records that it did (raylet job logs {id})",
                app.binary.display(),
                app.name
            );
            return Ok(ExitCode::FAILURE);
        }
        println!("deployed {}", app.name);
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "error: deploying Serve application `{}` failed: job {id} {}: {}",
        app.name, info.status, info.message
    );
    Ok(crate::job::exit_code_of(&info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(state: &str, ongoing: u32) -> Value {
        serde_json::json!({
            "name": "r", "state": state, "version": "3f9a1c22", "node_id": "ab12", "pid": 1, "ongoing": ongoing
        })
    }

    fn demo_status() -> Value {
        serde_json::json!({
            "updated_at_ms": 1_764_180_000_000u64,
            "controller": {"node_id": "ab12cd34ef56", "pid": 4242},
            "proxies": [{"node_id": "ab12cd34ef56", "address": "127.0.0.1:8000"}],
            "apps": [{
                "name": "digits", "route_prefix": "/classify", "public": false,
                "state": "DEPLOY_FAILED", "message": "the constructor panicked\nat line 3",
                "deployments": [{
                    "name": "classifier", "class": "serve_digits::Classifier", "version": "3f9a1c22",
                    "target_replicas": 3, "max_ongoing_requests": 32,
                    "replicas": [replica("RUNNING", 3), replica("RUNNING", 2), replica("STARTING", 0)],
                    "requests": {"total": 1200, "errors": 3},
                    "figures": [{"name": "tokens_per_s", "value": 812.5, "combine": "Sum"},
                        {"name": "ttft_p99_s", "value": 0.123456, "combine": "Mean"}],
                    "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2.0,
                        "current": 2, "desired": 3, "average_ongoing": 5.6, "queued": 1,
                        "decision": "scale up to 3 in 0.4 s (held 0.6 s of 1.0 s)"}
                }, {
                    "name": "fixed", "class": "serve_digits::Fixed", "version": "77aa",
                    "target_replicas": 1, "max_ongoing_requests": 8, "replicas": [],
                    "requests": {"total": 0, "errors": 0}, "autoscaling": null
                }]
            }]
        })
    }

    #[test]
    fn the_table_shows_apps_deployments_replica_states_autoscaling_figures_and_proxies() {
        let status: ServeStatus = serde_json::from_value(demo_status()).unwrap();
        let text = render(&status, 1_764_180_002_500);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "======== Serve status: 2025-11-26T18:00:00Z (2.5 s ago) ========"
        );
        assert!(text.contains("Controller: pid 4242 on node ab12cd34\n"), "{text}");
        assert!(
            text.contains("digits  /classify  no      DEPLOY_FAILED  the constructor panicked at line 3"),
            "{text}"
        );
        let classifier = lines.iter().position(|line| line.contains("classifier")).unwrap();
        let cells: Vec<&str> = lines[classifier]
            .split("  ")
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .collect();
        assert_eq!(
            cells,
            [
                "digits",
                "classifier",
                "serve_digits::Classifier",
                "3f9a1c22",
                "3",
                "2 RUNNING, 1 STARTING",
                "5",
                "1200",
                "3"
            ]
        );
        assert_eq!(
            lines[classifier + 1],
            "  autoscaling 1..3 replicas, 2 ongoing each: average 5.6 ongoing, 1 queued, desired 3: \
             scale up to 3 in 0.4 s (held 0.6 s of 1.0 s)"
        );
        assert_eq!(lines[classifier + 2], "  tokens_per_s: 812.5");
        assert_eq!(lines[classifier + 3], "  ttft_p99_s: 0.123");
        assert!(lines[classifier + 4].starts_with("digits  fixed "), "{text}");
        assert!(lines[classifier + 4].contains(" 77aa "), "{text}");
        let header = lines[classifier - 1];
        assert_eq!(
            header.find("REPLICAS"),
            lines[classifier].find("2 RUNNING"),
            "columns line up:\n{text}"
        );
        assert!(
            text.ends_with("ADDRESS         NODE\n127.0.0.1:8000  ab12cd34"),
            "{text}"
        );
    }

    #[test]
    fn replicas_that_wait_and_proxies_that_fail_to_start_are_listed_under_their_sections() {
        let mut status = demo_status();
        status["apps"][0]["deployments"][0]["replicas"][2]["name"] = "replica:digits:classifier:2".into();
        status["apps"][0]["deployments"][0]["replicas"][2]["waiting"] =
            "waits for {CPU: 1}: no node has it free (CPU: 0 of 2 free in the cluster)".into();
        status["proxy_failures"] = serde_json::json!([{
            "node_id": "cd34ef56ab12", "failures": 4, "retry_in_ms": 7200,
            "last_error": "Address already in use (os error 98)"
        }]);
        let text = render(&serde_json::from_value(status.clone()).unwrap(), 1_764_180_000_000);
        assert!(
            text.contains(
                "\nWaiting:\n replica:digits:classifier:2 waits for {CPU: 1}: no node has it free \
                 (CPU: 0 of 2 free in the cluster)\n\nProxies"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "127.0.0.1:8000  ab12cd34\nFailing to start:\n node cd34ef56: 4 failed starts, next try in 8 s; \
                 last: Address already in use (os error 98)"
            ),
            "{text}"
        );
        assert_eq!(
            problems(&status, "digits"),
            [
                "replica:digits:classifier:2 waits for {CPU: 1}: no node has it free (CPU: 0 of 2 free in the cluster)",
                "node cd34ef56: 4 failed starts, next try in 8 s; last: Address already in use (os error 98)"
            ]
        );
        assert_eq!(problems(&status, "other").len(), 1, "only the proxies");
    }

    #[test]
    fn an_old_status_without_apps_or_proxies_is_stale_and_says_none() {
        let mut status = demo_status();
        status["apps"] = serde_json::json!([]);
        status["proxies"] = serde_json::json!([]);
        let text = render(&serde_json::from_value(status).unwrap(), 1_764_180_000_000 + 3_723_400);
        assert!(
            text.starts_with(
                "======== Serve status: 2025-11-26T18:00:00Z (1h 2m 3s ago: stale, the controller may be down)"
            ),
            "{text}"
        );
        assert_eq!(text.matches("(none)").count(), 3, "{text}");
    }

    #[test]
    fn an_app_is_listed_until_the_status_drops_it() {
        assert!(lists_app(Some(&demo_status()), "digits"));
        assert!(!lists_app(Some(&demo_status()), "digit"));
        assert!(!lists_app(Some(&serde_json::json!({"apps": []})), "digits"));
        assert!(!lists_app(None, "digits"));
    }

    /// Writes `yaml` as app.yaml in a new directory, with an executable
    /// `bin/serve_app` beside it.
    fn app_dir(yaml: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("bin")).unwrap();
        let binary = dir.path().join("bin/serve_app");
        fs::write(&binary, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&binary, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.path().join("app.yaml"), yaml).unwrap();
        dir
    }

    const GOOD: &str = "binary: bin/serve_app\nname: digits\nroute_prefix: /classify\n\
                        deployments:\n  - name: classifier\n    class: serve_digits::Classifier\n";

    fn read_error(yaml: &str) -> String {
        let dir = app_dir(yaml);
        format!("{:#}", AppFile::read(&dir.path().join("app.yaml")).unwrap_err())
    }

    #[test]
    fn an_app_file_keeps_its_path_and_finds_its_binary_beside_it() {
        let dir = app_dir(GOOD);
        let app = AppFile::read(&dir.path().join("app.yaml")).unwrap();
        assert_eq!(app.name, "digits");
        assert_eq!(app.path, dir.path().join("app.yaml"));
        assert_eq!(app.binary, dir.path().join("bin/serve_app"));
    }

    #[test]
    fn an_app_file_that_cannot_be_deployed_is_a_clear_error() {
        let bad_yaml = read_error("binary: [unclosed\nname: digits\n");
        assert!(
            bad_yaml.contains("app.yaml is not a Serve application's YAML: "),
            "{bad_yaml}"
        );
        let no_name = read_error(&GOOD.replace("name: digits\n", ""));
        assert!(no_name.contains("missing field `name`"), "{no_name}");
        let no_deployments = read_error("binary: bin/serve_app\nname: digits\n");
        assert!(
            no_deployments.contains("missing field `deployments`"),
            "{no_deployments}"
        );
        let empty = read_error("binary: bin/serve_app\nname: digits\ndeployments: []\n");
        assert!(empty.contains("`deployments` lists no deployment"), "{empty}");
        let missing = read_error(&GOOD.replace("bin/serve_app", "bin/not_built"));
        assert!(missing.contains("bin/not_built that "), "{missing}");
        assert!(missing.contains("does not exist: build it first"), "{missing}");
        let directory = read_error(&GOOD.replace("bin/serve_app", "bin"));
        assert!(directory.ends_with("is not a file"), "{directory}");
    }

    #[test]
    fn a_binary_without_the_executable_bit_is_refused() {
        let dir = app_dir(GOOD);
        let binary = dir.path().join("bin/serve_app");
        fs::set_permissions(&binary, fs::Permissions::from_mode(0o644)).unwrap();
        let error = format!("{:#}", AppFile::read(&dir.path().join("app.yaml")).unwrap_err());
        assert!(error.ends_with("is not executable"), "{error}");
        assert!(error.contains(&binary.display().to_string()), "{error}");
    }
}
