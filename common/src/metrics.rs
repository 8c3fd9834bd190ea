//! The process's Prometheus registry, which every HTTP server of the process
//! (the head's dashboard, a node's metrics endpoint) serves, and the gRPC
//! layer that times each call the process's servers answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use tower_layer::Layer;
use tower_service::Service;

/// Latency buckets, in seconds, from 100 µs to 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every metric this process exports.
pub fn registry() -> &'static Registry {
    static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);
    &REGISTRY
}

/// A histogram family registered in the process registry.
pub fn histogram(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let histogram = HistogramVec::new(opts, labels).expect("metric names and labels are valid");
    registry()
        .register(Box::new(histogram.clone()))
        .expect("each metric is registered once");
    histogram
}

/// A counter family registered in the process registry.
pub fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let counter = IntCounterVec::new(Opts::new(name, help), labels).expect("metric names and labels are valid");
    registry()
        .register(Box::new(counter.clone()))
        .expect("each metric is registered once");
    counter
}

/// A gauge family registered in the process registry.
pub fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let gauge = IntGaugeVec::new(Opts::new(name, help), labels).expect("metric names and labels are valid");
    registry()
        .register(Box::new(gauge.clone()))
        .expect("each metric is registered once");
    gauge
}

/// The registry in Prometheus's text format.
pub fn encode_text() -> String {
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&registry().gather(), &mut text)
        .expect("writing to a Vec cannot fail");
    String::from_utf8(text).expect("the text format is UTF-8")
}

static RPC_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram(
        "raylet_grpc_server_handling_seconds",
        "Time from a gRPC call's arrival to its reply (for a stream: to its opening), by method",
        &["method"],
        LATENCY_BUCKETS,
    )
});

/// Times every call that reaches the services under it; placed inside the
/// token check, so only authenticated calls (and their method names) count.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcTimingLayer;

impl<S> Layer<S> for RpcTimingLayer {
    type Service = RpcTiming<S>;

    fn layer(&self, inner: S) -> RpcTiming<S> {
        RpcTiming { inner }
    }
}

/// A service wrapped by [`RpcTimingLayer`].
#[derive(Clone, Debug)]
pub struct RpcTiming<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for RpcTiming<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().trim_start_matches('/').to_string();
        let started = Instant::now();
        let reply = self.inner.call(request);
        Box::pin(async move {
            let reply = reply.await;
            RPC_SECONDS
                .with_label_values(&[method.as_str()])
                .observe(started.elapsed().as_secs_f64());
            reply
        })
    }
}
