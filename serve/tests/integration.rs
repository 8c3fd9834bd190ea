//! raylet-serve's integration tests, one binary (each test still runs in a
//! process of its own under nextest): HTTP, routing, batching, streaming, the
//! controller and the lifecycle of applications.

mod common;

mod batching;
mod controller;
mod http;
mod lifecycle;
mod routing;
mod streaming;
