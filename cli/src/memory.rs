//! `raylet memory`: each node's object store and the objects in it, with
//! their owners and the processes that hold references, as text or JSON.

use std::fmt::Write;

use anyhow::Context;
use raylet::{NodeMemory, StoredObject};
use raylet_object_store::bytes;

use crate::args::{OutputFormat, StatusArgs};

pub fn memory(args: StatusArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let nodes = crate::runtime()?
        .block_on(raylet::collect_memory(&address, &token))
        .with_context(|| format!("collecting the object stores of the cluster at {address}"))?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&nodes)?,
        OutputFormat::Text => render_text(&address, &nodes),
    };
    println!("{output}");
    Ok(())
}

fn render_text(address: &str, nodes: &[NodeMemory]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== Object store memory (head {address}) ========");
    for node in nodes {
        let _ = writeln!(
            out,
            "node {} at {}: {} of {} in memory, {} spilled (limit {}), {} objects",
            node.node_id.short(),
            node.address,
            bytes(node.used_bytes),
            bytes(node.capacity_bytes),
            bytes(node.spilled_bytes),
            bytes(node.spill_limit_bytes),
            node.objects.len()
        );
        if node.objects.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {OBJECT_HEADER}");
        for object in &node.objects {
            let _ = writeln!(out, "  {}", object_line(object));
        }
    }
    out
}

/// The column names of [`object_line`].
pub(crate) const OBJECT_HEADER: &str =
    "OBJECT                                  SIZE  STATE      READERS  OWNER                  HOLDERS";

/// An object's id, size, state, readers, owner and holders, in columns.
pub(crate) fn object_line(object: &StoredObject) -> String {
    let state = match (object.sealed, object.spilled) {
        (false, _) => "writing",
        (true, true) => "spilled",
        (true, false) => "in memory",
    };
    let holders = match &object.holders {
        None => "(the owner does not answer)".to_string(),
        Some(holders) => {
            let mut who = vec![format!("owner ({} handles)", holders.owner_handles)];
            who.extend(holders.borrowers.iter().cloned());
            who.join(", ")
        }
    };
    format!(
        "{:<32}  {:>10}  {:<9}  {:>7}  {:<21}  {holders}",
        object.id.to_string(),
        bytes(object.size),
        state,
        object.readers,
        object.owner
    )
}
