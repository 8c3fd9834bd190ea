//! Where the submitter sends lease requests for work in a placement group:
//! straight to the node manager that holds the bundle, learned from the head
//! once the group is created, so that the work need not wait for the nodes'
//! resource reports to spread.

use std::sync::Arc;
use std::time::Duration;

use raylet_proto::v1::PlacementGroupState;
use raylet_proto::{IdMap, PlacementGroupId};
use tokio::sync::mpsc;

use crate::context::Context;
use crate::placement_group::session::wait_for_group;
use crate::submitter::SubmitterEvent;

/// How long one question to the head waits for the group to settle.
const LOCATE_WAIT: Duration = Duration::from_secs(600);
/// A pause before asking again after a bundle's node refused or vanished.
const RELOCATE_DELAY: Duration = Duration::from_millis(200);

/// What is known of a group's bundles.
#[derive(Clone, Debug)]
pub(crate) enum GroupRoute {
    /// Asking the head.
    Locating,
    /// The node manager address of each bundle.
    Located(Vec<Arc<str>>),
    Removed,
    /// The head could not be asked; the message says why.
    Unknown(String),
}

/// Where a lease request for work in a group goes.
pub(crate) enum RouteTarget {
    Node(Arc<str>),
    /// Not known yet; the work waits.
    Later,
    /// The work cannot run; the message says why.
    Fail(String),
}

#[derive(Default)]
pub(crate) struct GroupRoutes {
    routes: IdMap<PlacementGroupId, GroupRoute>,
    next_bundle: usize,
}

impl GroupRoutes {
    /// The node for one lease of work in bundle `bundle` (any when `None`)
    /// of `group`; starts asking the head when the group is not known.
    pub(crate) fn target(
        &mut self,
        ctx: &Arc<Context>,
        events: &mpsc::UnboundedSender<SubmitterEvent>,
        group: PlacementGroupId,
        bundle: Option<u32>,
    ) -> RouteTarget {
        let route = self.routes.entry(group).or_insert_with(|| {
            locate(ctx.clone(), events.clone(), group, Duration::ZERO);
            GroupRoute::Locating
        });
        match route {
            GroupRoute::Locating => RouteTarget::Later,
            GroupRoute::Removed => RouteTarget::Fail(format!("its placement group {group} was removed")),
            GroupRoute::Unknown(reason) => RouteTarget::Fail(reason.clone()),
            GroupRoute::Located(nodes) => {
                let index = bundle.map_or_else(
                    || {
                        self.next_bundle += 1;
                        self.next_bundle % nodes.len().max(1)
                    },
                    |index| index as usize,
                );
                match nodes.get(index) {
                    Some(node) => RouteTarget::Node(node.clone()),
                    None => RouteTarget::Fail(format!(
                        "bundle index {index} is out of range: placement group {group} has {} bundles",
                        nodes.len()
                    )),
                }
            }
        }
    }

    pub(crate) fn located(&mut self, group: PlacementGroupId, route: GroupRoute) {
        self.routes.insert(group, route);
    }

    /// Asks the head again, after a pause: the group's bundles may have
    /// moved, or be moving, after a node died.
    pub(crate) fn relocate(
        &mut self,
        ctx: &Arc<Context>,
        events: &mpsc::UnboundedSender<SubmitterEvent>,
        group: PlacementGroupId,
    ) {
        if !matches!(self.routes.get(&group), Some(GroupRoute::Locating)) {
            self.routes.insert(group, GroupRoute::Locating);
            locate(ctx.clone(), events.clone(), group, RELOCATE_DELAY);
        }
    }
}

/// Asks the head where the group's bundles are, once it is created or
/// removed, and tells the submitter.
fn locate(ctx: Arc<Context>, events: mpsc::UnboundedSender<SubmitterEvent>, group: PlacementGroupId, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let route = loop {
            let record = match wait_for_group(&ctx, group, LOCATE_WAIT).await {
                Ok(record) => record,
                Err(error) => {
                    break GroupRoute::Unknown(format!("its placement group {group} cannot be found: {error}"));
                }
            };
            match record.state() {
                PlacementGroupState::Created => {
                    break GroupRoute::Located(record.locations.iter().map(|l| l.address.as_str().into()).collect());
                }
                PlacementGroupState::Removed => break GroupRoute::Removed,
                _ => {}
            }
        };
        let _ = events.send(SubmitterEvent::GroupLocated { group, route });
    });
}
