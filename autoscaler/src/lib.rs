//! raylet's cluster autoscaler, apart from the decision itself (which is
//! `raylet_placement::autoscaler`, pure and simulated there): the
//! [`Monitor`] loop that runs beside the head and carries the decisions
//! out, the [`ClusterConfig`] that `raylet up` reads, and the
//! [`NodeProvider`] seam through which nodes are launched and removed, with
//! its providers: [`LocalProvider`] (processes on this machine),
//! [`NetnsProvider`] (hosts in network namespaces), [`SlurmProvider`]
//! (batch jobs) and, with the `kubernetes` feature, `KubernetesProvider`
//! (pods).

mod cluster_config;
mod cluster_name;
mod command_error;
#[cfg(feature = "kubernetes")]
mod kubernetes;
mod local;
mod monitor;
mod netns;
mod output_tail;
mod provider;
mod slurm;

pub use cluster_config::{
    ClusterConfig, ClusterConfigError, HeadSettings, IntervalError, LocalConfig, ProviderConfig, ProviderSetupError,
};
pub use cluster_name::ClusterNameError;
pub use command_error::CommandError;
#[cfg(feature = "kubernetes")]
pub use kubernetes::{
    CLUSTER_LABEL, CONTAINER_NAME, ConnectError, KubernetesConfig, KubernetesProvider, NODE_TYPE_LABEL, PullPolicy,
};
pub use local::LocalProvider;
pub use monitor::{AutoscalerReport, Event, ManagedNode, Monitor, MonitorConfig, REPORT_KEY, REPORT_NAMESPACE};
pub use netns::{NetnsConfig, NetnsError, NetnsProvider, SubnetError};
pub use provider::{
    INSTANCE_LABEL, Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderCall, ProviderError,
    TOKEN_ENV, start_flags,
};
pub use slurm::{SlurmConfig, SlurmError, SlurmProvider};
