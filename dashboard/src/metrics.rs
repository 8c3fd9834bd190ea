//! `/metrics`: the cluster as Prometheus gauges, read from the head at
//! each scrape: nodes by state, each node's resources, utilization and
//! lease requests waiting or refused, actors, placement groups and jobs by
//! state, each GPU's model, utilization and memory, and each object store's
//! bytes used, spilled and moved; then the
//! head process's own registry: tasks by state, scheduling latency and the
//! latency of each gRPC method it serves.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus::{GaugeVec, Opts, Registry, TextEncoder};
use raylet_cluster_status::ClusterStatus;
use raylet_common::auth::AuthToken;

use raylet::JobClient;

/// The gauges of one scrape, in a registry of their own: the cluster is
/// read afresh at each scrape, so no series outlives what it describes.
#[derive(Default)]
struct Scrape {
    registry: Registry,
}

impl Scrape {
    /// A gauge family of this scrape with the label names `labels`.
    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        let gauge = GaugeVec::new(Opts::new(name, help), labels).expect("metric names and labels are valid");
        self.registry
            .register(Box::new(gauge.clone()))
            .expect("each family is registered once per scrape");
        gauge
    }

    /// The families as Prometheus text.
    fn encode(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .expect("gauges encode as text")
    }
}

/// Counts of `states` as samples labelled `state`, every known state
/// included (0 when none), so a series does not vanish.
fn by_state(family: &GaugeVec, known: &[&str], states: impl Iterator<Item = String>) {
    let mut counts: BTreeMap<String, f64> = known.iter().map(|state| (state.to_string(), 0.0)).collect();
    for state in states {
        *counts.entry(state).or_default() += 1.0;
    }
    for (state, count) in counts {
        family.with_label_values(&[state.as_str()]).set(count);
    }
}

/// The whole exposition for the cluster whose head is at `head`.
pub(super) async fn render(head: &str, token: &AuthToken, patience: Duration) -> raylet::Result<String> {
    let status = ClusterStatus::fetch(head, token, patience)
        .await
        .map_err(raylet::Error::Cluster)?;
    let actors = raylet::list_actors(head, token).await?;
    let groups = raylet::list_placement_groups(head, token).await?;
    let jobs = JobClient::connect(head, token).await?.list().await?;
    let stores = raylet::collect_memory(head, token).await?;

    let scrape = Scrape::default();
    node_families(&scrape, &status);
    gpu_families(&scrape, &status);
    let actor_states = scrape.gauge("raylet_actors", "Actors by state.", &["state"]);
    let states = actors.iter().map(|actor| actor.state.to_string());
    by_state(&actor_states, &["PENDING", "ALIVE", "RESTARTING", "DEAD"], states);
    let group_states = scrape.gauge("raylet_placement_groups", "Placement groups by state.", &["state"]);
    let known = ["PENDING", "CREATED", "RESCHEDULING", "INFEASIBLE", "REMOVED"];
    by_state(
        &group_states,
        &known,
        groups.iter().map(|group| group.state.to_string()),
    );
    let job_states = scrape.gauge("raylet_jobs", "Jobs by status.", &["state"]);
    let known = ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"];
    by_state(&job_states, &known, jobs.iter().map(|job| job.status.to_string()));
    store_families(&scrape, &stores);

    let mut out = scrape.encode();
    out.push_str(&raylet_common::metrics::encode_text());
    Ok(out)
}

fn node_families(scrape: &Scrape, status: &ClusterStatus) {
    let nodes = scrape.gauge("raylet_nodes", "Node incarnations by state.", &["state"]);
    let states = status.nodes.iter().map(|node| node.state.to_string());
    by_state(&nodes, &["ALIVE", "DEAD"], states);
    let per_resource = ["node", "resource"];
    let total = scrape.gauge(
        "raylet_node_resource_total",
        "Resources of each alive node.",
        &per_resource,
    );
    let available = scrape.gauge(
        "raylet_node_resource_available",
        "Resources of each alive node not held by leases, actors or bundles.",
        &per_resource,
    );
    let cpu = scrape.gauge(
        "raylet_node_cpu_percent",
        "CPU utilization of each alive node's machine.",
        &["node"],
    );
    let memory = scrape.gauge(
        "raylet_node_memory_used_bytes",
        "Memory used on each alive node's machine.",
        &["node"],
    );
    let pending = scrape.gauge(
        "raylet_lease_requests_pending",
        "Worker lease requests waiting on each alive node for room.",
        &["node"],
    );
    let infeasible = scrape.gauge(
        "raylet_lease_requests_infeasible",
        "Lease requests each alive node refused in the last 5 minutes because no node could ever fit them.",
        &["node"],
    );
    for node in status.alive() {
        let id = node.node_id.to_string();
        for (resource, amount) in node.total.iter() {
            total.with_label_values(&[id.as_str(), resource]).set(amount.as_f64());
        }
        for (resource, amount) in node.available.iter() {
            available
                .with_label_values(&[id.as_str(), resource])
                .set(amount.as_f64());
        }
        cpu.with_label_values(&[&id]).set(node.stats.cpu_percent);
        memory
            .with_label_values(&[&id])
            .set(node.stats.memory_used_bytes as f64);
        let count = |refused: bool| -> f64 {
            let demands = node.demands.iter().filter(|demand| demand.infeasible == refused);
            demands.map(|demand| demand.count as f64).sum()
        };
        pending.with_label_values(&[&id]).set(count(false));
        infeasible.with_label_values(&[&id]).set(count(true));
    }
}

/// Each alive node's GPUs: utilization and memory, labelled with the GPU's
/// index and model; a GPU the driver lost reads 1 in `raylet_node_gpu_fault`.
fn gpu_families(scrape: &Scrape, status: &ClusterStatus) {
    let labels = ["node", "gpu", "name"];
    let utilization = scrape.gauge(
        "raylet_node_gpu_utilization_percent",
        "Share of the last sample period each GPU was busy.",
        &labels,
    );
    let used = scrape.gauge("raylet_node_gpu_memory_used_bytes", "Memory used on each GPU.", &labels);
    let total = scrape.gauge("raylet_node_gpu_memory_total_bytes", "Memory of each GPU.", &labels);
    let fault = scrape.gauge(
        "raylet_node_gpu_fault",
        "1 for a GPU its driver could not read (lost), else 0.",
        &labels,
    );
    for node in status.alive() {
        let id = node.node_id.to_string();
        for gpu in &node.stats.gpus {
            let index = gpu.index.to_string();
            let values = [id.as_str(), index.as_str(), gpu.name.as_str()];
            utilization.with_label_values(&values).set(gpu.utilization_percent);
            used.with_label_values(&values).set(gpu.memory_used_bytes as f64);
            total.with_label_values(&values).set(gpu.memory_total_bytes as f64);
            fault
                .with_label_values(&values)
                .set(f64::from(u8::from(gpu.fault.is_some())));
        }
    }
}

fn store_families(scrape: &Scrape, stores: &[raylet::NodeMemory]) {
    let families = [
        (
            "raylet_object_store_used_bytes",
            "Bytes of objects in each node's shared memory.",
        ),
        (
            "raylet_object_store_capacity_bytes",
            "Each node's object store capacity.",
        ),
        (
            "raylet_object_store_spilled_bytes",
            "Bytes of objects spilled to each node's disk.",
        ),
        ("raylet_object_store_objects", "Objects in each node's store."),
        (
            "raylet_object_store_served_bytes",
            "Bytes each store sent to other nodes.",
        ),
        (
            "raylet_object_store_pulled_bytes",
            "Bytes each store pulled from other nodes.",
        ),
    ]
    .map(|(name, help)| scrape.gauge(name, help, &["node"]));
    for store in stores {
        let id = store.node_id.to_string();
        let values = [
            store.used_bytes,
            store.capacity_bytes,
            store.spilled_bytes,
            store.objects.len() as u64,
            store.served_bytes,
            store.pulled_bytes,
        ];
        for (family, value) in families.iter().zip(values) {
            family.with_label_values(&[&id]).set(value as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use raylet::{FakeGpus, GpuDetector};
    use raylet_cluster_status::{NodeState, NodeStats, NodeStatus};
    use raylet_proto::NodeId;

    use super::*;

    #[test]
    fn each_gpu_is_a_series_labelled_with_its_node_index_and_model() {
        let gpus = FakeGpus::new(2);
        gpus.set_busy(0, 37.0, 5 << 30);
        gpus.lose(1);
        let node_id = NodeId::random();
        let status = ClusterStatus {
            now_unix_ms: 0,
            nodes: vec![NodeStatus {
                node_id,
                incarnation: 1,
                address: "127.0.0.1:1".into(),
                hostname: "gpu-host".into(),
                is_head_node: true,
                state: NodeState::Alive,
                total: Default::default(),
                available: Default::default(),
                labels: Default::default(),
                metrics_address: None,
                stats: NodeStats {
                    gpus: gpus.read(),
                    ..NodeStats::default()
                },
                demands: Vec::new(),
                registered_unix_ms: 0,
                last_heartbeat_unix_ms: 0,
                died_unix_ms: None,
                death_reason: None,
                draining: None,
            }],
            placement_groups: Vec::new(),
            waiting_drivers: Vec::new(),
        };
        let scrape = Scrape::default();
        gpu_families(&scrape, &status);
        let text = scrape.encode();
        let series = |name: &str, gpu: u32, value: &str| {
            format!("{name}{{gpu=\"{gpu}\",name=\"Fake GPU\",node=\"{node_id}\"}} {value}\n")
        };
        for expected in [
            series("raylet_node_gpu_utilization_percent", 0, "37"),
            series("raylet_node_gpu_memory_used_bytes", 0, "5368709120"),
            series("raylet_node_gpu_memory_total_bytes", 1, "85899345920"),
            series("raylet_node_gpu_fault", 0, "0"),
            series("raylet_node_gpu_fault", 1, "1"),
        ] {
            assert!(text.contains(&expected), "{expected} missing from\n{text}");
        }
    }

    #[test]
    fn families_are_prometheus_text_with_escaped_labels_and_every_known_state() {
        let scrape = Scrape::default();
        let actors = scrape.gauge("raylet_actors", "Actors by state.", &["state"]);
        by_state(
            &actors,
            &["ALIVE", "DEAD"],
            ["ALIVE", "ALIVE", "ODD"].map(String::from).into_iter(),
        );
        let cpu = scrape.gauge("raylet_node_cpu_percent", "CPU.", &["node"]);
        cpu.with_label_values(&["a\"b\\c"]).set(12.5);
        assert_eq!(
            scrape.encode(),
            "# HELP raylet_actors Actors by state.\n# TYPE raylet_actors gauge\n\
             raylet_actors{state=\"ALIVE\"} 2\nraylet_actors{state=\"DEAD\"} 0\nraylet_actors{state=\"ODD\"} 1\n\
             # HELP raylet_node_cpu_percent CPU.\n# TYPE raylet_node_cpu_percent gauge\n\
             raylet_node_cpu_percent{node=\"a\\\"b\\\\c\"} 12.5\n"
        );
    }
}
