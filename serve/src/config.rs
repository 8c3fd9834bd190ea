//! What to deploy: an [`Application`] (a route prefix and its
//! deployments), each [`DeploymentConfig`] (class, `Init`, replicas,
//! limits, resources), and the proxies' [`HttpOptions`]. All have builders.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::deployment::Deployment;
use crate::error::{Result, ServeError};

/// One deployment of an application.
#[derive(Clone, Debug)]
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
}

impl DeploymentConfig {
    /// Deployment `name` of class `D`, whose replicas are built from
    /// `init`: 1 replica, `max_ongoing_requests` 5 (Ray Serve's default),
    /// 1 CPU per replica.
    pub fn new<D: Deployment>(name: &str, init: D::Init) -> Result<Self> {
        Ok(DeploymentConfig {
            name: name.to_string(),
            class: std::any::type_name::<D>().to_string(),
            init: encode("the deployment's Init", &init)?,
            user_config: None,
            num_replicas: 1,
            max_ongoing_requests: 5,
            max_queued_requests: None,
            num_cpus: 1.0,
            num_gpus: 0.0,
        })
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

    pub(crate) fn queue_limit(&self) -> u32 {
        let default = 2 * self.max_ongoing_requests * self.num_replicas;
        self.max_queued_requests.unwrap_or(default)
    }

    fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 || self.max_ongoing_requests == 0 {
            return Err(ServeError::InvalidConfig(format!(
                "deployment `{}` needs num_replicas and max_ongoing_requests of at least 1",
                self.name
            )));
        }
        if crate::registry::find(&self.class).is_none() {
            return Err(ServeError::NotRegistered(self.class.clone()));
        }
        Ok(())
    }
}

/// Deployments served under one route prefix. The first deployment added
/// is the ingress: HTTP requests under the prefix go to it, and it may
/// call the others through [`DeploymentHandle`](crate::DeploymentHandle)s.
#[derive(Clone, Debug)]
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

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.route_prefix.starts_with('/') {
            let message = format!("route prefix `{}` must start with /", self.route_prefix);
            return Err(ServeError::InvalidConfig(message));
        }
        if self.deployments.is_empty() {
            let message = format!("application `{}` has no deployment", self.name);
            return Err(ServeError::InvalidConfig(message));
        }
        self.deployments.iter().try_for_each(DeploymentConfig::validate)
    }
}

/// Where and how the HTTP proxies serve.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    raylet::proto::codec::encode(value).map_err(|e| ServeError::Encode {
        what: what.to_string(),
        message: e.to_string(),
    })
}
