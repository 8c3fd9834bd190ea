//! raylet-llm's integration tests, in one binary (each more is another
//! link). The binary is also the workers' binary: the deployments the tests
//! serve are registered in it.

mod common;
mod handle_streaming;
mod http_api;
mod metrics;
mod openai_client;
mod routing;
mod scale_to_zero;
