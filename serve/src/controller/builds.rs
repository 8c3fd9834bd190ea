//! One build of the user's binary serves at a time: the controller, its
//! proxies and replicas run the build that started them, and a method call
//! from another build is refused. A driver of another build finds out by
//! asking the controller for its status; if no application is recorded it
//! retires the old controller and its proxies (by name, which any build
//! can) so that its own starts, and otherwise it is refused with
//! [`ServeError::OtherBuild`], naming the applications to delete first.

use std::time::{Duration, Instant};

use raylet::{ActorState, Cluster, TaskErrorKind};

use super::{CONTROLLER_NAME, NAMESPACE, ServeController, ServeControllerHandle, proxies, store};
use crate::error::{Result, ServeError};
use crate::proxy::HttpProxy;

/// How long a controller may take to answer whether it is of this build.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the head may take to free the names of a retired controller.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the running controller is to this driver.
pub(super) enum Controller {
    /// Of this build: use it.
    Ours(ServeControllerHandle),
    /// Of another build, with no application left: retired, start ours.
    Retired,
}

/// Checks the running `controller`'s build against this one.
pub(super) fn check(cluster: &Cluster, controller: ServeControllerHandle) -> Result<Controller> {
    let error = match controller.status().get_timeout(PROBE_TIMEOUT) {
        Ok(_) => return Ok(Controller::Ours(controller)),
        Err(raylet::Error::Task(e)) if e.kind == TaskErrorKind::BinaryMismatch => e,
        Err(e) => return Err(e.into()),
    };
    let apps = store::names(cluster)?;
    if !apps.is_empty() {
        return Err(ServeError::OtherBuild {
            detail: error.message,
            apps: apps.join(", "),
        });
    }
    tracing::info!("retiring the Serve controller of another build: {}", error.message);
    retire(cluster)?;
    Ok(Controller::Retired)
}

/// Kills the controller and the proxies of namespace `serve`, then waits
/// until none of them is alive.
fn retire(cluster: &Cluster) -> Result<()> {
    let deadline = Instant::now() + RETIRE_TIMEOUT;
    loop {
        let alive: Vec<_> = cluster
            .list_actors()?
            .into_iter()
            .filter(|actor| actor.namespace == NAMESPACE && is_serve_system(&actor.name))
            .filter(|actor| actor.state != ActorState::Dead)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ServeError::WaitTimedOut {
                waiting_for: "the old Serve controller and proxies to stop".into(),
                after: RETIRE_TIMEOUT,
            });
        }
        for actor in &alive {
            kill(cluster, &actor.name)?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `name` is the controller's or a proxy's.
fn is_serve_system(name: &str) -> bool {
    name == CONTROLLER_NAME || name.starts_with(proxies::PROXY_PREFIX)
}

/// Kills the controller or proxy called `name`, for good; one already gone
/// is no error.
fn kill(cluster: &Cluster, name: &str) -> Result<()> {
    let killed = match name {
        CONTROLLER_NAME => cluster
            .get_actor_in::<ServeController>(NAMESPACE, name)
            .and_then(|controller| cluster.kill(&controller, true)),
        _ => cluster
            .get_actor_in::<HttpProxy>(NAMESPACE, name)
            .and_then(|proxy| cluster.kill(&proxy, true)),
    };
    if let Err(e) = killed {
        tracing::debug!(actor = name, "killing a retired Serve actor: {e}");
    }
    Ok(())
}
