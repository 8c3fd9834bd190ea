//! What to deploy: an [`Application`] (a route prefix and its
//! deployments), each [`DeploymentConfig`] (class, `Init`, replicas or
//! [`AutoscalingConfig`], limits, resources, health checks), and the
//! proxies' [`HttpOptions`]. All have builders; all are what the controller
//! keeps in the head's key-value store.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::deployment::Deployment;
use crate::error::{Result, ServeError};

/// One deployment of an application.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeploymentConfig {
    pub(crate) name: String,
    /// The registered class (`std::any::type_name` of the deployment).
    pub(crate) class: String,
    pub(crate) init: Vec<u8>,
    pub(crate) user_config: Option<Vec<u8>>,
    pub(crate) num_replicas: u32,
    pub(crate) max_ongoing_requests: u32,
    pub(crate) max_queued_requests: Option<u32>,
    pub(crate) num_cpus: f64,
    pub(crate) num_gpus: f64,
    pub(crate) autoscaling: Option<AutoscalingConfig>,
    pub(crate) health_check_period: Duration,
    pub(crate) health_check_timeout: Duration,
    pub(crate) graceful_shutdown_timeout: Duration,
}

impl DeploymentConfig {
    /// Deployment `name` of class `D`, whose replicas are built from
    /// `init`: 1 replica, `max_ongoing_requests` 5 (Ray Serve's default),
    /// 1 CPU per replica.
    pub fn new<D: Deployment>(name: &str, init: D::Init) -> Result<Self> {
        let init = encode("the deployment's Init", &init)?;
        Ok(Self::from_parts(name, std::any::type_name::<D>(), init))
    }

    /// A deployment of the registered class `class` with an encoded
    /// `Init`, as a deploy file gives it.
    pub(crate) fn from_parts(name: &str, class: &str, init: Vec<u8>) -> Self {
        DeploymentConfig {
            name: name.to_string(),
            class: class.to_string(),
            init,
            user_config: None,
            num_replicas: 1,
            max_ongoing_requests: 5,
            max_queued_requests: None,
            num_cpus: 1.0,
            num_gpus: 0.0,
            autoscaling: None,
            health_check_period: Duration::from_secs(10),
            health_check_timeout: Duration::from_secs(30),
            graceful_shutdown_timeout: Duration::from_secs(20),
        }
    }

    /// The user config that [`Deployment::reconfigure`] applies on every
    /// replica after it is built.
    pub fn user_config<D: Deployment>(mut self, config: &D::UserConfig) -> Result<Self> {
        self.user_config = Some(encode("the deployment's user config", config)?);
        Ok(self)
    }

    pub fn num_replicas(mut self, replicas: u32) -> Self {
        self.num_replicas = replicas;
        self
    }

    /// How many requests a replica runs at once; it rejects more.
    pub fn max_ongoing_requests(mut self, requests: u32) -> Self {
        self.max_ongoing_requests = requests;
        self
    }

    /// How many requests each router (a proxy, a handle's process) holds
    /// while every replica is full; beyond that they fail with
    /// back-pressure (503). Default: `2 × max_ongoing_requests × replicas`.
    pub fn max_queued_requests(mut self, requests: u32) -> Self {
        self.max_queued_requests = Some(requests);
        self
    }

    /// CPUs each replica reserves (default 1); its user code runs on
    /// `ceil(num_cpus)` threads, at least 1.
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.num_cpus = cpus;
        self
    }

    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.num_gpus = gpus;
        self
    }

    /// Scales the replicas between `min_replicas` and `max_replicas` on
    /// the load; `num_replicas` is then ignored.
    pub fn autoscaling(mut self, config: AutoscalingConfig) -> Self {
        self.autoscaling = Some(config);
        self
    }

    /// How often each replica's [`Deployment::check_health`] runs (default
    /// 10 s) and how long it may take (default 30 s); a replica that fails
    /// or is late is replaced.
    pub fn health_check(mut self, period: Duration, timeout: Duration) -> Self {
        self.health_check_period = period;
        self.health_check_timeout = timeout;
        self
    }

    /// How long a replica being stopped may take to finish its requests
    /// (default 20 s) before it is killed.
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.graceful_shutdown_timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most replicas this deployment may have.
    fn most_replicas(&self) -> u32 {
        self.autoscaling
            .as_ref()
            .map_or(self.num_replicas, |autoscaling| autoscaling.max_replicas)
    }

    pub(crate) fn queue_limit(&self) -> u32 {
        let default = 2 * self.max_ongoing_requests * self.most_replicas();
        self.max_queued_requests.unwrap_or(default)
    }

    /// What identifies the replicas' code and shape: a change of it starts
    /// new replicas, while a change of anything else (the replica count,
    /// autoscaling, the user config, health checks) keeps them.
    pub(crate) fn version(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(self.class.as_bytes());
        hash.update((self.init.len() as u64).to_le_bytes());
        hash.update(&self.init);
        hash.update(self.max_ongoing_requests.to_le_bytes());
        hash.update(self.num_cpus.to_le_bytes());
        hash.update(self.num_gpus.to_le_bytes());
        hash.finalize()[..4].iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn validate(&self) -> Result<()> {
        let invalid = |message: String| {
            Err(ServeError::InvalidConfig(format!(
                "deployment `{}`: {message}",
                self.name
            )))
        };
        if self.num_replicas == 0 || self.max_ongoing_requests == 0 {
            return invalid("num_replicas and max_ongoing_requests must be at least 1".into());
        }
        if let Some(autoscaling) = &self.autoscaling
            && let Err(error) = autoscaling.validate()
        {
            return invalid(error.to_string());
        }
        if self.health_check_period.is_zero() || self.health_check_timeout.is_zero() {
            return invalid("health check period and timeout must be above 0".into());
        }
        crate::registry::find(&self.class)?;
        Ok(())
    }
}

/// How a deployment scales with its load, as Ray Serve's
/// `autoscaling_config`: the desired count is the average over
/// `look_back_period` of the requests running at its replicas plus those
/// waiting in routers, divided by `target_ongoing_requests` and rounded
/// up, within `[min_replicas, max_replicas]`. A higher desired count
/// applies once it has held for `upscale_delay`, a lower one after
/// `downscale_delay`.
///
/// **Scale to zero.** With `min_replicas: 0` a deployment idle for
/// `downscale_delay` stops its last replica. A request that comes then
/// waits in its router's bounded queue; the controller sees it and starts
/// a replica at once (not after `upscale_delay`, as Ray Serve does), and
/// the request is answered once the replica is built: its latency is the
/// replica's cold start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoscalingConfig {
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// The count to start with (default `min_replicas`).
    pub initial_replicas: Option<u32>,
    pub target_ongoing_requests: f64,
    pub upscale_delay: Duration,
    pub downscale_delay: Duration,
    /// How often the load is sampled.
    pub metrics_interval: Duration,
    pub look_back_period: Duration,
}

impl Default for AutoscalingConfig {
    /// Ray Serve's defaults: 1 to 1 replicas, 2 ongoing requests per
    /// replica, 30 s to scale up, 600 s to scale down, a sample every
    /// 10 s averaged over 30 s.
    fn default() -> Self {
        AutoscalingConfig {
            min_replicas: 1,
            max_replicas: 1,
            initial_replicas: None,
            target_ongoing_requests: 2.0,
            upscale_delay: Duration::from_secs(30),
            downscale_delay: Duration::from_secs(600),
            metrics_interval: Duration::from_secs(10),
            look_back_period: Duration::from_secs(30),
        }
    }
}

impl AutoscalingConfig {
    fn validate(&self) -> std::result::Result<(), AutoscalingConfigError> {
        if self.max_replicas == 0 {
            return Err(AutoscalingConfigError::NoReplicas);
        }
        if self.max_replicas < self.min_replicas {
            return Err(AutoscalingConfigError::MaximumBelowMinimum {
                max: self.max_replicas,
                min: self.min_replicas,
            });
        }
        if let Some(initial) = self.initial_replicas
            && !(self.min_replicas..=self.max_replicas).contains(&initial)
        {
            return Err(AutoscalingConfigError::InitialOutOfBounds(initial));
        }
        if self.target_ongoing_requests.is_nan() || self.target_ongoing_requests <= 0.0 {
            return Err(AutoscalingConfigError::NoTargetLoad);
        }
        if self.metrics_interval.is_zero() {
            return Err(AutoscalingConfigError::NoMetricsInterval);
        }
        Ok(())
    }
}

/// What is wrong with an [`AutoscalingConfig`].
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AutoscalingConfigError {
    #[error("max_replicas must be at least 1")]
    NoReplicas,
    #[error("max_replicas {max} is below min_replicas {min}")]
    MaximumBelowMinimum { max: u32, min: u32 },
    #[error("initial_replicas {0} is outside min_replicas..=max_replicas")]
    InitialOutOfBounds(u32),
    #[error("target_ongoing_requests must be above 0")]
    NoTargetLoad,
    #[error("metrics_interval must be above 0")]
    NoMetricsInterval,
}

/// Deployments served under one route prefix. The first deployment added
/// is the ingress: HTTP requests under the prefix go to it, and it may
/// call the others through [`DeploymentHandle`](crate::DeploymentHandle)s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Application {
    pub(crate) name: String,
    pub(crate) route_prefix: String,
    pub(crate) public: bool,
    pub(crate) deployments: Vec<DeploymentConfig>,
}

impl Application {
    /// Application `name`, served under `route_prefix` (such as `/` or
    /// `/classify`).
    pub fn new(name: &str, route_prefix: &str) -> Self {
        Application {
            name: name.to_string(),
            route_prefix: route_prefix.to_string(),
            public: false,
            deployments: Vec::new(),
        }
    }

    /// Adds a deployment; the first one is the ingress.
    pub fn deployment(mut self, deployment: DeploymentConfig) -> Self {
        self.deployments.push(deployment);
        self
    }

    /// Serves this application without the cluster token. **Anyone who
    /// reaches the proxy's port can then call it**: use it only behind
    /// your own gateway or for deliberately open endpoints.
    pub fn public(mut self, public: bool) -> Self {
        self.public = public;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.contains(['/', ':']) {
            let message = format!("application name `{}` must be non-empty, without / or :", self.name);
            return Err(ServeError::InvalidConfig(message));
        }
        if !self.route_prefix.starts_with('/') {
            let message = format!("route prefix `{}` must start with /", self.route_prefix);
            return Err(ServeError::InvalidConfig(message));
        }
        if self.deployments.is_empty() {
            let message = format!("application `{}` has no deployment", self.name);
            return Err(ServeError::InvalidConfig(message));
        }
        let mut names: Vec<&str> = self.deployments.iter().map(|d| d.name.as_str()).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            let message = format!("application `{}` has two deployments named `{}`", self.name, twice[0]);
            return Err(ServeError::InvalidConfig(message));
        }
        self.deployments.iter().try_for_each(DeploymentConfig::validate)
    }
}

/// Where and how the HTTP proxies serve. They are started with the
/// controller, so the options of the first deployment on a cluster hold
/// until Serve is shut down.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HttpOptions {
    /// The address to bind; default the node's IP (loopback unless the
    /// node was given one).
    pub(crate) host: Option<IpAddr>,
    pub(crate) port: u16,
    pub(crate) request_timeout: Duration,
    pub(crate) max_body_bytes: usize,
}

impl Default for HttpOptions {
    /// Port 8000, a 60 s request timeout, bodies up to 16 MiB.
    fn default() -> Self {
        HttpOptions {
            host: None,
            port: 8000,
            request_timeout: Duration::from_secs(60),
            max_body_bytes: 16 << 20,
        }
    }
}

impl HttpOptions {
    pub fn host(mut self, host: IpAddr) -> Self {
        self.host = Some(host);
        self
    }

    /// The port every proxy binds (0: any free one, as tests use).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// How long a request may take in all (waiting included); past it the
    /// client gets 504.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The largest request body; a larger one gets 413.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<Vec<u8>> {
    raylet::codec::encode(value).map_err(|e| ServeError::Encode {
        what: what.to_string(),
        message: e.to_string(),
    })
}
