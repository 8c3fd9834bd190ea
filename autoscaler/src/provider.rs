//! The seam between the autoscaler and whatever makes machines: a
//! [`NodeProvider`] launches a node of a configured type that joins the
//! head, lists what it launched with each instance's state, and terminates
//! an instance. Every launched node carries the label [`INSTANCE_LABEL`]
//! with its instance id, which is how the head's node table and the
//! provider's instances are matched.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use raylet_placement::autoscaler::NodeType;
use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::{Labels, ResourceSet};

/// The label every launched node carries: its provider's instance id.
pub const INSTANCE_LABEL: &str = "raylet.io/instance";
/// The environment variable that hands a launched node the cluster token:
/// never a flag, which any user of the machine could read in `ps`.
pub const TOKEN_ENV: &str = "RAYLET_TOKEN";

/// A provider's name for one launched node (a pid, a Slurm job id, a pod
/// name), unique among its instances.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an instance is, as its provider sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Started (or queued by a scheduler such as Slurm); whether its node
    /// joined is for the head to say.
    Running,
    /// Ended without being asked to: the reason, e.g. its exit status and
    /// the last lines it wrote.
    Failed(String),
}

/// What a launch asks for.
#[derive(Clone, Debug)]
pub struct LaunchRequest {
    pub node_type: NodeType,
    /// The head's gRPC address, `HOST:PORT`.
    pub head_address: String,
    /// The cluster token the node presents; providers pass it in
    /// [`TOKEN_ENV`], never on a command line.
    pub token: String,
}

/// One launched node as its provider lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: InstanceId,
    /// The name of its node type.
    pub node_type: String,
    pub state: InstanceState,
}

/// Why a provider call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("launching a node of type `{node_type}` failed: {message}")]
    Launch { node_type: String, message: String },
    #[error("listing the instances failed: {0}")]
    List(String),
    #[error("no instance `{0}`")]
    NoSuchInstance(InstanceId),
    #[error("tearing down what the provider set up failed: {0}")]
    TearDown(String),
    #[error("terminating instance `{instance}` failed: {message}")]
    Terminate { instance: InstanceId, message: String },
}

/// A provider call in flight.
pub type ProviderCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, ProviderError>> + Send + 'a>>;

/// Launches, lists and terminates the nodes of a cluster. Calls may take
/// seconds (a scheduler's command, an API server): they are futures.
pub trait NodeProvider: Send + Sync {
    /// Starts one node of `request.node_type` that joins the head, labelled
    /// with its instance id under [`INSTANCE_LABEL`].
    fn launch<'a>(&'a self, request: &'a LaunchRequest) -> ProviderCall<'a, InstanceId>;

    /// The instances of this cluster the provider launched and has not
    /// terminated, with their types' names and states; from the system
    /// that runs them where it can say, so that a restarted head finds
    /// the nodes its predecessor launched.
    fn instances(&self) -> ProviderCall<'_, Vec<Instance>>;

    /// Stops `instance` and forgets it; its node leaves the cluster.
    fn terminate<'a>(&'a self, instance: &'a InstanceId) -> ProviderCall<'a, ()>;

    /// Removes what the provider set up for all its nodes (the `netns`
    /// provider's bridge), once every instance is terminated.
    fn tear_down(&self) -> ProviderCall<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// The `raylet start --address` flags that give a node `node_type`'s
/// resources and labels, plus the instance label; for providers that run
/// `raylet start` (local processes, Slurm jobs, pods). The token is not
/// among them: it goes in [`TOKEN_ENV`].
pub fn start_flags(request: &LaunchRequest, instance: &InstanceId) -> Vec<String> {
    let resources = &request.node_type.resources;
    let mut flags = vec![
        "start".to_string(),
        "--address".to_string(),
        request.head_address.clone(),
        "--block".to_string(),
        "--labels".to_string(),
        labels_flag(&request.node_type.labels, instance),
    ];
    // CPUs and GPUs are the type's, none when it names none (no detection);
    // memory and object store are detected unless the type names them.
    for (name, flag) in [(CPU, "--num-cpus"), (GPU, "--num-gpus")] {
        flags.extend([flag.to_string(), resources.get(name).as_f64().to_string()]);
    }
    for (name, flag) in [(MEMORY, "--memory"), (OBJECT_STORE_MEMORY, "--object-store-memory")] {
        let amount = resources.get(name);
        if amount.raw() > 0 {
            flags.extend([flag.to_string(), amount.as_f64().to_string()]);
        }
    }
    if let Some(custom) = custom_resources(resources) {
        flags.extend(["--resources".to_string(), custom]);
    }
    flags
}

/// `k=v,..` of the type's labels and the instance label.
fn labels_flag(labels: &Labels, instance: &InstanceId) -> String {
    let instance = (INSTANCE_LABEL.to_string(), instance.0.clone());
    let pairs = labels.iter().map(|(k, v)| (k.clone(), v.clone())).chain([instance]);
    pairs.map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The JSON of the resources that have no flag of their own, if any.
fn custom_resources(resources: &ResourceSet) -> Option<String> {
    let custom: serde_json::Map<String, serde_json::Value> = resources
        .iter()
        .filter(|(name, _)| ![CPU, GPU, MEMORY, OBJECT_STORE_MEMORY].contains(name))
        .map(|(name, amount)| (name.to_string(), amount.as_f64().into()))
        .collect();
    (!custom.is_empty()).then(|| serde_json::Value::Object(custom).to_string())
}
