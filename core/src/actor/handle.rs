//! Actor handles: the untyped [`ActorHandle`] that `#[raylet::actor]` wraps
//! in a typed one, the [`Actor`] trait that ties a type to its handle, and
//! the options and builder that create an actor.

use std::marker::PhantomData;

use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::{ActorId, ResourceSet, SchedulingStrategy, TaskId};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::generator::{Caller, ObjectRefStream};
use crate::objects::object_ref::handle::{AnyObjectRef, RawRef};
use crate::submitter::resources::Resources;
use crate::submitter::task::{Arg, SchedulingOptions};
use crate::task_error::{TaskError, TaskErrorKind};
use crate::{Cluster, ObjectRef, PlacementGroup, Result};

/// A type made into an actor with `#[raylet::actor]`.
pub trait Actor {
    /// The name the type is registered under: its module path and name.
    const CLASS: &'static str;
    /// Its typed handle.
    type Handle: From<ActorHandle>;
}

/// A handle to an actor of any type. It is `Clone` and `Serialize`: pass it
/// to tasks and to other actors, which call the same actor through it.
/// Calls made through the handles of one process run in submission order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorHandle {
    id: ActorId,
    class: String,
    max_task_retries: u32,
}

impl ActorHandle {
    pub(crate) fn new(id: ActorId, class: &str, max_task_retries: u32) -> Self {
        ActorHandle {
            id,
            class: class.to_string(),
            max_task_retries,
        }
    }

    pub fn id(&self) -> ActorId {
        self.id
    }

    /// The registered name of the actor's type.
    pub fn class_name(&self) -> &str {
        &self.class
    }

    pub(crate) fn max_task_retries(&self) -> u32 {
        self.max_task_retries
    }

    /// Calls `method` with `args`; the methods of typed handles call this.
    /// A call that cannot be submitted yields its error from `get`.
    pub fn call<R>(&self, method: &'static str, args: Result<Vec<Arg>>) -> ObjectRef<R> {
        let mut returns = self.submit(method, args, CallShape::values(1)).1;
        returns.remove(0).typed()
    }

    /// Calls `method`, which returns `count` values (`num_returns`): one
    /// reference to each, in order.
    pub fn call_returns(&self, method: &'static str, args: Result<Vec<Arg>>, count: u32) -> Vec<AnyObjectRef> {
        self.submit(method, args, CallShape::values(count)).1
    }

    /// Calls `method`, a generator: its items stream back as it yields
    /// them; it pauses while `backpressure` of them are not taken (the
    /// default when `None`, 0 for no bound).
    pub fn call_generator<T>(
        &self,
        method: &'static str,
        args: Result<Vec<Arg>>,
        backpressure: Option<u64>,
    ) -> Result<ObjectRefStream<T>> {
        let backpressure = backpressure.unwrap_or(crate::generator::DEFAULT_BACKPRESSURE);
        let cluster = crate::current()?;
        let (task_id, returns) = self.submit(method, args, CallShape::generator(backpressure));
        Ok(ObjectRefStream::of_call(
            cluster.core(),
            task_id,
            returns,
            Caller::Actor,
        ))
    }

    /// Submits a call through this process's cluster; without one, the
    /// references name objects nobody will make.
    fn submit(&self, method: &'static str, args: Result<Vec<Arg>>, shape: CallShape) -> (TaskId, Vec<AnyObjectRef>) {
        let function = format!("{}::{method}", self.class);
        let task_id = TaskId::random();
        let cluster = match crate::current() {
            Ok(cluster) => cluster,
            Err(_) => {
                let unheld = (0..u64::from(shape.num_returns)).map(|index| {
                    let raw = RawRef {
                        id: task_id.object_at(index),
                        owner: "".into(),
                    };
                    AnyObjectRef::unheld(raw)
                });
                return (task_id, unheld.collect());
            }
        };
        let args = args.map_err(|e| TaskError::new(TaskErrorKind::Argument, &function, e.to_string()));
        cluster.call_actor(self, (method, function), args, shape)
    }
}

/// What a call returns: several values, or a generator's items.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallShape {
    pub(crate) num_returns: u32,
    /// Set for a generator: the items it may send ahead.
    pub(crate) generator: Option<u64>,
}

impl CallShape {
    fn values(count: u32) -> Self {
        CallShape {
            num_returns: count.max(1),
            generator: None,
        }
    }

    fn generator(backpressure: u64) -> Self {
        CallShape {
            num_returns: 1,
            generator: Some(backpressure),
        }
    }
}

/// How a handle travels: the actor's id, its type and its retry policy.
#[derive(Serialize, Deserialize)]
struct WireHandle {
    #[serde(with = "serde_bytes")]
    id: Vec<u8>,
    class: String,
    max_task_retries: u32,
}

impl Serialize for ActorHandle {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = WireHandle {
            id: self.id.as_bytes().to_vec(),
            class: self.class.clone(),
            max_task_retries: self.max_task_retries,
        };
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ActorHandle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireHandle::deserialize(deserializer)?;
        let id = ActorId::from_wire(&wire.id).map_err(serde::de::Error::custom)?;
        Ok(ActorHandle::new(id, &wire.class, wire.max_task_retries))
    }
}

/// How an actor is placed, named, kept and restarted.
#[derive(Clone, Debug)]
pub struct ActorOptions {
    pub(crate) class: &'static str,
    pub(crate) resources: Resources,
    pub(crate) scheduling: SchedulingOptions,
    pub(crate) name: String,
    /// `None`: the namespace of the creating program.
    pub(crate) namespace: Option<String>,
    pub(crate) detached: bool,
    pub(crate) max_restarts: i32,
    pub(crate) max_task_retries: u32,
    pub(crate) max_concurrency: u32,
}

impl ActorOptions {
    /// Defaults as in Ray: 1 CPU to place the actor and none while it runs,
    /// no name, owned by its creator, no restarts, one call at a time.
    pub fn new(class: &'static str) -> Self {
        ActorOptions {
            class,
            resources: Resources::default(),
            scheduling: SchedulingOptions::default(),
            name: String::new(),
            namespace: None,
            detached: false,
            max_restarts: 0,
            max_task_retries: 0,
            max_concurrency: 1,
        }
    }

    /// What a node must have free to place the actor, and what the actor
    /// holds while it runs: an actor that names no CPUs is placed with one
    /// and holds none. Inside a placement group both come out of a bundle.
    pub(crate) fn demands(&self) -> Result<(ResourceSet, ResourceSet)> {
        let running = self.resources.to_set()?;
        let placement = match self.resources.names(CPU) {
            true => running.clone(),
            false => self.resources.clone().with(CPU, 1.0).to_set()?,
        };
        let scheduling = &self.scheduling;
        Ok((scheduling.in_bundle(placement)?, scheduling.in_bundle(running)?))
    }
}

/// Creates an actor: `Counter::remote(&cluster, args..)` returns one, its
/// methods set options, and `spawn()` creates the actor.
#[must_use = "an actor is created only by spawn()"]
pub struct ActorBuilder<H> {
    cluster: Cluster,
    options: ActorOptions,
    args: Result<Vec<Arg>>,
    handle: PhantomData<fn() -> H>,
}

impl<H: From<ActorHandle>> ActorBuilder<H> {
    /// A builder for an actor of type `class`; `#[raylet::actor]` calls this.
    pub fn new(cluster: &Cluster, class: &'static str, args: Result<Vec<Arg>>) -> Self {
        ActorBuilder {
            cluster: cluster.clone(),
            options: ActorOptions::new(class),
            args,
            handle: PhantomData,
        }
    }

    /// CPUs held to place the actor and while it runs (default: 1 to place, 0 to run).
    pub fn num_cpus(self, amount: f64) -> Self {
        self.resource(CPU, amount)
    }

    pub fn num_gpus(self, amount: f64) -> Self {
        self.resource(GPU, amount)
    }

    /// Bytes of memory the actor holds.
    pub fn memory(self, bytes: f64) -> Self {
        self.resource(MEMORY, bytes)
    }

    /// Any resource by name, e.g. `resource("TPU", 1.0)`.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.options.resources = self.options.resources.with(name, amount);
        self
    }

    /// How the node is chosen among those that fit (default: Ray's hybrid
    /// policy; `Spread`; or a node affinity).
    pub fn scheduling_strategy(mut self, strategy: SchedulingStrategy) -> Self {
        self.options.scheduling = self.options.scheduling.strategy(strategy);
        self
    }

    /// Runs the actor in bundle `bundle` of `group`, or in any of its
    /// bundles; its resources come out of the bundle's.
    pub fn placement_group(mut self, group: &PlacementGroup, bundle: Option<u32>) -> Self {
        self.options.scheduling = self.options.scheduling.in_group(group, bundle);
        self
    }

    /// Places the actor only on nodes whose label `key` satisfies
    /// `expression`: `value`, `!value`, `in(a,b)` or `!in(a,b)`.
    pub fn label_selector(mut self, key: &str, expression: &str) -> Self {
        self.options.scheduling = self.options.scheduling.label(key, expression);
        self
    }

    /// A name to find the actor by with `Cluster::get_actor`, unique among
    /// the live actors of its namespace.
    pub fn name(mut self, name: &str) -> Self {
        self.options.name = name.to_string();
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.options.namespace = Some(namespace.to_string());
        self
    }

    /// Keeps the actor alive after its creator exits, until it is killed or
    /// the cluster stops (Ray's `lifetime="detached"`).
    pub fn detached(mut self) -> Self {
        self.options.detached = true;
        self
    }

    /// How often the actor is restarted when its process dies; -1: always.
    pub fn max_restarts(mut self, restarts: i32) -> Self {
        self.options.max_restarts = restarts;
        self
    }

    /// How often a call is sent again when the actor's process died while
    /// it ran (default 0: it fails with `ActorDied`).
    pub fn max_task_retries(mut self, retries: u32) -> Self {
        self.options.max_task_retries = retries;
        self
    }

    /// How many calls may run at once: threads for sync methods, concurrent
    /// futures for async ones (default 1).
    pub fn max_concurrency(mut self, calls: u32) -> Self {
        self.options.max_concurrency = calls;
        self
    }

    /// Creates the actor and returns its handle at once; calls made before
    /// the actor runs wait for it.
    pub fn spawn(self) -> Result<H> {
        let args = self.args?;
        Ok(H::from(self.cluster.create_actor(self.options, args)?))
    }
}
