//! `/metrics`: the cluster as Prometheus gauges, read from the head at
//! each scrape: nodes by state, each node's resources, utilization and
//! lease requests waiting or refused, actors, placement groups and jobs by
//! state, and each object store's bytes used, spilled and moved; then the
//! head process's own registry: tasks by state, scheduling latency and the
//! latency of each gRPC method it serves.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use raylet_proto::auth::AuthToken;
use raylet_scheduler::status::ClusterStatus;

use crate::job::JobClient;

/// One metric family in Prometheus text: its help, type and samples.
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    samples: Vec<(String, f64)>,
}

impl<'a> Family<'a> {
    fn gauge(name: &'a str, help: &'a str) -> Self {
        Family {
            name,
            help,
            samples: Vec::new(),
        }
    }

    /// A sample with `labels` (name, value pairs; values escaped here).
    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
            .collect();
        self.samples.push((labels.join(","), value));
    }

    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for (labels, value) in &self.samples {
            match labels.is_empty() {
                true => writeln!(out, "{} {value}", self.name),
                false => writeln!(out, "{}{{{labels}}} {value}", self.name),
            }
            .expect("writing to a String");
        }
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Counts of `states` as samples labelled `state`, every known state
/// included (0 when none), so a series does not vanish.
fn by_state(family: &mut Family, known: &[&str], states: impl Iterator<Item = String>) {
    let mut counts: BTreeMap<String, f64> = known.iter().map(|state| (state.to_string(), 0.0)).collect();
    for state in states {
        *counts.entry(state).or_default() += 1.0;
    }
    for (state, count) in counts {
        family.sample(&[("state", &state)], count);
    }
}

/// The whole exposition for the cluster whose head is at `head`.
pub(super) async fn render(head: &str, token: &AuthToken, patience: Duration) -> crate::Result<String> {
    let status = ClusterStatus::fetch(head, token, patience)
        .await
        .map_err(crate::Error::Cluster)?;
    let actors = crate::list_actors(head, token).await?;
    let groups = crate::list_placement_groups(head, token).await?;
    let jobs = JobClient::connect(head, token).await?.list().await?;
    let stores = crate::collect_memory(head, token).await?;

    let mut families = node_families(&status);
    let mut actor_states = Family::gauge("raylet_actors", "Actors by state.");
    let states = actors.iter().map(|actor| actor.state.to_string());
    by_state(&mut actor_states, &["PENDING", "ALIVE", "RESTARTING", "DEAD"], states);
    let mut group_states = Family::gauge("raylet_placement_groups", "Placement groups by state.");
    let known = ["PENDING", "CREATED", "RESCHEDULING", "INFEASIBLE", "REMOVED"];
    by_state(
        &mut group_states,
        &known,
        groups.iter().map(|group| group.state.to_string()),
    );
    let mut job_states = Family::gauge("raylet_jobs", "Jobs by status.");
    let known = ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"];
    by_state(&mut job_states, &known, jobs.iter().map(|job| job.status.to_string()));
    families.extend([actor_states, group_states, job_states]);
    families.extend(store_families(&stores));

    let mut out = String::new();
    for family in &families {
        family.write(&mut out);
    }
    out.push_str(&raylet_proto::metrics::encode_text());
    Ok(out)
}

fn node_families(status: &ClusterStatus) -> Vec<Family<'static>> {
    let mut nodes = Family::gauge("raylet_nodes", "Node incarnations by state.");
    let states = status.nodes.iter().map(|node| node.state.to_string());
    by_state(&mut nodes, &["ALIVE", "DEAD"], states);
    let mut total = Family::gauge("raylet_node_resource_total", "Resources of each alive node.");
    let mut available = Family::gauge(
        "raylet_node_resource_available",
        "Resources of each alive node not held by leases, actors or bundles.",
    );
    let mut cpu = Family::gauge(
        "raylet_node_cpu_percent",
        "CPU utilization of each alive node's machine.",
    );
    let mut memory = Family::gauge(
        "raylet_node_memory_used_bytes",
        "Memory used on each alive node's machine.",
    );
    let mut pending = Family::gauge(
        "raylet_lease_requests_pending",
        "Worker lease requests waiting on each alive node for room.",
    );
    let mut infeasible = Family::gauge(
        "raylet_lease_requests_infeasible",
        "Lease requests each alive node refused in the last 5 minutes because no node could ever fit them.",
    );
    for node in status.alive() {
        let id = node.node_id.to_string();
        for (resource, amount) in node.total.iter() {
            total.sample(&[("node", &id), ("resource", resource)], amount.as_f64());
        }
        for (resource, amount) in node.available.iter() {
            available.sample(&[("node", &id), ("resource", resource)], amount.as_f64());
        }
        cpu.sample(&[("node", &id)], node.stats.cpu_percent);
        memory.sample(&[("node", &id)], node.stats.memory_used_bytes as f64);
        let count = |refused: bool| -> f64 {
            let demands = node.demands.iter().filter(|demand| demand.infeasible == refused);
            demands.map(|demand| demand.count as f64).sum()
        };
        pending.sample(&[("node", &id)], count(false));
        infeasible.sample(&[("node", &id)], count(true));
    }
    vec![nodes, total, available, cpu, memory, pending, infeasible]
}

fn store_families(stores: &[crate::NodeMemory]) -> Vec<Family<'static>> {
    let mut families = [
        Family::gauge(
            "raylet_object_store_used_bytes",
            "Bytes of objects in each node's shared memory.",
        ),
        Family::gauge(
            "raylet_object_store_capacity_bytes",
            "Each node's object store capacity.",
        ),
        Family::gauge(
            "raylet_object_store_spilled_bytes",
            "Bytes of objects spilled to each node's disk.",
        ),
        Family::gauge("raylet_object_store_objects", "Objects in each node's store."),
        Family::gauge(
            "raylet_object_store_served_bytes",
            "Bytes each store sent to other nodes.",
        ),
        Family::gauge(
            "raylet_object_store_pulled_bytes",
            "Bytes each store pulled from other nodes.",
        ),
    ];
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
        for (family, value) in families.iter_mut().zip(values) {
            family.sample(&[("node", &id)], value as f64);
        }
    }
    families.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_prometheus_text_with_escaped_labels_and_every_known_state() {
        let mut family = Family::gauge("raylet_actors", "Actors by state.");
        by_state(
            &mut family,
            &["ALIVE", "DEAD"],
            ["ALIVE", "ALIVE", "ODD"].map(String::from).into_iter(),
        );
        let mut nodes = Family::gauge("raylet_node_cpu_percent", "CPU.");
        nodes.sample(&[("node", "a\"b\\c")], 12.5);
        let mut out = String::new();
        family.write(&mut out);
        nodes.write(&mut out);
        assert_eq!(
            out,
            "# HELP raylet_actors Actors by state.\n# TYPE raylet_actors gauge\n\
             raylet_actors{state=\"ALIVE\"} 2\nraylet_actors{state=\"DEAD\"} 0\nraylet_actors{state=\"ODD\"} 1\n\
             # HELP raylet_node_cpu_percent CPU.\n# TYPE raylet_node_cpu_percent gauge\n\
             raylet_node_cpu_percent{node=\"a\\\"b\\\\c\"} 12.5\n"
        );
    }
}
