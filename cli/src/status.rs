//! `raylet status`: the node table and resource usage, as text or JSON.

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use raylet_autoscaler::AutoscalerReport;
use raylet_cluster_status::{ClusterStatus, GpuStats, NodeStatus, ResourceDemand};
use raylet_proto::ResourceSet;
use raylet_proto::resources::is_bytes;
use serde::Serialize;

use crate::args::{OutputFormat, StatusArgs};

/// How long `raylet status` waits for the head.
const PATIENCE: Duration = Duration::from_secs(2);

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let (status, autoscaler) = crate::runtime()?.block_on(async {
        let status = fetch(&address, &token).await?;
        let autoscaler = AutoscalerReport::fetch(&address, &token)
            .await
            .with_context(|| format!("reading the autoscaler's report from the head at {address}"))?;
        anyhow::Ok((status, autoscaler))
    })?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&StatusReport::new(&address, &status, autoscaler.as_ref()))?,
        OutputFormat::Text => {
            let mut text = render_text(&address, &status);
            if let Some(report) = &autoscaler {
                text.push_str(&autoscaler_lines(report, status.now_unix_ms));
            }
            text
        }
    };
    println!("{output}");
    Ok(())
}

pub(crate) async fn fetch(address: &str, token: &raylet_common::auth::AuthToken) -> anyhow::Result<ClusterStatus> {
    ClusterStatus::fetch(address, token, PATIENCE)
        .await
        .with_context(|| format!("asking the raylet head at {address}"))
}

/// The JSON form: a cluster summary and every node incarnation.
#[derive(Serialize)]
struct StatusReport<'a> {
    head_address: &'a str,
    alive_nodes: usize,
    dead_nodes: usize,
    total: ResourceSet,
    available: ResourceSet,
    /// Every node's waiting and infeasible work added up, and the
    /// placement groups that wait.
    demands: Vec<ResourceDemand>,
    /// What the cluster's autoscaler last reported, if it runs one.
    autoscaler: Option<&'a AutoscalerReport>,
    #[serde(flatten)]
    status: &'a ClusterStatus,
}

impl<'a> StatusReport<'a> {
    fn new(head_address: &'a str, status: &'a ClusterStatus, autoscaler: Option<&'a AutoscalerReport>) -> Self {
        StatusReport {
            head_address,
            alive_nodes: status.alive().count(),
            dead_nodes: status.dead().count(),
            total: status.total(),
            available: status.available(),
            demands: status.demands(),
            autoscaler,
            status,
        }
    }
}

fn render_text(address: &str, status: &ClusterStatus) -> String {
    let mut out = String::new();
    let now = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(status.now_unix_ms));
    let _ = writeln!(out, "======== Cluster status: {now} (head {address}) ========");
    let _ = writeln!(out, "Node status");
    let _ = writeln!(out, "{}", "-".repeat(64));
    let _ = writeln!(out, "Alive: {} node(s)", status.alive().count());
    for node in status.alive() {
        let _ = writeln!(out, " {}", node_line(node));
    }
    let _ = writeln!(out, "Dead: {} node(s)", status.dead().count());
    for node in status.dead() {
        let reason = node.death_reason.as_deref().unwrap_or("unknown");
        let _ = writeln!(out, " {}  ({reason})", node_line(node));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Resources");
    let _ = writeln!(out, "{}", "-".repeat(64));
    let _ = writeln!(out, "Total usage:");
    out.push_str(&usage_lines(&status.total(), &status.available(), " "));
    for node in status.alive() {
        let stats = &node.stats;
        let _ = writeln!(
            out,
            "Node {}: cpu {:.1}%, memory {} / {}",
            node.node_id.short(),
            stats.cpu_percent,
            bytes(stats.memory_used_bytes as f64),
            bytes(stats.memory_total_bytes as f64)
        );
        for gpu in &stats.gpus {
            let _ = writeln!(out, "  {}", gpu_line(gpu));
        }
        out.push_str(&usage_lines(&node.total, &node.available, "  "));
    }
    out.push_str(&demand_lines(&status.demands()));
    out.trim_end().to_string()
}

/// One GPU's model and readings, or why the driver could not read it.
fn gpu_line(gpu: &GpuStats) -> String {
    match &gpu.fault {
        Some(fault) => format!("GPU {} {}: unusable: {fault}", gpu.index, gpu.name),
        None => format!(
            "GPU {} {}: {:.0}% busy, memory {} / {}",
            gpu.index,
            gpu.name,
            gpu.utilization_percent,
            bytes(gpu.memory_used_bytes as f64),
            bytes(gpu.memory_total_bytes as f64)
        ),
    }
}

/// "Demands", then pending and infeasible work, one shape per line.
fn demand_lines(demands: &[ResourceDemand]) -> String {
    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(out, "Demands");
    let _ = writeln!(out, "{}", "-".repeat(64));
    let pending: Vec<&ResourceDemand> = demands.iter().filter(|d| !d.infeasible).collect();
    let infeasible: Vec<&ResourceDemand> = demands.iter().filter(|d| d.infeasible).collect();
    for (title, group) in [("Pending", pending), ("Infeasible", infeasible)] {
        match group.is_empty() {
            true => {
                let _ = writeln!(out, "{title}: (none)");
            }
            false => {
                let _ = writeln!(out, "{title}:");
            }
        }
        for demand in group {
            let shape: Vec<String> = demand
                .shape
                .iter()
                .map(|(name, amount)| format!("{name}: {amount}"))
                .collect();
            let constraint = match demand.constraint.is_empty() {
                true => String::new(),
                false => format!(" [{}]", demand.constraint),
            };
            let _ = write!(out, " {{{}}}{constraint} x {}", shape.join(", "), demand.count);
            let _ = match demand.reason.is_empty() {
                true => writeln!(out),
                false => writeln!(out, ": {}", demand.reason),
            };
        }
    }
    out
}

/// "Autoscaler": its nodes and what becomes of them, what it launched and
/// what waits, backoffs, and its latest decisions.
fn autoscaler_lines(report: &AutoscalerReport, now_unix_ms: u64) -> String {
    let mut out = String::new();
    let age = now_unix_ms.saturating_sub(report.updated_unix_ms) as f64 / 1000.0;
    let _ = writeln!(out);
    let _ = writeln!(out);
    let _ = writeln!(out, "Autoscaler ({} provider, reported {age:.0}s ago)", report.provider);
    let _ = writeln!(out, "{}", "-".repeat(64));
    let _ = writeln!(out, "Managed nodes: {}", report.nodes.len());
    for node in &report.nodes {
        let joined = node
            .node_id
            .as_deref()
            .map_or(String::new(), |id| format!(" node {id}"));
        let removal = node
            .removed_in_s
            .map_or(String::new(), |s| format!(", removed in {s:.0}s"));
        let _ = writeln!(
            out,
            " {} ({}): {} for {:.0}s{removal}{joined}",
            node.instance, node.node_type, node.state, node.for_s
        );
    }
    for (title, lines) in [
        ("Launched last round", &report.launched),
        ("Waiting", &report.waiting),
        ("Backing off", &report.backing_off),
    ] {
        if !lines.is_empty() {
            let _ = writeln!(out, "{title}:");
            for line in lines.iter() {
                let _ = writeln!(out, " {line}");
            }
        }
    }
    let recent = report.events.iter().rev().take(RECENT_DECISIONS).collect::<Vec<_>>();
    let _ = writeln!(out, "Recent decisions:");
    for event in recent.into_iter().rev() {
        let ago = now_unix_ms.saturating_sub(event.unix_ms) as f64 / 1000.0;
        let _ = writeln!(out, " {ago:>5.0}s ago  {}", event.message);
    }
    out.trim_end().to_string()
}

/// How many of the autoscaler's decisions the text form lists.
const RECENT_DECISIONS: usize = 10;

pub(crate) fn node_line(node: &NodeStatus) -> String {
    let role = if node.is_head_node { "  (head)" } else { "" };
    let labels: Vec<String> = node
        .labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    let labels = match labels.is_empty() {
        true => String::new(),
        false => format!("  labels {}", labels.join(",")),
    };
    let draining = node
        .draining
        .as_deref()
        .map_or(String::new(), |reason| format!("  DRAINING ({reason})"));
    format!(
        "node {}  {}  incarnation {}  host {}{role}{labels}{draining}",
        node.node_id, node.address, node.incarnation, node.hostname
    )
}

fn usage_lines(total: &ResourceSet, available: &ResourceSet, indent: &str) -> String {
    let mut out = String::new();
    for (name, amount) in total.iter() {
        let used = amount - available.get(name);
        let line = if is_bytes(name) {
            format!("{}/{}", bytes(used.as_f64()), bytes(amount.as_f64()))
        } else {
            format!("{used}/{amount}")
        };
        let _ = writeln!(out, "{indent}{line} {name}");
    }
    out
}

fn bytes(count: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if count >= GIB {
        format!("{:.2}GiB", count / GIB)
    } else {
        format!("{:.2}MiB", count / MIB)
    }
}

#[cfg(test)]
mod tests {
    use raylet_node::{FakeGpus, GpuDetector};

    use super::*;

    #[test]
    fn a_gpu_line_gives_its_model_and_readings_or_why_it_is_unusable() {
        let gpus = FakeGpus::new(2);
        gpus.set_busy(0, 12.0, 3 << 30);
        gpus.lose(1);
        let read = gpus.read();
        assert_eq!(
            gpu_line(&read[0]),
            "GPU 0 Fake GPU: 12% busy, memory 3.00GiB / 80.00GiB"
        );
        assert_eq!(
            gpu_line(&read[1]),
            "GPU 1 Fake GPU: unusable: the GPU fell off the bus (NVML: GPU is lost)"
        );
    }
}
