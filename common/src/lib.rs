//! What every raylet process needs beside the wire format: token
//! authentication and the protocol-version check ([`auth`]), TLS ([`tls`]),
//! connection and request limits ([`limits`], [`connection_admission`]),
//! the HTTP listener the head, the dashboard and Serve's proxies share
//! ([`http_listener`]), Prometheus metrics ([`metrics`]), retry pacing
//! ([`backoff`]), log files that rotate by size ([`log_rotation`]), a
//! process's captured output ([`output_capture`]), the value codec
//! ([`codec`]), file hashing
//! ([`binary_hash`]), the environment a worker process starts with
//! ([`worker_env`]), the control plane's error ([`error`]) and the probes
//! that time a call's hops between processes ([`hop_probe`]).

pub mod auth;
pub mod backoff;
pub mod binary_hash;
pub mod codec;
pub mod connection_admission;
pub mod error;
pub mod hop_probe;
pub mod http_listener;
pub mod limits;
pub mod log_rotation;
pub mod metrics;
pub mod output_capture;
pub mod tls;
pub mod worker_env;

pub use backoff::Backoff;
pub use error::{Error, Result};

/// The version of the wire protocol. Peers that speak another version are
/// rejected with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;
