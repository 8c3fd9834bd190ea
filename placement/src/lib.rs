//! Placement: the cluster's resources in a form built for fast decisions,
//! and the policies that choose a node for each piece of work. Node
//! managers (for leases), the head (for actors) and the scale simulation
//! all run this same code. [`autoscaler`] is the autoscaler's decision of
//! which nodes to launch and remove. Pure code: no servers, no I/O.

pub mod autoscaler;
mod bundles;
mod cluster;
mod launchable;
mod policy;

pub use bundles::{BundlePlan, plan_bundles};
pub use cluster::{ClusterResources, Demand, NodeIndex, NodeResources};
pub use launchable::{LaunchableNode, LaunchableNodes, await_reason};
pub use policy::{Choice, Placer, Request, SPREAD_THRESHOLD, TOP_K_FRACTION};
