//! Where work may run beyond the resources it needs: scheduling strategies,
//! node labels and label selectors, as users give them and as they travel.

use std::collections::BTreeMap;
use std::fmt;

use crate::v1::scheduling_strategy::Kind as StrategyKind;
use crate::{Error, NodeId, PlacementGroupId, Result, v1};

/// A node's labels, from `raylet start --labels k=v,..`.
pub type Labels = BTreeMap<String, String>;

const MAX_LABEL_LEN: usize = 63;

/// How the scheduler picks a node among those that fit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SchedulingStrategy {
    /// Ray's hybrid policy: the requesting node while it is below half
    /// utilization, else a random one of the least utilized nodes.
    #[default]
    Default,
    /// Round robin over the nodes that fit.
    Spread,
    /// One node by id. Hard: only there, and an error when it is not alive.
    /// Soft: there when it has room, else wherever the default policy says.
    NodeAffinity { node_id: NodeId, soft: bool },
    /// In bundle `bundle` of a placement group, or in any of its bundles.
    PlacementGroup {
        group: PlacementGroupId,
        bundle: Option<u32>,
    },
}

/// One condition on a label's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LabelMatch {
    Equals(String),
    /// Also true on nodes without the label.
    NotEquals(String),
    In(Vec<String>),
    /// Also true on nodes without the label.
    NotIn(Vec<String>),
}

impl LabelMatch {
    /// Parses `value`, `!value`, `in(a,b)` or `!in(a,b)`.
    pub fn parse(expression: &str) -> Result<Self> {
        let expression = expression.trim();
        let (negated, rest) = match expression.strip_prefix('!') {
            Some(rest) => (true, rest.trim()),
            None => (false, expression),
        };
        let set = rest.strip_prefix("in(").and_then(|inner| inner.strip_suffix(')'));
        let parsed = match (set, negated) {
            (Some(inner), negated) => {
                let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
                values.iter().try_for_each(|v| check_label_part("label value", v))?;
                if negated {
                    LabelMatch::NotIn(values)
                } else {
                    LabelMatch::In(values)
                }
            }
            (None, negated) => {
                check_label_part("label value", rest)?;
                match negated {
                    true => LabelMatch::NotEquals(rest.to_string()),
                    false => LabelMatch::Equals(rest.to_string()),
                }
            }
        };
        Ok(parsed)
    }

    fn holds(&self, value: Option<&String>) -> bool {
        match self {
            LabelMatch::Equals(wanted) => value == Some(wanted),
            LabelMatch::NotEquals(unwanted) => value != Some(unwanted),
            LabelMatch::In(set) => value.is_some_and(|v| set.contains(v)),
            LabelMatch::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
        }
    }
}

impl fmt::Display for LabelMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelMatch::Equals(value) => write!(f, "{value}"),
            LabelMatch::NotEquals(value) => write!(f, "!{value}"),
            LabelMatch::In(values) => write!(f, "in({})", values.join(",")),
            LabelMatch::NotIn(values) => write!(f, "!in({})", values.join(",")),
        }
    }
}

/// Conditions on node labels that a node must all satisfy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector(BTreeMap<String, LabelMatch>);

impl LabelSelector {
    /// This selector with `key` required to satisfy `expression`
    /// (`value`, `!value`, `in(a,b)` or `!in(a,b)`).
    pub fn with(mut self, key: &str, expression: &str) -> Result<Self> {
        check_label_part("label key", key)?;
        self.0.insert(key.to_string(), LabelMatch::parse(expression)?);
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a node with `labels` satisfies every condition.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|(key, condition)| condition.holds(labels.get(key)))
    }

    fn from_proto(map: &std::collections::HashMap<String, String>) -> Result<Self> {
        map.iter()
            .try_fold(LabelSelector::default(), |selector, (key, expression)| {
                selector.with(key, expression)
            })
    }

    fn to_proto(&self) -> std::collections::HashMap<String, String> {
        self.0
            .iter()
            .map(|(key, condition)| (key.clone(), condition.to_string()))
            .collect()
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(key, condition)| format!("{key}={condition}"))
            .collect();
        write!(f, "{}", parts.join(", "))
    }
}

/// A strategy with a label selector: everything but resources that decides
/// where work may run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scheduling {
    pub strategy: SchedulingStrategy,
    pub label_selector: LabelSelector,
}

impl Scheduling {
    /// Reads the wire form; an absent one is the default.
    pub fn from_proto(wire: Option<&v1::SchedulingStrategy>) -> Result<Self> {
        let Some(wire) = wire else {
            return Ok(Scheduling::default());
        };
        let strategy = match &wire.kind {
            None | Some(StrategyKind::DefaultStrategy(_)) => SchedulingStrategy::Default,
            Some(StrategyKind::Spread(_)) => SchedulingStrategy::Spread,
            Some(StrategyKind::NodeAffinity(affinity)) => SchedulingStrategy::NodeAffinity {
                node_id: NodeId::from_wire(&affinity.node_id)?,
                soft: affinity.soft,
            },
            Some(StrategyKind::PlacementGroup(group)) => SchedulingStrategy::PlacementGroup {
                group: PlacementGroupId::from_wire(&group.placement_group_id)?,
                bundle: group.bundle_index,
            },
        };
        Ok(Scheduling {
            strategy,
            label_selector: LabelSelector::from_proto(&wire.label_selector)?,
        })
    }

    pub fn to_proto(&self) -> v1::SchedulingStrategy {
        let kind = match &self.strategy {
            SchedulingStrategy::Default => StrategyKind::DefaultStrategy(v1::DefaultStrategy {}),
            SchedulingStrategy::Spread => StrategyKind::Spread(v1::SpreadStrategy {}),
            SchedulingStrategy::NodeAffinity { node_id, soft } => {
                StrategyKind::NodeAffinity(v1::NodeAffinityStrategy {
                    node_id: node_id.as_bytes().to_vec(),
                    soft: *soft,
                })
            }
            SchedulingStrategy::PlacementGroup { group, bundle } => {
                StrategyKind::PlacementGroup(v1::PlacementGroupStrategy {
                    placement_group_id: group.as_bytes().to_vec(),
                    bundle_index: *bundle,
                })
            }
        };
        v1::SchedulingStrategy {
            kind: Some(kind),
            label_selector: self.label_selector.to_proto(),
        }
    }
}

/// "SPREAD", "node affinity 1a2b3c4d (hard)", "labels zone=a", or empty
/// for the default strategy and no labels.
impl fmt::Display for Scheduling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        match &self.strategy {
            SchedulingStrategy::Default => {}
            SchedulingStrategy::Spread => parts.push("SPREAD".to_string()),
            SchedulingStrategy::NodeAffinity { node_id, soft } => {
                let kind = if *soft { "soft" } else { "hard" };
                parts.push(format!("node affinity {} ({kind})", node_id.short()));
            }
            SchedulingStrategy::PlacementGroup { group, bundle } => {
                let bundle = bundle.map_or("any bundle".to_string(), |index| format!("bundle {index}"));
                parts.push(format!("placement group {} {bundle}", group.short()));
            }
        }
        if !self.label_selector.is_empty() {
            parts.push(format!("labels {}", self.label_selector));
        }
        write!(f, "{}", parts.join(", "))
    }
}

/// Parses `k=v,k2=v2` as given to `--labels`; an empty string is no labels.
pub fn parse_labels(text: &str) -> Result<Labels> {
    let mut labels = Labels::new();
    for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Error::InvalidArgument(format!(
                "label '{pair}' must be KEY=VALUE, as in --labels zone=a,disk=ssd"
            ))
        })?;
        let (key, value) = (key.trim(), value.trim());
        check_label_part("label key", key)?;
        check_label_part("label value", value)?;
        labels.insert(key.to_string(), value.to_string());
    }
    Ok(labels)
}

/// Reads labels off the wire, checking each as `--labels` does.
pub fn labels_from_proto(map: &std::collections::HashMap<String, String>) -> Result<Labels> {
    for (key, value) in map {
        check_label_part("label key", key)?;
        check_label_part("label value", value)?;
    }
    Ok(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub fn labels_to_proto(labels: &Labels) -> std::collections::HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn check_label_part(what: &str, text: &str) -> Result<()> {
    let valid_chars = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if text.is_empty() || text.len() > MAX_LABEL_LEN || !valid_chars {
        return Err(Error::InvalidArgument(format!(
            "{what} '{text}' must be 1 to {MAX_LABEL_LEN} characters of letters, digits, '_', '-', '.' or '/'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> Labels {
        parse_labels(text).unwrap()
    }

    #[test]
    fn labels_parse_from_the_flag_and_bad_ones_say_what_is_wrong() {
        let parsed = labels("zone=us-east, disk=ssd");
        assert_eq!(parsed["zone"], "us-east");
        assert_eq!(parsed["disk"], "ssd");
        assert!(labels("").is_empty());
        for (bad, expected) in [("zone", "KEY=VALUE"), ("=a", "label key"), ("a=b c", "label value")] {
            let error = parse_labels(bad).unwrap_err().to_string();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }

    #[test]
    fn selectors_match_equal_unequal_in_and_not_in() {
        let node = labels("zone=a,disk=ssd");
        let select = |key: &str, expression: &str| LabelSelector::default().with(key, expression).unwrap();
        assert!(select("zone", "a").matches(&node));
        assert!(!select("zone", "b").matches(&node));
        assert!(select("zone", "!b").matches(&node));
        assert!(
            select("gpu", "!a100").matches(&node),
            "absent labels differ from any value"
        );
        assert!(select("zone", "in(b, a)").matches(&node));
        assert!(!select("zone", "!in(a,b)").matches(&node));
        assert!(!select("gpu", "in(a100)").matches(&node));
        let both = select("zone", "a").with("disk", "hdd").unwrap();
        assert!(!both.matches(&node), "every condition must hold");
        assert!(LabelSelector::default().with("zone", "in(a b)").is_err());
    }

    #[test]
    fn scheduling_round_trips_through_the_wire_form() {
        let node_id = NodeId::random();
        for strategy in [
            SchedulingStrategy::Default,
            SchedulingStrategy::Spread,
            SchedulingStrategy::NodeAffinity { node_id, soft: true },
            SchedulingStrategy::PlacementGroup {
                group: PlacementGroupId::random(),
                bundle: Some(2),
            },
        ] {
            let scheduling = Scheduling {
                strategy,
                label_selector: LabelSelector::default().with("zone", "!in(a,b)").unwrap(),
            };
            let wire = scheduling.to_proto();
            assert_eq!(Scheduling::from_proto(Some(&wire)).unwrap(), scheduling);
        }
        assert_eq!(Scheduling::from_proto(None).unwrap(), Scheduling::default());
    }
}
