//! What a remote call is made of: its options and its arguments.

use bytes::Bytes;
use raylet_proto::placement_group::demand_in_bundle;
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::{LabelSelector, ResourceSet, Scheduling, SchedulingStrategy};
use serde::Serialize;

use crate::placement_group::handle::PlacementGroup;
use crate::submitter::resources::Resources;
use crate::{ObjectRef, Result};

/// Options of one remote call. `#[raylet::remote(..)]` sets the defaults and
/// the generated `options()` builder changes them per call.
#[derive(Clone, Debug)]
pub struct TaskOptions {
    pub(crate) function: &'static str,
    pub(crate) display_name: Option<String>,
    pub(crate) resources: Resources,
    pub(crate) scheduling: SchedulingOptions,
    pub(crate) max_retries: u32,
    pub(crate) retry_exceptions: bool,
    pub(crate) num_returns: u32,
    /// Set on a generator call: the items it may send ahead of its caller.
    pub(crate) generator: Option<u64>,
}

impl TaskOptions {
    /// Retries after a worker dies, unless set otherwise.
    pub const DEFAULT_MAX_RETRIES: u32 = 3;

    /// Options for the registered function `function`: 1 CPU, 3 retries.
    pub fn new(function: &'static str) -> Self {
        TaskOptions {
            function,
            display_name: None,
            resources: Resources::default().with(CPU, 1.0),
            scheduling: SchedulingOptions::default(),
            max_retries: Self::DEFAULT_MAX_RETRIES,
            retry_exceptions: false,
            num_returns: 1,
            generator: None,
        }
    }

    /// How many objects the call returns; `#[raylet::remote(num_returns = N)]`
    /// sets it for a function that returns an N-tuple.
    #[doc(hidden)]
    pub fn num_returns(mut self, count: u32) -> Self {
        self.num_returns = count.max(1);
        self
    }

    /// Makes the call a generator's: `#[raylet::remote(streaming)]` sets it.
    #[doc(hidden)]
    pub fn generator(mut self) -> Self {
        self.generator = Some(self.generator.unwrap_or(crate::generator::table::DEFAULT_BACKPRESSURE));
        self
    }

    /// For a generator: it pauses while `items` of its items are not taken
    /// by the caller (default 64; 0 never pauses).
    pub fn generator_backpressure(mut self, items: u64) -> Self {
        self.generator = Some(items);
        self
    }

    pub fn num_cpus(self, amount: f64) -> Self {
        self.resource(CPU, amount)
    }

    pub fn num_gpus(self, amount: f64) -> Self {
        self.resource(GPU, amount)
    }

    /// Bytes of memory the task needs.
    pub fn memory(self, bytes: f64) -> Self {
        self.resource(MEMORY, bytes)
    }

    /// Any resource by name, e.g. `resource("TPU", 1.0)`.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources = self.resources.with(name, amount);
        self
    }

    /// How the node is chosen among those that fit (default: Ray's hybrid
    /// policy; `Spread`; or a node affinity).
    pub fn scheduling_strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.scheduling = self.scheduling.strategy(strategy);
        self
    }

    /// Runs only on nodes whose label `key` satisfies `expression`:
    /// `value`, `!value`, `in(a,b)` or `!in(a,b)`.
    pub fn label_selector(mut self, key: &str, expression: &str) -> Self {
        self.scheduling = self.scheduling.label(key, expression);
        self
    }

    /// How often a task is retried when its worker dies (default 3).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Also retry when the function returns `Err` or panics.
    pub fn retry_exceptions(mut self, retry: bool) -> Self {
        self.retry_exceptions = retry;
        self
    }

    /// A name to show for this call instead of the function's.
    pub fn name(mut self, name: &str) -> Self {
        self.display_name = Some(name.to_string());
        self
    }

    /// Runs the task in bundle `bundle` of `group`, or in any of its
    /// bundles; its resources come out of the bundle's.
    pub fn placement_group(mut self, group: &PlacementGroup, bundle: Option<u32>) -> Self {
        self.scheduling = self.scheduling.in_group(group, bundle);
        self
    }

    /// The resource demand, validated; inside a placement group, asked
    /// under the bundle's names.
    pub(crate) fn demand(&self) -> Result<ResourceSet> {
        self.scheduling.in_bundle(self.resources.to_set()?)
    }
}

/// Where a call or an actor may run beyond its resources, as given.
#[derive(Clone, Debug, Default)]
pub(crate) struct SchedulingOptions {
    strategy: SchedulingStrategy,
    label_selector: Vec<(String, String)>,
    /// Why the options cannot be used, found when they were set.
    invalid: Option<String>,
}

impl SchedulingOptions {
    pub(crate) fn strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    pub(crate) fn label(mut self, key: &str, expression: &str) -> Self {
        self.label_selector.push((key.to_string(), expression.to_string()));
        self
    }

    pub(crate) fn in_group(mut self, group: &PlacementGroup, bundle: Option<u32>) -> Self {
        if let Some(index) = bundle.filter(|&index| index >= group.bundle_count()) {
            self.invalid = Some(format!(
                "bundle index {index} is out of range: placement group {} has {} bundles",
                group.id(),
                group.bundle_count()
            ));
        }
        self.strategy = SchedulingStrategy::PlacementGroup {
            group: group.id(),
            bundle,
        };
        self
    }

    /// `demand` as work inside the placement group asks for it, if any.
    pub(crate) fn in_bundle(&self, demand: ResourceSet) -> Result<ResourceSet> {
        match self.strategy {
            SchedulingStrategy::PlacementGroup { group, bundle } => Ok(demand_in_bundle(group, bundle, &demand)?),
            _ => Ok(demand),
        }
    }

    /// The strategy and selector, validated.
    pub(crate) fn to_scheduling(&self) -> Result<Scheduling> {
        if let Some(invalid) = &self.invalid {
            return Err(raylet_proto::Error::InvalidArgument(invalid.clone()).into());
        }
        let label_selector = self
            .label_selector
            .iter()
            .try_fold(LabelSelector::default(), |selector, (key, expression)| {
                selector.with(key, expression)
            })?;
        Ok(Scheduling {
            strategy: self.strategy.clone(),
            label_selector,
        })
    }
}

/// One argument of a remote call: an encoded value (with the references
/// serialized inside it, kept alive until the task is done), or a reference
/// that the worker resolves before the function runs.
#[derive(Clone, Debug)]
pub enum Arg {
    Value {
        data: Bytes,
        contained: Vec<crate::AnyObjectRef>,
    },
    Ref(crate::AnyObjectRef),
}

/// Turns a value or an `ObjectRef` into an argument of type `T`.
pub trait IntoArg<T> {
    fn into_arg(self) -> Result<Arg>;
}

impl<T: Serialize> IntoArg<T> for T {
    fn into_arg(self) -> Result<Arg> {
        let (data, contained) = crate::value::collecting_refs(|| raylet_common::codec::encode(&self));
        Ok(Arg::Value {
            data: data?.into(),
            contained,
        })
    }
}

impl<T> IntoArg<T> for ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.raw()))
    }
}

impl<T> IntoArg<T> for &ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.raw()))
    }
}

/// Passes the reference itself to a function that takes an `ObjectRef<T>`.
impl<T> IntoArg<ObjectRef<T>> for &ObjectRef<T> {
    fn into_arg(self) -> Result<Arg> {
        <ObjectRef<T> as IntoArg<ObjectRef<T>>>::into_arg(self.clone())
    }
}
