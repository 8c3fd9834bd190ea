//! `raylet list nodes|jobs|actors|tasks|placement-groups|objects`: the cluster's
//! tables, as text or JSON, filtered by `--filter KEY=VALUE`, as `ray list`
//! shows them.

use std::fmt::Write;

use anyhow::Context;
use raylet::{ActorInfo, PlacementGroupInfo, StoredObject};
use raylet_cluster_status::NodeStatus;
use serde::Serialize;

use crate::args::{ListArgs, ListCommand, OutputFormat};
use crate::row_filter;

pub fn list(command: ListCommand) -> anyhow::Result<()> {
    match command {
        ListCommand::Nodes(args) => nodes(args),
        ListCommand::Jobs(args) => jobs(args),
        ListCommand::Actors(args) => actors(args),
        ListCommand::PlacementGroups(args) => placement_groups(args),
        ListCommand::Objects(args) => objects(args),
        ListCommand::Tasks(args) => crate::tasks::list(args),
    }
}

/// Prints the rows the filters keep, as JSON or as `render` draws them.
pub fn print_rows<T: Serialize>(
    rows: Vec<T>,
    args: &ListArgs,
    what: &str,
    render: fn(&[T]) -> String,
) -> anyhow::Result<()> {
    let rows = row_filter::keep(rows, &args.filters, what)?;
    let output = match args.status.format {
        OutputFormat::Json => serde_json::to_string_pretty(&rows)?,
        OutputFormat::Text => render(&rows),
    };
    println!("{output}");
    Ok(())
}

fn nodes(args: ListArgs) -> anyhow::Result<()> {
    let (address, token) = args.status.cluster.head()?;
    let status = crate::runtime()?.block_on(crate::status::fetch(&address, &token))?;
    print_rows(status.nodes, &args, "nodes", render_nodes)
}

fn jobs(args: ListArgs) -> anyhow::Result<()> {
    let jobs = crate::runtime()?.block_on(crate::job::list_jobs(&args.status.cluster))?;
    print_rows(jobs, &args, "jobs", crate::job::render_jobs)
}

fn actors(args: ListArgs) -> anyhow::Result<()> {
    let (address, token) = args.status.cluster.head()?;
    let actors = crate::runtime()?
        .block_on(raylet::list_actors(&address, &token))
        .with_context(|| format!("listing the actors of the cluster at {address}"))?;
    print_rows(actors, &args, "actors", render_text)
}

fn placement_groups(args: ListArgs) -> anyhow::Result<()> {
    let (address, token) = args.status.cluster.head()?;
    let groups = crate::runtime()?
        .block_on(raylet::list_placement_groups(&address, &token))
        .with_context(|| format!("listing the placement groups of the cluster at {address}"))?;
    print_rows(groups, &args, "placement groups", render_groups)
}

/// An object in a node's store, with the node's address.
#[derive(Serialize)]
struct ObjectRow {
    node: String,
    #[serde(flatten)]
    object: StoredObject,
}

fn objects(args: ListArgs) -> anyhow::Result<()> {
    let (address, token) = args.status.cluster.head()?;
    let nodes = crate::runtime()?
        .block_on(raylet::collect_memory(&address, &token))
        .with_context(|| format!("collecting the object stores of the cluster at {address}"))?;
    let rows: Vec<ObjectRow> = nodes
        .into_iter()
        .flat_map(|node| {
            let address = node.address;
            node.objects.into_iter().map(move |object| ObjectRow {
                node: address.clone(),
                object,
            })
        })
        .collect();
    print_rows(rows, &args, "objects", render_objects)
}

fn render_nodes(nodes: &[NodeStatus]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== {} nodes ========", nodes.len());
    for node in nodes {
        let _ = writeln!(out, "{:<5}  {}", node.state.to_string(), crate::status::node_line(node));
    }
    out.trim_end().to_string()
}

fn render_objects(rows: &[ObjectRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== {} objects ========", rows.len());
    let _ = writeln!(out, "{:<21}  {}", "NODE", crate::memory::OBJECT_HEADER);
    for row in rows {
        let _ = writeln!(out, "{:<21}  {}", row.node, crate::memory::object_line(&row.object));
    }
    out.trim_end().to_string()
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
