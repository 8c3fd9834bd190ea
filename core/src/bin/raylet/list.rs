//! `raylet list actors` and `raylet list placement-groups`: the cluster's
//! actors and placement groups, as text or JSON, as `ray list` shows them.

use std::fmt::Write;

use anyhow::Context;
use raylet::{ActorInfo, PlacementGroupInfo};

use crate::args::{OutputFormat, StatusArgs};

pub fn actors(args: StatusArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let actors = crate::runtime()?
        .block_on(raylet::list_actors(&address, &token))
        .with_context(|| format!("listing the actors of the cluster at {address}"))?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&actors)?,
        OutputFormat::Text => render_text(&actors),
    };
    println!("{output}");
    Ok(())
}

pub fn placement_groups(args: StatusArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let groups = crate::runtime()?
        .block_on(raylet::list_placement_groups(&address, &token))
        .with_context(|| format!("listing the placement groups of the cluster at {address}"))?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&groups)?,
        OutputFormat::Text => render_groups(&groups),
    };
    println!("{output}");
    Ok(())
}

fn render_groups(groups: &[PlacementGroupInfo]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== {} placement groups ========", groups.len());
    let _ = writeln!(
        out,
        "{:<32}  {:<13}  {:<12}  {:>7}  {:<26}  REASON",
        "PLACEMENT GROUP ID", "STRATEGY", "STATE", "BUNDLES", "NODES"
    );
    for group in groups {
        let nodes: Vec<String> = group.nodes.iter().map(|node| node.short()).collect();
        let nodes = match nodes.is_empty() {
            true => "-".to_string(),
            false => nodes.join(","),
        };
        let _ = writeln!(
            out,
            "{:<32}  {:<13}  {:<12}  {:>7}  {:<26}  {}",
            group.id.to_string(),
            group.strategy.to_string(),
            group.state.to_string(),
            group.bundles.len(),
            nodes,
            group.reason
        );
    }
    out.trim_end().to_string()
}

fn render_text(actors: &[ActorInfo]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== {} actors ========", actors.len());
    let _ = writeln!(
        out,
        "{:<32}  {:<24}  {:<16}  {:<10}  {:<8}  {:>7}  {:>8}  DEATH CAUSE",
        "ACTOR ID", "CLASS", "NAME", "STATE", "NODE", "PID", "RESTARTS"
    );
    for actor in actors {
        let class = actor.class_name.rsplit("::").next().unwrap_or(&actor.class_name);
        let node = actor.node_id.map(|id| id.short()).unwrap_or_else(|| "-".into());
        let name = match actor.name.is_empty() {
            true => "-",
            false => actor.name.as_str(),
        };
        let _ = writeln!(
            out,
            "{:<32}  {:<24}  {:<16}  {:<10}  {:<8}  {:>7}  {:>8}  {}",
            actor.id, class, name, actor.state, node, actor.pid, actor.restarts, actor.death_cause
        );
    }
    out.trim_end().to_string()
}
