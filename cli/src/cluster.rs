//! `raylet up` and `raylet down`: a cluster from a cluster config. Up
//! starts the head with the config's autoscaler (`raylet start --head
//! --autoscaler`); down stops the head, whose autoscaler terminates the
//! nodes it launched, then whatever else is left.

use std::process::{Command, ExitCode};

use anyhow::Context;
use raylet::session::{ProcessRole, TempRoot};
use raylet_autoscaler::ClusterConfig;

use crate::args::{DownArgs, StopArgs, UpArgs};
use crate::stop;

/// Checks the config, then starts the head with its autoscaler.
pub fn up(args: UpArgs) -> anyhow::Result<ExitCode> {
    let config = ClusterConfig::load(&args.config)?;
    let path = std::path::absolute(&args.config).context("resolving the config's path")?;
    println!(
        "Starting cluster '{}' (provider: {}, {} node types, at most {} nodes)",
        config.cluster_name,
        config.provider_kind(),
        config.autoscaler.node_types.len(),
        config.autoscaler.max_nodes
    );
    let status = Command::new(std::env::current_exe()?)
        .args(["start", "--head", "--temp-dir"])
        .arg(&args.temp_dir)
        .arg("--autoscaler")
        .arg(&path)
        .args(&config.head.args)
        .status()
        .context("running raylet start --head")?;
    Ok(match status.success() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}

/// Stops the head (its autoscaler terminates its nodes), the other daemons,
/// then terminates what the provider still lists.
pub fn down(args: DownArgs) -> anyhow::Result<()> {
    let config = ClusterConfig::load(&args.config)?;
    let root = TempRoot::new(&args.temp_dir);
    let stop_args = StopArgs {
        temp_dir: args.temp_dir.clone(),
        force: false,
        grace_period: args.grace_period,
    };
    let heads = stop::find_daemons(&root)
        .values()
        .filter(|role| **role == ProcessRole::Head)
        .count();
    let survivors = stop::end_heads(&root, &stop_args);
    if !survivors.is_empty() {
        anyhow::bail!("the head did not stop: pids {survivors:?} still run");
    }
    match heads {
        0 => println!("No head of cluster '{}' was running.", config.cluster_name),
        _ => println!("Stopped the head of cluster '{}'.", config.cluster_name),
    }
    if !stop::find_daemons(&root).is_empty() {
        stop::stop(stop_args)?;
    }
    let left = crate::runtime()?.block_on(terminate_leftovers(&config, &root))?;
    println!(
        "Cluster '{}' is down{}.",
        config.cluster_name,
        match left {
            0 => String::new(),
            n => format!("; terminated {n} instances the provider still listed"),
        }
    );
    Ok(())
}

/// Terminates every instance the provider still lists; returns how many.
async fn terminate_leftovers(config: &ClusterConfig, root: &TempRoot) -> anyhow::Result<usize> {
    let provider = config.provider(root.path()).await?;
    let instances = provider.instances().await?;
    for instance in &instances {
        provider.terminate(&instance.id).await?;
    }
    provider.tear_down().await?;
    Ok(instances.len())
}
