//! Serve's metrics on the head's `/metrics`, labelled by application and
//! deployment: what proxies answered and how fast (recorded per request
//! in the proxy), and what the controller sees (replicas by state, ongoing
//! and queued requests, the autoscaler's desired count), recorded on each
//! of its ticks.

use std::borrow::Cow;
use std::sync::LazyLock;

use raylet::metrics::{Counter, Gauge, Histogram};

use crate::status::{ReplicaState, ServeStatus};

/// Upper bounds of the latency buckets, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

static REQUESTS: LazyLock<Counter> = LazyLock::new(|| {
    Counter::new(
        "serve_requests_total",
        "HTTP requests a Serve proxy answered, by status code",
        &["app", "deployment", "code"],
    )
});
static LATENCY: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new(
        "serve_request_latency_seconds",
        "Time from a request's arrival at a Serve proxy to its answer",
        &LATENCY_BUCKETS,
        &["app", "deployment"],
    )
});
static LOST: LazyLock<Counter> = LazyLock::new(|| {
    Counter::new(
        "serve_lost_requests_total",
        "Requests in flight at a replica that died",
        &["app", "deployment"],
    )
});
static REPLICAS: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_replicas",
        "Replicas of a deployment, by state",
        &["app", "deployment", "state"],
    )
});
static ONGOING: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_ongoing_requests",
        "Requests running at a deployment's replicas",
        &["app", "deployment"],
    )
});
static QUEUED: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_queued_requests",
        "Requests of a deployment waiting in routers",
        &["app", "deployment"],
    )
});
static DESIRED: LazyLock<Gauge> = LazyLock::new(|| {
    Gauge::new(
        "serve_autoscaling_desired_replicas",
        "The replica count an autoscaling deployment's load asks for",
        &["app", "deployment"],
    )
});

/// One answered HTTP request, under its status code.
pub(crate) fn record_request(app: &str, deployment: &str, code: u16, seconds: f64) {
    REQUESTS.inc(&[app, deployment, &code_label(code)], 1.0);
    LATENCY.observe(&[app, deployment], seconds);
}

/// A request lost with the replica that was running it.
pub(crate) fn record_lost(app: &str, deployment: &str) {
    LOST.inc(&[app, deployment], 1.0);
}

/// The controller's view of every deployment.
pub(crate) fn record_controller(status: &ServeStatus) {
    const STATES: [(ReplicaState, &str); 4] = [
        (ReplicaState::Starting, "STARTING"),
        (ReplicaState::Running, "RUNNING"),
        (ReplicaState::Draining, "DRAINING"),
        (ReplicaState::Stopping, "STOPPING"),
    ];
    for app in &status.apps {
        for deployment in &app.deployments {
            let labels = [app.name.as_str(), deployment.name.as_str()];
            for (state, name) in STATES {
                let count = deployment.replicas_in(state).count();
                REPLICAS.set(&[labels[0], labels[1], name], count as f64);
            }
            let ongoing: u32 = deployment.replicas.iter().map(|replica| replica.ongoing).sum();
            ONGOING.set(&labels, f64::from(ongoing));
            if let Some(autoscaling) = &deployment.autoscaling {
                DESIRED.set(&labels, f64::from(autoscaling.desired));
                QUEUED.set(&labels, f64::from(autoscaling.queued));
            }
        }
    }
}

/// A status code as a label, without allocating for the common ones.
fn code_label(code: u16) -> Cow<'static, str> {
    match code {
        200 => "200".into(),
        400 => "400".into(),
        401 => "401".into(),
        404 => "404".into(),
        413 => "413".into(),
        500 => "500".into(),
        503 => "503".into(),
        504 => "504".into(),
        other => other.to_string().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::code_label;

    #[test]
    fn every_status_code_is_its_own_label() {
        assert_eq!(code_label(200), "200");
        assert_eq!(code_label(418), "418");
        assert_eq!(code_label(429), "429");
    }
}
