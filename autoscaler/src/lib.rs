//! raylet's cluster autoscaler, apart from the decision itself (which is
//! `raylet_scheduler::autoscaler`, pure and simulated there): the
//! [`NodeProvider`] seam through which nodes are launched and removed, and
//! its providers. [`LocalProvider`] runs nodes as `raylet start` processes
//! on this machine, for single-machine use and tests.

mod local;
mod provider;

pub use local::LocalProvider;
pub use provider::{
    INSTANCE_LABEL, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderError, start_flags,
};
