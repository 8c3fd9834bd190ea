//! The head's placement groups: the table of every group, the manager that
//! reserves their bundles on nodes all at once and places them again when a
//! node dies, its calls to node managers, and the gRPC service.

mod error;
mod manager;
mod node_calls;
mod service;
mod table;

use std::sync::Arc;
use std::time::Duration;

pub use error::{BundleCallError, PlacementGroupError};
pub use manager::{BundleNodes, GroupManager};
pub use node_calls::NodeManagerBundles;
pub use table::{BundleLocation, GroupRecord, GroupSpec, GroupState};

pub(crate) use service::PlacementGroupServiceImpl;

/// How often waiting groups are tried again and dead nodes looked for.
const PLACEMENT_PERIOD: Duration = Duration::from_millis(200);

/// Places waiting groups and replaces lost bundles, forever.
pub(crate) async fn keep_placing(groups: Arc<GroupManager<NodeManagerBundles>>) -> std::convert::Infallible {
    let mut ticker = tokio::time::interval(PLACEMENT_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        groups.reconcile_and_place().await;
    }
}
