//! [`DeploymentHandle`]: calling a deployment from Rust, through the same
//! router as the HTTP proxy. Inside a replica it is how one deployment
//! calls another (model composition); in the driver, how a program calls
//! its own deployments without HTTP.

use std::marker::PhantomData;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::deployment::{Body, Deployment};
use crate::error::{Result, ServeError};
use crate::routes;

/// A typed handle to one deployment of an application. It holds names
/// only, so it is cheap to clone and can travel in an `Init`; it resolves
/// the deployment in this process's routing table at each call.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct DeploymentHandle<D> {
    app: String,
    deployment: String,
    #[serde(skip)]
    class: PhantomData<fn() -> D>,
}

impl<D> Clone for DeploymentHandle<D> {
    fn clone(&self) -> Self {
        DeploymentHandle {
            app: self.app.clone(),
            deployment: self.deployment.clone(),
            class: PhantomData,
        }
    }
}

impl<D> std::fmt::Debug for DeploymentHandle<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeploymentHandle({}/{})", self.app, self.deployment)
    }
}

impl<D: Deployment> DeploymentHandle<D> {
    /// A handle to deployment `deployment` of application `app`; inside a
    /// replica, `app` is [`ReplicaContext::app`](crate::ReplicaContext).
    /// Nothing is checked until the first call.
    pub fn new(app: &str, deployment: &str) -> Self {
        DeploymentHandle {
            app: app.to_string(),
            deployment: deployment.to_string(),
            class: PhantomData,
        }
    }

    /// Sends one request and waits for its response. Fails with
    /// [`ServeError::BackPressure`] when every replica is full and the
    /// router's queue too.
    pub async fn call(&self, request: D::Request) -> Result<D::Response> {
        let router = routes::router(&self.app, &self.deployment, std::any::type_name::<D>())?;
        let body = request.encode().map_err(|e| ServeError::Encode {
            what: format!("a request for `{}`", self.deployment),
            message: e.to_string(),
        })?;
        let (response, _) = router.call(&body).await?;
        D::Response::decode(Bytes::from(response)).map_err(|message| ServeError::BadResponse {
            deployment: self.deployment.clone(),
            message,
        })
    }

    /// Checks that this process routes to the deployment, as a `D`.
    pub(crate) fn resolve(self) -> Result<Self> {
        routes::router(&self.app, &self.deployment, std::any::type_name::<D>())?;
        Ok(self)
    }
}
