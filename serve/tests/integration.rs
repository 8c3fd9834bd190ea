//! raylet-serve's integration tests, one binary (each test still runs in a
//! process of its own under nextest): HTTP, routing, batching, streaming, the
//! controller and the lifecycle of applications, HTTP APIs of deployments'
//! own (whole requests, statuses, event streams), scaling to zero,
//! deployments' figures and routing by the fullness replicas report.

mod common;

mod batching;
mod controller;
mod event_streams;
mod figures;
mod fullness;
mod http;
mod http_api;
mod lifecycle;
mod routing;
mod scale_to_zero;
mod streaming;
