//! The process-level system tests, one binary (each test still runs in a
//! process of its own under nextest): each starts `raylet` daemons, so they
//! are built by the package of the `raylet` binary. The CLI, the dashboard,
//! auth, TLS and limits, jobs (with Ray's job CLI and SDK), scheduling,
//! placement groups, head restarts, chaos on network-namespace hosts,
//! elastic Train, Serve and the autoscaler's node providers.

mod common;

mod auth;
mod autoscaler_cluster;
mod autoscaler_local;
mod autoscaler_netns;
mod autoscaler_slurm;
mod chaos;
mod cluster_cli;
mod connect;
mod dashboard;
mod elastic_train;
mod head_restart;
mod introspection;
mod jobs;
mod limits;
mod log_rotation;
mod placement_groups;
mod prometheus;
mod ray_job_api;
mod scheduling;
mod serve_cli;
mod serve_deploy;
mod session_dir;
mod spill_to_bucket;
mod stack_dump;
mod tls;
