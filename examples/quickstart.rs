//! Quickstart: a head and two nodes in this process, on loopback ports, with
//! real gRPC and token auth. It shows membership, summed resources, and how a
//! node that dies is detected and comes back as a new incarnation.

use std::time::{Duration, Instant};

use raylet::proto::resources::{CPU, GPU};
use raylet::proto::{Amount, ResourceSet};
use raylet::scheduler::sandbox::ClusterSandbox;
use raylet::scheduler::status::ClusterStatus;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let resources = ResourceSet::new()
        .with(CPU, Amount::whole(2))
        .with(GPU, Amount::parse(GPU, 0.5)?);
    let mut cluster = ClusterSandbox::builder()
        .nodes(2)
        .node_resources(resources)
        .heartbeat_interval(Duration::from_millis(100))
        .heartbeat_timeout(Duration::from_millis(500))
        .start()
        .await?;
    println!("cluster of 2 nodes ready in {:.1} ms", ms(started.elapsed()));
    print_status(&cluster.cluster_status().await?);

    let killed = Instant::now();
    cluster.kill_node(1);
    cluster
        .wait_for(Duration::from_secs(5), |s| s.dead().count() == 1)
        .await?;
    println!("\nnode 1 killed; marked dead after {:.0} ms", ms(killed.elapsed()));

    cluster.restart_node(1).await?;
    let status = cluster.cluster_status().await?;
    println!("node 1 restarted:");
    print_status(&status);
    cluster.shutdown().await?;
    Ok(())
}

fn print_status(status: &ClusterStatus) {
    for node in &status.nodes {
        let reason = node.death_reason.as_deref().unwrap_or("");
        println!(
            "  {:?}  node {}  incarnation {}  {}",
            node.state,
            node.node_id.short(),
            node.incarnation,
            reason
        );
    }
    let total = status.total();
    println!("  cluster total: {} CPU, {} GPU", total.get(CPU), total.get(GPU));
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
