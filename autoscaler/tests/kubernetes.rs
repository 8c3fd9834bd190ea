//! The `kubernetes` provider against a mocked API server: a `kube::Client`
//! over a `tower::service_fn` that records each request (method, path and
//! query, JSON body) and answers as the API server would. Checks the calls
//! made, the Pod created, how listed pods map to instance states, and how
//! the server's refusals become `ProviderError`s.
#![cfg(feature = "kubernetes")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use raylet_autoscaler::{
    ClusterConfig, INSTANCE_LABEL, Instance, InstanceId, InstanceState, KubernetesConfig, KubernetesProvider,
    LaunchRequest, NodeProvider, ProviderConfig, ProviderError, PullPolicy,
};
use raylet_placement::autoscaler::NodeType;
use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::{Amount, ResourceSet};
use serde_json::{Value, json};

const TOKEN: &str = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";
const PODS_PATH: &str = "/api/v1/namespaces/ml/pods";

/// One request the mocked API server received.
#[derive(Debug)]
struct Recorded {
    method: Method,
    /// Path and query.
    uri: String,
    body: Value,
}

/// The API server's answer to a request: a status code and a JSON body.
type Reply = (StatusCode, Value);

/// The requests a mocked API server received, in order.
#[derive(Clone, Default)]
struct RequestLog(Arc<Mutex<Vec<Recorded>>>);

impl RequestLog {
    fn push(&self, recorded: Recorded) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(recorded);
    }

    fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A client whose API server answers each request with `answer(method,
/// path and query, body)`.
fn mock_client(answer: impl Fn(&Method, &str, &Value) -> Reply + Send + Sync + 'static) -> (kube::Client, RequestLog) {
    let log = RequestLog::default();
    let answer = Arc::new(answer);
    let recorder = log.clone();
    let service = tower::service_fn(move |request: Request<Body>| {
        let (answer, log) = (answer.clone(), recorder.clone());
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await?;
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes)?
            };
            let uri = parts.uri.path_and_query().map(ToString::to_string).unwrap_or_default();
            let (status, reply) = answer(&parts.method, &uri, &body);
            log.push(Recorded {
                method: parts.method,
                uri,
                body,
            });
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply)?))?;
            Ok::<_, tower::BoxError>(response)
        }
    });
    (kube::Client::new(service, "default"), log)
}

fn config() -> KubernetesConfig {
    KubernetesConfig {
        head_address: None,
        namespace: Some("ml".to_string()),
        image: "registry.example.com/raylet:0.1.0".to_string(),
        image_pull_policy: PullPolicy::Always,
        token_secret: "demo-token".to_string(),
        token_secret_key: "value".to_string(),
        service_account: Some("raylet-node".to_string()),
        pod_template: None,
        node_type_templates: BTreeMap::new(),
    }
}

fn mock_provider(
    config: KubernetesConfig,
    answer: impl Fn(&Method, &str, &Value) -> Reply + Send + Sync + 'static,
) -> (KubernetesProvider, RequestLog) {
    let (client, log) = mock_client(answer);
    (KubernetesProvider::new("demo", config, client), log)
}

fn gpu_request() -> LaunchRequest {
    let mut resources = ResourceSet::new();
    for (name, value) in [(CPU, 4.0), (GPU, 1.0), (MEMORY, 8e9), (OBJECT_STORE_MEMORY, 2e9)] {
        resources.set(name, Amount::parse(name, value).unwrap());
    }
    let mut node_type = NodeType::new("gpu_4", resources, 2);
    node_type.labels.insert("zone".to_string(), "a".to_string());
    LaunchRequest {
        node_type,
        head_address: "10.0.0.1:6380".to_string(),
        token: TOKEN.to_string(),
    }
}

/// The API server's answer to a create: the pod as stored.
fn created(body: &Value) -> Reply {
    (StatusCode::CREATED, body.clone())
}

/// A `Status` failure as the API server sends it.
fn status_failure(code: StatusCode, reason: &str, message: &str) -> Reply {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, status)
}

/// A request's path and its query's pairs, percent-decoded.
fn path_and_query(uri: &str) -> (&str, Vec<(String, String)>) {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let pairs = query.split('&').filter(|pair| !pair.is_empty()).map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decoded(key), percent_decoded(value))
    });
    (path, pairs.collect())
}

fn percent_decoded(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        match (byte, tail.get(..2)) {
            (b'%', Some(hex)) => {
                let hex = std::str::from_utf8(hex).expect("ASCII");
                bytes.push(u8::from_str_radix(hex, 16).expect("a %XX escape"));
                rest = &tail[2..];
            }
            _ => {
                bytes.push(byte);
                rest = tail;
            }
        }
    }
    String::from_utf8(bytes).expect("UTF-8")
}

fn only_request(log: &RequestLog) -> Recorded {
    let mut requests = log.take();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    requests.remove(0)
}

fn raylet_container(pod: &Value) -> &Value {
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    containers
        .iter()
        .find(|c| c["name"] == "raylet")
        .expect("a raylet container")
}

#[tokio::test]
async fn launch_creates_a_labelled_pod_that_runs_raylet_start() {
    let (provider, log) = mock_provider(config(), |_, _, body| created(body));
    let instance = provider.launch(&gpu_request()).await.expect("launch");

    let name = &instance.0;
    let suffix = name.strip_prefix("raylet-demo-gpu-4-").expect(name);
    assert_eq!(suffix.len(), 5, "{name}");
    let request = only_request(&log);
    assert_eq!(request.method, Method::POST);
    assert_eq!(path_and_query(&request.uri), (PODS_PATH, vec![]));
    let pod = &request.body;
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["name"], name.as_str());
    let labels = json!({
        "app.kubernetes.io/name": "raylet", "app.kubernetes.io/component": "worker",
        "raylet.io/cluster": "demo", "raylet.io/node-type": "gpu_4", INSTANCE_LABEL: name,
    });
    assert_eq!(pod["metadata"]["labels"], labels);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"]["serviceAccountName"], "raylet-node");
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);

    let container = raylet_container(pod);
    assert_eq!(container["image"], "registry.example.com/raylet:0.1.0");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container.get("command"), None, "the image's entrypoint runs raylet");
    let args = json!([
        "start",
        "--address",
        "10.0.0.1:6380",
        "--block",
        "--labels",
        format!("zone=a,raylet.io/instance={name}"),
        "--num-cpus",
        "4",
        "--num-gpus",
        "1",
        "--memory",
        "8000000000",
        "--object-store-memory",
        "2000000000",
        "--node-ip",
        "$(POD_IP)",
    ]);
    assert_eq!(container["args"], args);
    let env = json!([
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "RAYLET_TOKEN", "valueFrom": {"secretKeyRef": {"name": "demo-token", "key": "value", "optional": false}}},
    ]);
    assert_eq!(container["env"], env);
    let resources = json!({
        "requests": {"cpu": "4", "memory": "10000000000"},
        "limits": {"cpu": "4", "memory": "10000000000", "nvidia.com/gpu": "1"},
    });
    assert_eq!(container["resources"], resources);
    assert_eq!(container["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert!(!pod.to_string().contains(TOKEN), "the token is in the pod spec: {pod}");
}

#[tokio::test]
async fn a_pod_template_is_kept_where_the_provider_owns_nothing() {
    let template = json!({
        "metadata": {"labels": {"team": "vision", "raylet.io/cluster": "spoofed"}, "namespace": "other"},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "restartPolicy": "Always",
            "containers": [
                {"name": "log-shipper", "image": "fluent-bit:3"},
                {"name": "raylet", "image": "ignored:1", "command": ["raylet"],
                 "env": [{"name": "RUST_LOG", "value": "info"}, {"name": "RAYLET_TOKEN", "value": "leaked"}],
                 "resources": {"limits": {"ephemeral-storage": "20Gi", "cpu": "64"}}},
            ],
        },
    });
    let config = KubernetesConfig {
        pod_template: Some(serde_json::from_value(template).unwrap()),
        service_account: None,
        head_address: Some("raylet-head:6380".to_string()),
        ..config()
    };
    let (provider, log) = mock_provider(config, |_, _, body| created(body));
    let instance = provider.launch(&gpu_request()).await.expect("launch");

    let pod = only_request(&log).body;
    let labels = json!({
        "team": "vision", "raylet.io/cluster": "demo", "raylet.io/node-type": "gpu_4", INSTANCE_LABEL: instance.0,
    });
    assert_eq!(pod["metadata"]["labels"], labels);
    assert_eq!(pod["metadata"].get("namespace"), None);
    assert_eq!(pod["spec"]["nodeSelector"], json!({"pool": "gpu"}));
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"].get("serviceAccountName"), None);
    assert_eq!(pod["spec"]["containers"][0]["name"], "log-shipper");
    let container = raylet_container(&pod);
    assert_eq!(container["command"], json!(["raylet"]));
    let args = container["args"].as_array().expect("args");
    assert_eq!(args[..4], ["start", "--address", "raylet-head:6380", "--block"]);
    assert_eq!(container["image"], "registry.example.com/raylet:0.1.0");
    let env_names: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|var| var["name"].as_str().unwrap())
        .collect();
    assert_eq!(env_names, ["RUST_LOG", "POD_IP", "RAYLET_TOKEN"]);
    assert!(!pod.to_string().contains("leaked"), "{pod}");
    let limits = json!({"ephemeral-storage": "20Gi", "cpu": "4", "memory": "10000000000", "nvidia.com/gpu": "1"});
    assert_eq!(container["resources"]["limits"], limits);
}

#[tokio::test]
async fn a_node_types_own_template_wins_over_the_common_one() {
    let on_pool = |pool: &str| {
        serde_json::from_value(json!({"spec": {"nodeSelector": {"pool": pool}, "containers": []}})).unwrap()
    };
    let config = KubernetesConfig {
        pod_template: Some(Box::new(on_pool("cpu"))),
        node_type_templates: BTreeMap::from([("gpu_4".to_string(), on_pool("gpu"))]),
        ..config()
    };
    let (provider, log) = mock_provider(config, |_, _, body| created(body));
    let gpu = gpu_request();
    let mut cpu = gpu_request();
    cpu.node_type.name = "cpu_4".to_string();
    provider.launch(&gpu).await.expect("launch gpu");
    provider.launch(&cpu).await.expect("launch cpu");

    let pools: Vec<Value> = log
        .take()
        .iter()
        .map(|r| r.body["spec"]["nodeSelector"]["pool"].clone())
        .collect();
    assert_eq!(pools, [json!("gpu"), json!("cpu")]);
}

#[tokio::test]
async fn a_refused_create_is_a_launch_error_quoting_the_api_server() {
    let forbidden = "pods is forbidden: User \"system:serviceaccount:ml:raylet-head\" cannot create resource \"pods\" \
                     in API group \"\" in the namespace \"ml\"";
    let (provider, _) = mock_provider(config(), move |_, _, _| {
        status_failure(StatusCode::FORBIDDEN, "Forbidden", forbidden)
    });
    let error = provider.launch(&gpu_request()).await.expect_err("forbidden");
    match &error {
        ProviderError::Launch { node_type, message } => {
            assert_eq!(node_type, "gpu_4");
            assert_eq!(message, &format!("403 Forbidden: {forbidden}"));
        }
        other => panic!("not a launch error: {other:?}"),
    }
    assert!(error.to_string().contains("cannot create resource \"pods\""), "{error}");

    let taken = "pods \"raylet-demo-gpu-4-bcdfg\" already exists";
    let (provider, _) = mock_provider(config(), move |_, _, _| {
        status_failure(StatusCode::CONFLICT, "AlreadyExists", taken)
    });
    let error = provider.launch(&gpu_request()).await.expect_err("conflict");
    assert!(
        matches!(&error, ProviderError::Launch { message, .. } if message == &format!("409 AlreadyExists: {taken}")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_node_type_that_is_no_label_value_is_refused_before_any_call() {
    let (provider, log) = mock_provider(config(), |_, _, body| created(body));
    let mut request = gpu_request();
    request.node_type.name = "gpu/large".to_string();
    let error = provider.launch(&request).await.expect_err("bad name");
    assert!(
        matches!(&error, ProviderError::Launch { message, .. } if message.contains("`gpu/large`")),
        "{error:?}"
    );
    assert!(log.take().is_empty());
}

/// A pod of the cluster as the API server lists it.
fn listed_pod(name: &str, node_type: &str, status: Value) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"raylet.io/cluster": "demo", "raylet.io/node-type": node_type}},
        "spec": {"containers": [{"name": "raylet"}]},
        "status": status,
    })
}

fn container_status(state: Value, last_state: Value) -> Value {
    json!({"name": "raylet", "image": "raylet:dev", "imageID": "", "ready": false, "restartCount": 3,
           "state": state, "lastState": last_state})
}

fn pod_list() -> Value {
    let exited = json!({"terminated": {"exitCode": 1, "reason": "Error", "message": "error: the head at 10.0.0.1:6380 refused the token\n"}});
    let crash_loop = container_status(
        json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container=raylet"}}),
        exited.clone(),
    );
    let pull_failed = container_status(
        json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"raylet:typo\""}}),
        json!({}),
    );
    let creating = container_status(json!({"waiting": {"reason": "ContainerCreating"}}), json!({}));
    let mut deleted = listed_pod("raylet-demo-cpu-ddddd", "cpu", json!({"phase": "Running"}));
    deleted["metadata"]["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
    json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "42"},
        "items": [
            listed_pod("raylet-demo-cpu-aaaaa", "cpu", json!({"phase": "Pending"})),
            listed_pod("raylet-demo-cpu-bbbbb", "cpu", json!({"phase": "Pending", "containerStatuses": [creating]})),
            listed_pod("raylet-demo-cpu-ccccc", "cpu", json!({"phase": "Running", "containerStatuses": [container_status(json!({"running": {}}), json!({}))]})),
            deleted,
            listed_pod("raylet-demo-gpu-fffff", "gpu", json!({"phase": "Running", "containerStatuses": [crash_loop]})),
            listed_pod("raylet-demo-gpu-ggggg", "gpu", json!({"phase": "Pending", "containerStatuses": [pull_failed]})),
            listed_pod("raylet-demo-gpu-hhhhh", "gpu", json!({"phase": "Failed", "containerStatuses": [container_status(exited, json!({}))]})),
            listed_pod("raylet-demo-cpu-iiiii", "cpu", json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})),
        ],
    })
}

fn instance(name: &str, node_type: &str, state: InstanceState) -> Instance {
    Instance {
        id: InstanceId(name.to_string()),
        node_type: node_type.to_string(),
        state,
    }
}

#[tokio::test]
async fn instances_are_the_clusters_pods_with_their_states() {
    let (provider, log) = mock_provider(config(), |_, _, _| (StatusCode::OK, pod_list()));
    let instances = provider.instances().await.expect("instances");

    let request = only_request(&log);
    assert_eq!(request.method, Method::GET);
    let (path, query) = path_and_query(&request.uri);
    assert_eq!(path, PODS_PATH);
    assert_eq!(
        query,
        [("labelSelector".to_string(), "raylet.io/cluster=demo".to_string())]
    );
    let failed = |reason: &str| InstanceState::Failed(reason.to_string());
    let expected = vec![
        instance("raylet-demo-cpu-aaaaa", "cpu", InstanceState::Running),
        instance("raylet-demo-cpu-bbbbb", "cpu", InstanceState::Running),
        instance("raylet-demo-cpu-ccccc", "cpu", InstanceState::Running),
        instance(
            "raylet-demo-gpu-fffff",
            "gpu",
            failed(
                "container raylet is CrashLoopBackOff: back-off 5m0s restarting failed container=raylet; \
                 it last exited with 1 (Error): error: the head at 10.0.0.1:6380 refused the token",
            ),
        ),
        instance(
            "raylet-demo-gpu-ggggg",
            "gpu",
            failed("container raylet is ImagePullBackOff: Back-off pulling image \"raylet:typo\""),
        ),
        instance(
            "raylet-demo-gpu-hhhhh",
            "gpu",
            failed(
                "pod Failed; container raylet exited with 1 (Error): error: the head at 10.0.0.1:6380 refused the token",
            ),
        ),
        instance(
            "raylet-demo-cpu-iiiii",
            "cpu",
            failed("pod Failed (Evicted: The node was low on resource: memory.)"),
        ),
    ];
    assert_eq!(instances, expected);
}

#[tokio::test]
async fn a_refused_list_is_a_list_error() {
    let forbidden = "pods is forbidden: User \"system:serviceaccount:ml:default\" cannot list resource \"pods\"";
    let (provider, _) = mock_provider(config(), move |_, _, _| {
        status_failure(StatusCode::FORBIDDEN, "Forbidden", forbidden)
    });
    let error = provider.instances().await.expect_err("forbidden");
    assert!(
        matches!(&error, ProviderError::List(message) if message == &format!("403 Forbidden: {forbidden}")),
        "{error:?}"
    );
}

#[tokio::test]
async fn terminate_deletes_the_pod_and_a_missing_one_is_already_gone() {
    let pod = InstanceId("raylet-demo-cpu-aaaaa".to_string());
    let (provider, log) = mock_provider(config(), |_, _, _| {
        let deleting =
            json!({"metadata": {"name": "raylet-demo-cpu-aaaaa", "deletionTimestamp": "2026-11-27T00:00:00Z"}});
        (StatusCode::OK, deleting)
    });
    provider.terminate(&pod).await.expect("terminate");
    let request = only_request(&log);
    assert_eq!(request.method, Method::DELETE);
    let pod_path = format!("{PODS_PATH}/raylet-demo-cpu-aaaaa");
    assert_eq!(path_and_query(&request.uri), (pod_path.as_str(), vec![]));

    let (provider, log) = mock_provider(config(), |_, _, _| {
        status_failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            "pods \"raylet-demo-cpu-aaaaa\" not found",
        )
    });
    provider
        .terminate(&pod)
        .await
        .expect("a pod already gone is terminated");
    assert_eq!(only_request(&log).method, Method::DELETE);

    let (provider, _) = mock_provider(config(), |_, _, _| {
        status_failure(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "pods \"raylet-demo-cpu-aaaaa\" is forbidden",
        )
    });
    let error = provider.terminate(&pod).await.expect_err("forbidden");
    assert!(
        matches!(&error, ProviderError::Terminate { instance, message } if instance == &pod && message.starts_with("403 Forbidden: ")),
        "{error:?}"
    );
}

#[test]
fn the_example_cluster_config_loads_as_a_kubernetes_cluster() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/cluster.yaml");
    let cluster = ClusterConfig::load(&path).expect("deploy/kubernetes/cluster.yaml");
    let ProviderConfig::Kubernetes(config) = &cluster.provider else {
        panic!("not a kubernetes provider: {:?}", cluster.provider);
    };
    assert_eq!(config.namespace, None, "the pods go to the head's namespace");
    assert_eq!(
        (config.token_secret.as_str(), config.token_secret_key.as_str()),
        ("raylet-token", "token")
    );
    let template = config.pod_template.clone().expect("the example has a pod template");
    let containers = template.spec.expect("spec").containers;
    assert!(containers.iter().any(|c| c.name == "raylet"), "{containers:?}");
    let types: Vec<&str> = cluster.autoscaler.node_types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(types, ["cpu-4", "gpu-1"]);
}

#[test]
fn a_config_names_only_known_fields() {
    let error = serde_yaml_ng::from_str::<KubernetesConfig>("image: raylet:dev\nnamspace: ml\n").expect_err("typo");
    assert!(error.to_string().contains("namspace"), "{error}");
    let defaults: KubernetesConfig = serde_yaml_ng::from_str("{}").unwrap();
    assert_eq!(defaults, KubernetesConfig::default());
    assert_eq!(defaults.image_pull_policy, PullPolicy::IfNotPresent);
}
