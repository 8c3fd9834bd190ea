//! This process's routing table: the applications a proxy serves (by path
//! prefix) and one [`Router`] per deployment, shared by the proxy and by
//! every [`DeploymentHandle`](crate::DeploymentHandle) in the process. The
//! controller pushes the whole table to every proxy and replica on each
//! change; a driver follows it with a long poll.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use crate::error::{Result, ServeError};
use crate::replica::ReplicaHandle;
use crate::router::Router;

/// Every application and deployment, with the replicas to route to.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RoutingTable {
    pub apps: Vec<AppRoute>,
    pub deployments: Vec<DeploymentRoutes>,
}

/// Where an application is served.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AppRoute {
    pub app: String,
    pub route_prefix: String,
    /// Served without the cluster token.
    pub public: bool,
    /// The deployment HTTP requests go to.
    pub ingress: String,
    /// Whether the ingress streams its answers.
    pub streaming: bool,
}

/// One deployment's replicas and limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeploymentRoutes {
    pub app: String,
    pub deployment: String,
    pub class: String,
    pub max_ongoing_requests: u32,
    pub max_queued_requests: u32,
    /// Whether requests wait in the router's queue while it has no
    /// replica: it scales to zero, or the controller replaces lost
    /// replicas; false once its version failed to start, when none will
    /// come.
    pub awaits_replicas: bool,
    /// Each replica's actor name and handle.
    pub replicas: Vec<(String, ReplicaHandle)>,
}

/// Requests of one deployment waiting in this process's router.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueReport {
    pub app: String,
    pub deployment: String,
    pub waiting: u32,
}

#[derive(Default)]
struct Installed {
    /// Longest prefix first.
    apps: Vec<AppRoute>,
    routers: HashMap<(String, String), Arc<Router>>,
}

static TABLE: LazyLock<RwLock<Installed>> = LazyLock::new(RwLock::default);

/// Installs `table` in place of what this process knew. Routers of
/// deployments already known keep their load estimates.
pub(crate) fn install(table: RoutingTable) {
    let mut installed = write();
    let mut apps = table.apps;
    apps.sort_by_key(|route| std::cmp::Reverse(route.route_prefix.len()));
    installed.apps = apps;
    let mut known = std::mem::take(&mut installed.routers);
    installed.routers = table
        .deployments
        .iter()
        .map(|routes| {
            let key = (routes.app.clone(), routes.deployment.clone());
            let router = match known.remove(&key) {
                Some(router) => {
                    router.set_replicas(routes);
                    router
                }
                None => Arc::new(Router::new(routes)),
            };
            (key, router)
        })
        .collect();
}

/// The requests waiting in each of this process's routers.
pub(crate) fn queued() -> Vec<QueueReport> {
    read()
        .routers
        .iter()
        .map(|((app, deployment), router)| QueueReport {
            app: app.clone(),
            deployment: deployment.clone(),
            waiting: router.waiting(),
        })
        .collect()
}

/// The application whose prefix is the longest that `path` falls under.
pub(crate) fn app_for(path: &str) -> Option<AppRoute> {
    read()
        .apps
        .iter()
        .find(|app| under_prefix(path, &app.route_prefix))
        .cloned()
}

/// The router of deployment `deployment` of `app`, whose class must be
/// `class`.
pub(crate) fn router(app: &str, deployment: &str, class: &str) -> Result<Arc<Router>> {
    let key = (app.to_string(), deployment.to_string());
    let installed = read();
    let router = installed
        .routers
        .get(&key)
        .ok_or_else(|| ServeError::UnknownDeployment {
            app: app.to_string(),
            deployment: deployment.to_string(),
        })?;
    if router.class() != class {
        return Err(ServeError::WrongDeploymentType {
            deployment: deployment.to_string(),
            expected: class.to_string(),
            actual: router.class().to_string(),
        });
    }
    Ok(router.clone())
}

/// The router of an application's ingress, whatever its class.
pub(crate) fn ingress_router(route: &AppRoute) -> Result<Arc<Router>> {
    let key = (route.app.clone(), route.ingress.clone());
    read()
        .routers
        .get(&key)
        .cloned()
        .ok_or_else(|| ServeError::UnknownDeployment {
            app: route.app.clone(),
            deployment: route.ingress.clone(),
        })
}

fn read() -> RwLockReadGuard<'static, Installed> {
    TABLE.read().unwrap_or_else(|p| p.into_inner())
}

fn write() -> RwLockWriteGuard<'static, Installed> {
    TABLE.write().unwrap_or_else(|p| p.into_inner())
}

/// The part of `path` below `prefix` (which `path` is under), always
/// starting with `/`: below `/v1`, `/v1/models` is `/models` and `/v1` is
/// `/`.
pub(crate) fn below_prefix(path: &str, prefix: &str) -> String {
    let rest = path.strip_prefix(prefix.trim_end_matches('/')).unwrap_or(path);
    match rest.starts_with('/') {
        true => rest.to_string(),
        false => format!("/{rest}"),
    }
}

/// Whether `path` is `prefix` or lies below it (`/a` covers `/a/b`, not
/// `/ab`).
fn under_prefix(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{below_prefix, under_prefix};

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under_prefix("/", "/"));
        assert!(under_prefix("/anything", "/"));
        assert!(under_prefix("/a", "/a"));
        assert!(under_prefix("/a/b", "/a"));
        assert!(under_prefix("/a/b", "/a/"));
        assert!(!under_prefix("/ab", "/a"));
        assert!(!under_prefix("/b", "/a"));
    }

    #[test]
    fn the_path_below_a_prefix_starts_with_a_slash() {
        assert_eq!(below_prefix("/v1/chat/completions", "/v1"), "/chat/completions");
        assert_eq!(below_prefix("/v1/models", "/v1/"), "/models");
        assert_eq!(below_prefix("/v1", "/v1"), "/");
        assert_eq!(below_prefix("/anything/else", "/"), "/anything/else");
        assert_eq!(below_prefix("/", "/"), "/");
    }
}
