//! The `kubernetes` provider: each node is a Pod made through the
//! Kubernetes API, named `raylet-<cluster>-<type>-<suffix>`, whose `raylet`
//! container runs `raylet start --address HEAD --block ...` and joins the
//! head. The pod name is the instance id.
//!
//! A pod is built from a template (its node type's in the config's
//! `node_type_templates`, else the config's `pod_template`, else a
//! built-in one like `deploy/kubernetes/worker.yaml`'s), into which the
//! provider writes what it owns: the pod's name and its labels
//! `raylet.io/cluster`, `raylet.io/node-type` and [`INSTANCE_LABEL`];
//! `restartPolicy: Never` (a node that dies is replaced by the autoscaler,
//! not restarted in place), the service account when the config names one;
//! and in the container named `raylet` (added when the template has none)
//! its image, pull policy, arguments, the env `POD_IP` (the downward API)
//! and [`TOKEN_ENV`] (a `secretKeyRef`: the token never appears in the pod
//! spec), the CPU, memory and `nvidia.com/gpu` of the node type, and
//! `terminationMessagePolicy: FallbackToLogsOnError`, so that a failed
//! pod's status quotes the end of its log. Everything else is the template's.
//! The container's command is the image's entrypoint, which must run
//! `raylet` (`deploy/docker/Dockerfile`'s is `tini -- raylet`).
//!
//! `instances` lists the pods labelled with the cluster, so a restarted
//! head finds its predecessor's nodes; `terminate` deletes a pod. The API
//! server's refusals (a missing RBAC verb, a name taken) come back as
//! [`ProviderError`]s quoting its status. Nothing is retried here: a failed
//! call is the autoscaler's to retry with backoff.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerState, ContainerStatus, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, PodStatus, PodTemplateSpec, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rand::Rng;
use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::{Amount, ResourceSet};
use serde::{Deserialize, Serialize};

use crate::provider::{
    INSTANCE_LABEL, Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderCall, ProviderError,
    TOKEN_ENV, start_flags,
};

/// The label naming the cluster a pod is a node of.
pub const CLUSTER_LABEL: &str = "raylet.io/cluster";
/// The label naming a pod's node type.
pub const NODE_TYPE_LABEL: &str = "raylet.io/node-type";
/// The container that runs `raylet`.
pub const CONTAINER_NAME: &str = "raylet";
/// The extended resource of NVIDIA's device plugin.
const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The env var holding the pod's IP, which the node binds and advertises.
const POD_IP_ENV: &str = "POD_IP";
/// The longest label value, and so the longest pod name (it is one).
const MAX_NAME_LEN: usize = 63;
/// Characters of the random part of a pod name: the API server's own for
/// `generateName`, with no vowels so that no word is spelled.
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const SUFFIX_LEN: usize = 5;
/// The node manager's share of its memory for the object store, in tenths,
/// when the node type names none (`OBJECT_STORE_SHARE` = 0.3 in
/// `node/src/resources.rs`): the pod's memory is sized
/// so that the type's `memory` is what remains for tasks.
const DETECTED_OBJECT_STORE_TENTHS: u64 = 3;
/// [`Amount`]'s fixed-point units per whole resource.
const SCALE: u64 = Amount::SCALE.unsigned_abs();
/// Container waiting reasons that do not clear up by themselves: the pod
/// will not become a node without a change to the config or the cluster.
const STUCK_WAITING_REASONS: [&str; 6] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// Where and how the provider makes pods: the `provider` section of a
/// cluster config with `type: kubernetes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The head's address as the pods dial it, `HOST:PORT`, in place of
    /// the one the head advertises: e.g. its Service, `raylet-head:6380`,
    /// which a new head pod keeps while its IP changes.
    pub head_address: Option<String>,
    /// The namespace of the pods; by default the client's: the head pod's
    /// own in a cluster, the kubeconfig context's outside one.
    pub namespace: Option<String>,
    /// The image of the `raylet` container; its entrypoint must run
    /// `raylet` (as `deploy/docker/Dockerfile`'s does).
    pub image: String,
    /// When the kubelet pulls the image.
    pub image_pull_policy: PullPolicy,
    /// The Secret, in the pods' namespace, that holds the cluster token:
    /// the one the head runs with.
    pub token_secret: String,
    /// The key of the token in `token_secret`.
    pub token_secret_key: String,
    /// The service account the pods run as; by default the template's, and
    /// the built-in template mounts no API token (nodes need no API access).
    pub service_account: Option<String>,
    /// The pods' template (metadata and spec, as in a Deployment's
    /// `template`), replacing the built-in one: node selectors,
    /// tolerations, volumes, sidecars. The provider writes the fields it
    /// owns (see the module's doc) over it.
    pub pod_template: Option<Box<PodTemplateSpec>>,
    /// Templates for the pods of some node types, by type name, in place
    /// of `pod_template` (e.g. a GPU type's node selector and tolerations).
    pub node_type_templates: BTreeMap<String, PodTemplateSpec>,
}

/// A container's `imagePullPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

impl Default for KubernetesConfig {
    /// The names `deploy/kubernetes` uses: image `raylet:dev`, Secret
    /// `raylet-token` with key `token`.
    fn default() -> Self {
        KubernetesConfig {
            head_address: None,
            namespace: None,
            image: "raylet:dev".to_string(),
            image_pull_policy: PullPolicy::IfNotPresent,
            token_secret: "raylet-token".to_string(),
            token_secret_key: "token".to_string(),
            service_account: None,
            pod_template: None,
            node_type_templates: BTreeMap::new(),
        }
    }
}

/// No Kubernetes API could be reached: neither an in-cluster service
/// account nor a usable kubeconfig was found, or the client failed.
#[derive(Debug, thiserror::Error)]
#[error("connecting to the Kubernetes API: {0}")]
pub struct ConnectError(#[from] kube::Error);

/// Nodes as pods of one namespace.
pub struct KubernetesProvider {
    cluster_name: String,
    config: KubernetesConfig,
    pods: Api<Pod>,
}

impl KubernetesProvider {
    /// Makes the pods of `cluster_name` through `client`, in the config's
    /// namespace or else the client's default one.
    pub fn new(cluster_name: &str, config: KubernetesConfig, client: kube::Client) -> Self {
        let pods = match &config.namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::default_namespaced(client),
        };
        KubernetesProvider {
            cluster_name: cluster_name.to_string(),
            config,
            pods,
        }
    }

    /// [`KubernetesProvider::new`] with a client configured from the
    /// environment: the pod's service account inside a cluster, else the
    /// kubeconfig (`KUBECONFIG` or `~/.kube/config`) and its context.
    pub async fn connect(cluster_name: &str, config: KubernetesConfig) -> Result<Self, ConnectError> {
        let client = kube::Client::try_default().await?;
        Ok(Self::new(cluster_name, config, client))
    }

    async fn create_pod(&self, request: &LaunchRequest) -> Result<InstanceId, ProviderError> {
        let node_type = &request.node_type.name;
        let launch_error = |message: String| ProviderError::Launch {
            node_type: node_type.clone(),
            message,
        };
        check_label_value("cluster name", &self.cluster_name).map_err(|e| launch_error(e.to_string()))?;
        check_label_value("node type name", node_type).map_err(|e| launch_error(e.to_string()))?;
        let instance = InstanceId(pod_name(&self.cluster_name, node_type, &random_suffix()));
        let pod = self.pod(request, &instance);
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| launch_error(api_message(&e)))?;
        tracing::info!(%instance, node_type = %node_type, "created a node pod");
        Ok(instance)
    }

    /// The pod of one node: the template with the provider's fields.
    fn pod(&self, request: &LaunchRequest, instance: &InstanceId) -> Pod {
        let template = self.template(&request.node_type.name);
        let mut metadata = template.metadata.unwrap_or_default();
        metadata.name = Some(instance.0.clone());
        metadata.namespace = None;
        metadata
            .labels
            .get_or_insert_default()
            .extend(self.pod_labels(request, instance));
        let mut spec = template.spec.unwrap_or_default();
        spec.restart_policy = Some("Never".to_string());
        if let Some(account) = &self.config.service_account {
            spec.service_account_name = Some(account.clone());
        }
        self.fill_container(raylet_container(&mut spec), request, instance);
        Pod {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }

    /// The node type's template, else the config's, else the built-in one.
    fn template(&self, node_type: &str) -> PodTemplateSpec {
        let configured = self.config.node_type_templates.get(node_type);
        let configured = configured.or(self.config.pod_template.as_deref());
        configured.cloned().unwrap_or_else(default_pod_template)
    }

    fn pod_labels(&self, request: &LaunchRequest, instance: &InstanceId) -> [(String, String); 3] {
        [
            (CLUSTER_LABEL.to_string(), self.cluster_name.clone()),
            (NODE_TYPE_LABEL.to_string(), request.node_type.name.clone()),
            (INSTANCE_LABEL.to_string(), instance.0.clone()),
        ]
    }

    fn fill_container(&self, container: &mut Container, request: &LaunchRequest, instance: &InstanceId) {
        container.image = Some(self.config.image.clone());
        container.image_pull_policy = Some(self.config.image_pull_policy.as_str().to_string());
        let mut args = match &self.config.head_address {
            Some(head_address) => start_flags(&with_head_address(request, head_address), instance),
            None => start_flags(request, instance),
        };
        args.extend(["--node-ip".to_string(), format!("$({POD_IP_ENV})")]);
        container.args = Some(args);
        container.termination_message_policy = Some("FallbackToLogsOnError".to_string());
        set_env(container, [pod_ip_env(), self.token_env()]);
        set_resources(container, &request.node_type.resources);
    }

    /// [`TOKEN_ENV`] from the token Secret.
    fn token_env(&self) -> EnvVar {
        let secret = SecretKeySelector {
            name: self.config.token_secret.clone(),
            key: self.config.token_secret_key.clone(),
            optional: Some(false),
        };
        EnvVar {
            name: TOKEN_ENV.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(secret),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }
    }

    async fn list_instances(&self) -> Result<Vec<Instance>, ProviderError> {
        let selector = format!("{CLUSTER_LABEL}={}", self.cluster_name);
        let pods = self
            .pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| ProviderError::List(api_message(&e)))?;
        Ok(pods.items.iter().filter_map(instance_of).collect())
    }

    async fn delete_pod(&self, instance: &InstanceId) -> Result<(), ProviderError> {
        match self.pods.delete(&instance.0, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(%instance, "deleted a node pod");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(ProviderError::Terminate {
                instance: instance.clone(),
                message: api_message(&e),
            }),
        }
    }
}

impl NodeProvider for KubernetesProvider {
    fn launch<'a>(&'a self, request: &'a LaunchRequest) -> ProviderCall<'a, InstanceId> {
        Box::pin(self.create_pod(request))
    }

    fn instances(&self) -> ProviderCall<'_, Vec<Instance>> {
        Box::pin(self.list_instances())
    }

    fn terminate<'a>(&'a self, instance: &'a InstanceId) -> ProviderCall<'a, ()> {
        Box::pin(self.delete_pod(instance))
    }
}

fn with_head_address(request: &LaunchRequest, head_address: &str) -> LaunchRequest {
    LaunchRequest {
        head_address: head_address.to_string(),
        ..request.clone()
    }
}

/// What a failed call says: the API server's status (code, reason and
/// message, e.g. `403 Forbidden: pods is forbidden: ... cannot create
/// resource "pods" ...`), or the client's error.
fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} {}: {}", status.code, status.reason, status.message),
        other => other.to_string(),
    }
}

/// Labels take at most 63 characters of `[A-Za-z0-9._-]`, starting and
/// ending with a letter or digit.
fn check_label_value(what: &'static str, value: &str) -> Result<(), NotALabelValue> {
    let valid_chars = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let valid_ends =
        value.starts_with(|c: char| c.is_ascii_alphanumeric()) && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid_chars && valid_ends && value.len() <= MAX_NAME_LEN {
        Ok(())
    } else {
        Err(NotALabelValue {
            what,
            value: value.to_string(),
        })
    }
}

/// A cluster or node type name that Kubernetes does not take as a label value.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error(
    "the {what} `{value}` is not a Kubernetes label value (at most 63 letters, digits, `-`, `_` or `.`, \
     starting and ending with a letter or digit)"
)]
struct NotALabelValue {
    what: &'static str,
    value: String,
}

/// `raylet-<cluster>-<type>-<suffix>` as a DNS label: lower case, other
/// characters as `-`, the prefix shortened to fit 63 characters.
fn pod_name(cluster_name: &str, node_type: &str, suffix: &str) -> String {
    let prefix: String = format!("raylet-{cluster_name}-{node_type}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(MAX_NAME_LEN - suffix.len() - 1)
        .collect();
    format!("{}-{suffix}", prefix.trim_end_matches('-'))
}

fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..SUFFIX_LEN)
        .map(|_| char::from(SUFFIX_ALPHABET[rng.random_range(0..SUFFIX_ALPHABET.len())]))
        .collect()
}

/// The template's `raylet` container, added first when it has none.
fn raylet_container(spec: &mut PodSpec) -> &mut Container {
    let index = match spec.containers.iter().position(|c| c.name == CONTAINER_NAME) {
        Some(index) => index,
        None => {
            let container = Container {
                name: CONTAINER_NAME.to_string(),
                ..Container::default()
            };
            spec.containers.insert(0, container);
            0
        }
    };
    &mut spec.containers[index]
}

fn pod_ip_env() -> EnvVar {
    let field = ObjectFieldSelector {
        field_path: "status.podIP".to_string(),
        ..ObjectFieldSelector::default()
    };
    EnvVar {
        name: POD_IP_ENV.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(field),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Puts `vars` into the container's env, replacing the template's of the
/// same names.
fn set_env(container: &mut Container, vars: [EnvVar; 2]) {
    let env = container.env.get_or_insert_default();
    env.retain(|existing| vars.iter().all(|var| var.name != existing.name));
    env.extend(vars);
}

/// Requests and limits from the node type: CPU and memory (requests equal
/// to limits), `nvidia.com/gpu` (whole GPUs, limits only, as Kubernetes
/// wants for extended resources). What the type does not name is left to
/// the template; so are other resources, such as `ephemeral-storage`.
fn set_resources(container: &mut Container, resources: &ResourceSet) {
    let requirements = container.resources.get_or_insert_with(ResourceRequirements::default);
    let requested = [("cpu", cpu_quantity(resources)), ("memory", memory_quantity(resources))];
    for (name, quantity) in requested {
        let Some(quantity) = quantity else { continue };
        for map in [&mut requirements.requests, &mut requirements.limits] {
            map.get_or_insert_default().insert(name.to_string(), quantity.clone());
        }
    }
    if let Some(gpus) = gpu_quantity(resources) {
        requirements
            .limits
            .get_or_insert_default()
            .insert(GPU_RESOURCE.to_string(), gpus);
    }
}

/// Whole CPUs as a number, fractions in millicores (`500m`), rounded up.
fn cpu_quantity(resources: &ResourceSet) -> Option<Quantity> {
    let cpus = resources.get(CPU);
    if cpus == Amount::ZERO {
        return None;
    }
    let millis = cpus.raw().unsigned_abs().div_ceil(SCALE / 1000);
    let text = if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    };
    Some(Quantity(text))
}

/// The pod's memory in bytes: the type's task memory plus its object
/// store, or, when it names no object store, enough that the node
/// manager's detected share for it leaves `memory` for tasks.
fn memory_quantity(resources: &ResourceSet) -> Option<Quantity> {
    let bytes = |name| resources.get(name).raw().unsigned_abs().div_ceil(SCALE);
    let (memory, object_store) = (bytes(MEMORY), bytes(OBJECT_STORE_MEMORY));
    let pod_bytes = match (memory, object_store) {
        (0, 0) => return None,
        (memory, 0) => (memory * 10).div_ceil(10 - DETECTED_OBJECT_STORE_TENTHS),
        _ => memory + object_store,
    };
    Some(Quantity(pod_bytes.to_string()))
}

/// Kubernetes schedules whole GPUs: a fractional type asks for the next one up.
fn gpu_quantity(resources: &ResourceSet) -> Option<Quantity> {
    let gpus = resources.get(GPU);
    (gpus != Amount::ZERO).then(|| Quantity(gpus.raw().unsigned_abs().div_ceil(SCALE).to_string()))
}

/// The template used when the config gives none: the pod of
/// `deploy/kubernetes/worker.yaml` without its probes (a launched node is
/// watched by the head, and a pod that dies is replaced, not restarted).
fn default_pod_template() -> PodTemplateSpec {
    let labels = [
        ("app.kubernetes.io/name", "raylet"),
        ("app.kubernetes.io/component", "worker"),
    ];
    let metadata = ObjectMeta {
        labels: Some(labels.map(|(k, v)| (k.to_string(), v.to_string())).into()),
        ..ObjectMeta::default()
    };
    let spec = PodSpec {
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        security_context: Some(non_root_pod()),
        containers: vec![Container {
            name: CONTAINER_NAME.to_string(),
            security_context: Some(unprivileged_container()),
            volume_mounts: Some(vec![mount("session", "/tmp/raylet"), mount("dshm", "/dev/shm")]),
            ..Container::default()
        }],
        volumes: Some(vec![empty_dir("session", None), empty_dir("dshm", Some("Memory"))]),
        ..PodSpec::default()
    };
    PodTemplateSpec {
        metadata: Some(metadata),
        spec: Some(spec),
    }
}

/// As the image's user `raylet` (uid 1000), with the runtime's seccomp profile.
fn non_root_pod() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(1000),
        run_as_group: Some(1000),
        fs_group: Some(1000),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

fn unprivileged_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

fn mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.to_string(),
        mount_path: path.to_string(),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_string),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A listed pod as an instance; none for a pod being deleted (it was
/// terminated) or one without a node type label (not made by a provider).
fn instance_of(pod: &Pod) -> Option<Instance> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = pod.metadata.name.clone()?;
    let node_type = pod.metadata.labels.as_ref()?.get(NODE_TYPE_LABEL)?.clone();
    let state = pod.status.as_ref().map_or(InstanceState::Running, pod_state);
    Some(Instance {
        id: InstanceId(name),
        node_type,
        state,
    })
}

/// Failed once the pod ended (a node never exits by itself) or a container
/// is stuck; else Running, including Pending: whether the node joined is
/// the head's to say, and a pod that never becomes one is terminated after
/// the autoscaler's join timeout.
fn pod_state(status: &PodStatus) -> InstanceState {
    match status.phase.as_deref() {
        Some(phase @ ("Failed" | "Succeeded")) => InstanceState::Failed(ended_reason(phase, status)),
        _ => stuck_reason(status).map_or(InstanceState::Running, InstanceState::Failed),
    }
}

fn container_statuses(status: &PodStatus) -> impl Iterator<Item = &ContainerStatus> {
    let init = status.init_container_statuses.iter().flatten();
    init.chain(status.container_statuses.iter().flatten())
}

/// `pod Failed (Evicted: ...); container raylet exited with 1 (Error): <log>`.
fn ended_reason(phase: &str, status: &PodStatus) -> String {
    let mut reason = format!("pod {phase}");
    let why = [&status.reason, &status.message].map(|part| part.as_deref().unwrap_or_default());
    if why.iter().any(|part| !part.is_empty()) {
        reason.push_str(&format!(" ({})", join_nonempty(&why, ": ")));
    }
    for container in container_statuses(status) {
        if let Some(exit) = exit_description(container.state.as_ref()) {
            reason.push_str(&format!("; container {} {exit}", container.name));
        }
    }
    reason
}

/// The first container waiting for a reason that does not clear by itself,
/// with its message and how it last ended.
fn stuck_reason(status: &PodStatus) -> Option<String> {
    container_statuses(status).find_map(|container| {
        let waiting = container.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        if !STUCK_WAITING_REASONS.contains(&reason) {
            return None;
        }
        let message = waiting.message.as_deref().unwrap_or_default();
        let mut text = format!(
            "container {} is {}",
            container.name,
            join_nonempty(&[reason, message], ": ")
        );
        if let Some(exit) = exit_description(container.last_state.as_ref()) {
            text.push_str(&format!("; it last {exit}"));
        }
        Some(text)
    })
}

/// `exited with 1 (Error): <termination message>`, for a terminated state.
fn exit_description(state: Option<&ContainerState>) -> Option<String> {
    let terminated = state?.terminated.as_ref()?;
    let reason = terminated.reason.as_deref().unwrap_or("no reason given");
    let message = terminated.message.as_deref().unwrap_or_default();
    let exit = format!("exited with {} ({reason})", terminated.exit_code);
    Some(join_nonempty(&[&exit, message.trim()], ": "))
}

fn join_nonempty(parts: &[&str], separator: &str) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|part| !part.is_empty()).collect();
    parts.join(separator)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(pairs: &[(&str, f64)]) -> ResourceSet {
        let mut set = ResourceSet::new();
        for &(name, value) in pairs {
            set.set(name, Amount::parse(name, value).unwrap());
        }
        set
    }

    #[test]
    fn pod_names_are_dns_labels_of_at_most_63_characters() {
        assert_eq!(pod_name("Demo", "cpu_4.big", "x2b9z"), "raylet-demo-cpu-4-big-x2b9z");
        let long = pod_name(&"c".repeat(40), &"t".repeat(40), "x2b9z");
        assert_eq!(long.len(), MAX_NAME_LEN);
        assert!(long.starts_with("raylet-cccc") && long.ends_with("-x2b9z"));
        let cut_at_dash = pod_name(&"c".repeat(49), "t", "x2b9z");
        assert!(!cut_at_dash.contains("--"), "{cut_at_dash}");
    }

    #[test]
    fn random_suffixes_use_the_alphabet() {
        let suffix = random_suffix();
        assert_eq!(suffix.len(), SUFFIX_LEN);
        assert!(suffix.bytes().all(|b| SUFFIX_ALPHABET.contains(&b)), "{suffix}");
    }

    #[test]
    fn label_values_are_checked() {
        assert!(check_label_value("x", "gpu_8.large-2").is_ok());
        for bad in ["", "-gpu", "gpu-", "gpu/8", &"g".repeat(64)] {
            let refused = NotALabelValue {
                what: "node type name",
                value: bad.to_string(),
            };
            assert_eq!(check_label_value("node type name", bad), Err(refused), "{bad:?}");
        }
    }

    #[test]
    fn quantities_follow_the_node_type() {
        let half = resources(&[(CPU, 0.5)]);
        assert_eq!(cpu_quantity(&half), Some(Quantity("500m".into())));
        assert_eq!(cpu_quantity(&resources(&[(CPU, 4.0)])), Some(Quantity("4".into())));
        assert_eq!(cpu_quantity(&resources(&[(GPU, 1.0)])), None);
        assert_eq!(gpu_quantity(&resources(&[(GPU, 0.5)])), Some(Quantity("1".into())));
        let both = resources(&[(MEMORY, 7e9), (OBJECT_STORE_MEMORY, 1e9)]);
        assert_eq!(memory_quantity(&both), Some(Quantity("8000000000".into())));
        let tasks_only = resources(&[(MEMORY, 7e9)]);
        assert_eq!(memory_quantity(&tasks_only), Some(Quantity("10000000000".into())));
        assert_eq!(memory_quantity(&half), None);
    }
}
