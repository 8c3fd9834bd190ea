//! Deploying from a file: `raylet serve deploy app.yaml` submits the
//! file's `binary` (the user's build, which registers the deployments) as
//! a job with the file's text in [`DEPLOY_ENV`]. In that process, a hook
//! that runs before `main` reads the file, builds the [`Application`]
//! (each `init` and `user_config`, given as YAML, decoded into the class's
//! own types through the registry), deploys it through the controller,
//! prints the outcome and exits without running `main`: the job's log is
//! the deploy's log (with a `waiting:` line whenever what keeps the
//! application from running changes) and its exit code the outcome. A
//! deploy that succeeded also records so under [`DEPLOYED_PREFIX`]: a
//! binary without this hook exits 0 having deployed nothing.
//!
//! ```yaml
//! binary: ./target/release/examples/serve_digits
//! name: digits
//! route_prefix: /classify
//! deployments:
//!   - name: classifier
//!     class: serve_digits::Classifier
//!     num_replicas: 2
//!     max_ongoing_requests: 32
//!     init: {checkpoint: /tmp/digits}
//! http: {port: 8000}
//! ```

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{Application, AutoscalingConfig, DeploymentConfig, HttpOptions};
use crate::controller::KV_NAMESPACE;
use crate::error::{Result, ServeError};
use crate::registry;
use crate::status::AppState;

/// The variable that carries a deploy file's text to the user's binary.
pub const DEPLOY_ENV: &str = "RAYLET_SERVE_DEPLOY";
/// The variable that names a deploy file for the user's binary to read,
/// relative to its working directory: how `raylet serve deploy` passes the
/// file (shipped with the job), since Linux caps one environment variable
/// at 128 KiB.
pub const DEPLOY_FILE_ENV: &str = "RAYLET_SERVE_DEPLOY_FILE";
/// A deploy job that deployed its application records so under this
/// prefix and its job id, in the key-value namespace `_raylet_serve`, with
/// the application's name: `raylet serve deploy` takes the record away and
/// counts a job that exited 0 without one (a binary that does not link
/// raylet-serve, `/bin/true`) as a failure.
pub const DEPLOYED_PREFIX: &str = "deploys/";
/// The variable a node manager gives a submitted job's driver its id in.
const JOB_ID_ENV: &str = "RAYLET_JOB_ID";

/// A deploy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployFile {
    /// The build to submit: the CLI's business, read here only so that
    /// unknown fields can be refused.
    #[serde(rename = "binary")]
    _binary: Option<serde::de::IgnoredAny>,
    name: String,
    route_prefix: String,
    #[serde(default)]
    public: bool,
    deployments: Vec<DeploymentEntry>,
    http: Option<HttpEntry>,
}

/// One deployment of a deploy file; what is left out takes
/// [`DeploymentConfig`]'s defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeploymentEntry {
    name: String,
    class: String,
    #[serde(default)]
    init: serde_json::Value,
    user_config: Option<serde_json::Value>,
    num_replicas: Option<u32>,
    max_ongoing_requests: Option<u32>,
    max_queued_requests: Option<u32>,
    num_cpus: Option<f64>,
    num_gpus: Option<f64>,
    autoscaling: Option<AutoscalingEntry>,
    health_check_period_s: Option<f64>,
    health_check_timeout_s: Option<f64>,
    graceful_shutdown_timeout_s: Option<f64>,
}

/// Autoscaling as a deploy file gives it, in seconds; Ray Serve's
/// defaults for what is left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoscalingEntry {
    min_replicas: Option<u32>,
    max_replicas: Option<u32>,
    initial_replicas: Option<u32>,
    target_ongoing_requests: Option<f64>,
    upscale_delay_s: Option<f64>,
    downscale_delay_s: Option<f64>,
    metrics_interval_s: Option<f64>,
    look_back_period_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpEntry {
    host: Option<IpAddr>,
    port: Option<u16>,
    request_timeout_s: Option<f64>,
}

/// The application and HTTP options a deploy file describes.
pub fn parse(text: &str) -> Result<(Application, HttpOptions)> {
    let file: DeployFile =
        serde_yaml_ng::from_str(text).map_err(|e| ServeError::InvalidConfig(format!("the deploy file: {e}")))?;
    let mut app = Application::new(&file.name, &file.route_prefix).public(file.public);
    for entry in file.deployments {
        app = app.deployment(deployment(entry)?);
    }
    app.validate()?;
    Ok((app, http(file.http)?))
}

fn deployment(entry: DeploymentEntry) -> Result<DeploymentConfig> {
    let class = registry::find(&entry.class)
        .map_err(|error| ServeError::InvalidConfig(format!("deployment `{}`: {error}", entry.name)))?;
    let invalid = |what: &str, error: registry::EncodeFromJsonError| {
        ServeError::InvalidConfig(format!(
            "deployment `{}`: its {what} is not a {}: {error}",
            entry.name, entry.class
        ))
    };
    let init = (class.encode_init)(entry.init.clone()).map_err(|e| invalid("init", e))?;
    let mut config = DeploymentConfig::from_parts(&entry.name, &entry.class, init);
    if let Some(user_config) = entry.user_config.clone() {
        config.user_config = Some((class.encode_user_config)(user_config).map_err(|e| invalid("user_config", e))?);
    }
    config.num_replicas = entry.num_replicas.unwrap_or(config.num_replicas);
    config.max_ongoing_requests = entry.max_ongoing_requests.unwrap_or(config.max_ongoing_requests);
    config.max_queued_requests = entry.max_queued_requests.or(config.max_queued_requests);
    config.num_cpus = entry.num_cpus.unwrap_or(config.num_cpus);
    config.num_gpus = entry.num_gpus.unwrap_or(config.num_gpus);
    config.autoscaling = entry.autoscaling.map(autoscaling).transpose()?;
    let seconds = |value: Option<f64>, default: Duration| value.map_or(Ok(default), duration);
    config.health_check_period = seconds(entry.health_check_period_s, config.health_check_period)?;
    config.health_check_timeout = seconds(entry.health_check_timeout_s, config.health_check_timeout)?;
    config.graceful_shutdown_timeout = seconds(entry.graceful_shutdown_timeout_s, config.graceful_shutdown_timeout)?;
    Ok(config)
}

fn autoscaling(entry: AutoscalingEntry) -> Result<AutoscalingConfig> {
    let defaults = AutoscalingConfig::default();
    let seconds = |value: Option<f64>, default: Duration| value.map_or(Ok(default), duration);
    Ok(AutoscalingConfig {
        min_replicas: entry.min_replicas.unwrap_or(defaults.min_replicas),
        max_replicas: entry.max_replicas.unwrap_or(defaults.max_replicas),
        initial_replicas: entry.initial_replicas,
        target_ongoing_requests: entry
            .target_ongoing_requests
            .unwrap_or(defaults.target_ongoing_requests),
        upscale_delay: seconds(entry.upscale_delay_s, defaults.upscale_delay)?,
        downscale_delay: seconds(entry.downscale_delay_s, defaults.downscale_delay)?,
        metrics_interval: seconds(entry.metrics_interval_s, defaults.metrics_interval)?,
        look_back_period: seconds(entry.look_back_period_s, defaults.look_back_period)?,
    })
}

fn http(entry: Option<HttpEntry>) -> Result<HttpOptions> {
    let mut options = HttpOptions::default();
    let Some(entry) = entry else {
        return Ok(options);
    };
    options.host = entry.host;
    options.port = entry.port.unwrap_or(options.port);
    if let Some(timeout) = entry.request_timeout_s {
        options.request_timeout = duration(timeout)?;
    }
    Ok(options)
}

/// The longest duration a setting may have, as the CLI's: ten years.
const MAX_SECONDS: f64 = 10.0 * 31_557_600.0;

fn duration(seconds: f64) -> Result<Duration> {
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if seconds <= MAX_SECONDS => Ok(duration),
        _ => Err(ServeError::InvalidConfig(format!(
            "{seconds} is not a number of seconds from 0 to {MAX_SECONDS} (ten years)"
        ))),
    }
}

/// Deploys the file named in [`DEPLOY_FILE_ENV`], or given in
/// [`DEPLOY_ENV`], when this process was started for it (and is not a
/// worker), then exits.
#[ctor::ctor(unsafe)]
fn deploy_from_environment() {
    if std::env::var_os(raylet_common::worker_env::WORKER_ENV).is_some() {
        return;
    }
    let text = match (std::env::var_os(DEPLOY_FILE_ENV), std::env::var_os(DEPLOY_ENV)) {
        (Some(path), _) => std::fs::read_to_string(&path)
            .map_err(|e| ServeError::InvalidConfig(format!("reading the deploy file {}: {e}", path.to_string_lossy()))),
        (None, Some(text)) => Ok(text.to_string_lossy().into_owned()),
        (None, None) => return,
    };
    // SAFETY: this runs before main, on the only thread of the process.
    unsafe {
        std::env::remove_var(DEPLOY_FILE_ENV);
        std::env::remove_var(DEPLOY_ENV);
    }
    let code = match text.and_then(|text| deploy(&text)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("raylet serve deploy: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// Deploys a file's application on the cluster this process belongs to
/// and waits until it runs, printing what keeps it as it changes; a
/// submitted job's deploy then records that it deployed (see
/// [`DEPLOYED_PREFIX`]).
fn deploy(text: &str) -> Result<()> {
    let (app, http) = parse(text)?;
    println!(
        "deploying application `{}` ({} deployments)",
        app.name,
        app.deployments.len()
    );
    let cluster = raylet::init()?;
    let instance = crate::instance::run_reporting(&cluster, app, http, &mut |line| println!("waiting: {line}"))?;
    let status = instance.status()?;
    let Some(app) = status.app(instance.name()).filter(|app| app.state == AppState::Running) else {
        return Err(ServeError::NoSuchApp(instance.name().to_string()));
    };
    for deployment in &app.deployments {
        println!(
            "  {}: {} replicas of version {}",
            deployment.name,
            deployment.replicas.len(),
            deployment.version
        );
    }
    for proxy in &status.proxies {
        println!(
            "application `{}` is RUNNING at http://{}{}",
            app.name, proxy.address, app.route_prefix
        );
    }
    if std::env::var_os(JOB_ID_ENV).is_some() {
        let key = format!("{DEPLOYED_PREFIX}{}", cluster.job_id());
        cluster.kv_namespace(KV_NAMESPACE).put(key, app.name.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scaled;
    crate::register_deployment!(Scaled);

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Weights {
        checkpoint: String,
        width: u32,
    }

    impl crate::Deployment for Scaled {
        type Init = Weights;
        type UserConfig = f64;
        type Request = bytes::Bytes;
        type Response = bytes::Bytes;

        fn new(_: Weights, _: &crate::ReplicaContext) -> Result<Self, crate::BoxError> {
            Ok(Scaled)
        }

        async fn call(&self, body: bytes::Bytes) -> Result<bytes::Bytes, crate::BoxError> {
            Ok(body)
        }
    }

    fn file(deployment: &str) -> String {
        format!("binary: ./app\nname: demo\nroute_prefix: /demo\nhttp: {{port: 0}}\ndeployments:\n{deployment}")
    }

    #[test]
    fn a_file_becomes_an_application_with_typed_init_and_user_config() {
        let class = std::any::type_name::<Scaled>();
        let text = file(&format!(
            "  - name: model\n    class: {class}\n    init: {{checkpoint: /tmp/c, width: 8}}\n    user_config: 0.5\n    \
             autoscaling: {{min_replicas: 1, max_replicas: 4, upscale_delay_s: 2}}\n"
        ));
        let (app, http) = parse(&text).expect("a valid file");
        assert_eq!(http.port, 0);
        let model = &app.deployments[0];
        let init: Weights = raylet::codec::decode(&model.init).unwrap();
        assert_eq!((init.checkpoint.as_str(), init.width), ("/tmp/c", 8));
        assert_eq!(
            raylet::codec::decode::<f64>(model.user_config.as_ref().unwrap()).unwrap(),
            0.5
        );
        let autoscaling = model.autoscaling.as_ref().unwrap();
        assert_eq!(
            (autoscaling.max_replicas, autoscaling.upscale_delay),
            (4, Duration::from_secs(2))
        );
    }

    #[test]
    fn a_deployment_may_scale_to_zero_but_not_be_capped_at_zero() {
        let class = std::any::type_name::<Scaled>();
        let with_autoscaling = |autoscaling: &str| {
            file(&format!(
                "  - name: model\n    class: {class}\n    init: {{checkpoint: /tmp/c, width: 8}}\n    \
                 autoscaling: {autoscaling}\n"
            ))
        };
        let (app, _) = parse(&with_autoscaling("{min_replicas: 0, max_replicas: 2}")).expect("scale to zero");
        assert_eq!(app.deployments[0].autoscaling.as_ref().unwrap().min_replicas, 0);
        let error = parse(&with_autoscaling("{min_replicas: 0, max_replicas: 0}")).unwrap_err();
        assert!(error.to_string().contains("max_replicas must be at least 1"), "{error}");
    }

    #[test]
    fn a_request_timeout_past_ten_years_is_refused() {
        let class = std::any::type_name::<Scaled>();
        let deployment = format!("  - name: model\n    class: {class}\n    init: {{checkpoint: /tmp/c, width: 8}}\n");
        let with_timeout = |seconds: &str| {
            file(&deployment).replace("{port: 0}", &format!("{{port: 0, request_timeout_s: {seconds}}}"))
        };
        let (_, http) = parse(&with_timeout("30")).expect("a valid file");
        assert_eq!(http.request_timeout, Duration::from_secs(30));
        for seconds in ["1e12", "-1"] {
            let error = parse(&with_timeout(seconds)).unwrap_err().to_string();
            assert!(error.contains("ten years"), "{seconds}: {error}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        let class = std::any::type_name::<Scaled>();
        let wrong_init = file(&format!(
            "  - name: model\n    class: {class}\n    init: {{width: 8}}\n"
        ));
        let error = parse(&wrong_init).unwrap_err().to_string();
        assert!(
            error.contains("its init is not a") && error.contains("checkpoint"),
            "{error}"
        );
        let unknown = file("  - name: model\n    class: nowhere::Model\n");
        let error = parse(&unknown).unwrap_err().to_string();
        assert!(error.contains("nowhere::Model") && error.contains(class), "{error}");
        let typo = file(&format!("  - name: model\n    class: {class}\n    num_replica: 2\n"));
        let error = parse(&typo).unwrap_err().to_string();
        assert!(error.contains("num_replica"), "{error}");
    }
}
