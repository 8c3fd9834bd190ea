//! An OpenAI-compatible API for a model served on raylet-serve: the
//! [`OpenAiServer`] deployment ([`server`]), the requests it accepts and
//! checks ([`protocol`]) and its errors in OpenAI's format ([`errors`]).
//! [`deployment`] and [`application`] make what to deploy.

mod errors;
mod protocol;
mod server;

use raylet_serve::{Application, DeploymentConfig, ServeError};

pub use server::{OpenAiServer, ServerInit};

/// The route prefix OpenAI's clients expect under their `base_url`.
pub const ROUTE_PREFIX: &str = "/v1";
/// The deployment's name within its application.
pub const DEPLOYMENT: &str = "model";

/// The model deployment of `init`, one replica, named [`DEPLOYMENT`]: a
/// replica takes as many requests at once as its engine can batch and
/// queue, so requests wait in its engine (joining the batch at the next
/// step) rather than in a router. Set its replicas or autoscaling (down to
/// zero) before adding it to an application.
pub fn deployment(init: ServerInit) -> Result<DeploymentConfig, ServeError> {
    let ongoing = init.engine.max_batch_size + init.engine.max_waiting;
    Ok(DeploymentConfig::new::<OpenAiServer>(DEPLOYMENT, init)?
        .max_ongoing_requests(u32::try_from(ongoing).unwrap_or(u32::MAX)))
}

/// An application `name` serving `init`'s model at [`ROUTE_PREFIX`] with
/// `replicas` replicas.
pub fn application(name: &str, init: ServerInit, replicas: u32) -> Result<Application, ServeError> {
    Ok(Application::new(name, ROUTE_PREFIX).deployment(deployment(init)?.num_replicas(replicas)))
}
