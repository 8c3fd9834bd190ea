//! [`DeploymentHandle`]: calling a deployment from Rust, through the same
//! router as the HTTP proxy. Inside a replica it is how one deployment
//! calls another (model composition); in the driver, how a program calls
//! its own deployments without HTTP. [`DeploymentHandle::stream`] takes a
//! streaming deployment's chunks as they come; dropping the stream cancels
//! the call and frees its place at the replica, so a deployment that
//! streams another's chunks on to its own client passes a client that went
//! away on as well.

use std::marker::PhantomData;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::deployment::{Body, Deployment};
use crate::error::{Result, ServeError};
use crate::router::BodyStream;
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
    /// router's queue too, and with [`ServeError::Status`] when the
    /// deployment answered with an [`HttpError`](crate::HttpError).
    pub async fn call(&self, request: D::Request) -> Result<D::Response> {
        let router = routes::router(&self.app, &self.deployment, std::any::type_name::<D>())?;
        let body = self.encode(request)?;
        let (response, _) = router.call(&body, None).await?;
        D::Response::decode(Bytes::from(response)).map_err(|error| ServeError::BadResponse {
            deployment: self.deployment.clone(),
            message: error.to_string(),
        })
    }

    /// Sends one request to a deployment that streams
    /// ([`Deployment::stream`]) and returns its chunks as they come, once
    /// the first has. An error before the first chunk is the `Err` (as
    /// [`DeploymentHandle::call`]'s are); one after it is the stream's last
    /// item. Dropping the stream cancels the call at the replica.
    pub async fn stream(&self, request: D::Request) -> Result<BodyStream> {
        let router = routes::router(&self.app, &self.deployment, std::any::type_name::<D>())?;
        let body = self.encode(request)?;
        Ok(router.call_stream(&body, None).await?.chunks)
    }

    fn encode(&self, request: D::Request) -> Result<Bytes> {
        request.encode().map_err(|e| ServeError::Encode {
            what: format!("a request for `{}`", self.deployment),
            message: e.to_string(),
        })
    }

    /// Checks that this process routes to the deployment, as a `D`.
    pub(crate) fn resolve(self) -> Result<Self> {
        routes::router(&self.app, &self.deployment, std::any::type_name::<D>())?;
        Ok(self)
    }
}
