//! `raylet list tasks`, `raylet summary tasks`, `raylet timeline`,
//! `raylet logs` and `raylet stack`: the head's record of tasks and actor
//! calls, as rows, counts and a Chrome trace, what they printed, and where
//! the workers' threads are now.

use std::fmt::Write;

use anyhow::Context;
use raylet_state::{FunctionSummary, TaskInfo};

use crate::args::{ListTasksArgs, LogsArgs, OutputFormat, StackArgs, StatusArgs, SummaryCommand, TimelineArgs};
use crate::row_filter;

pub fn list(args: ListTasksArgs) -> anyhow::Result<()> {
    let listing = fetch(&args.list.status, args.job)?;
    let mut rows = row_filter::keep(listing.tasks, &args.list.filters, "tasks")?;
    let matched = rows.len();
    rows.truncate(args.limit);
    let output = match args.list.status.format {
        OutputFormat::Json => serde_json::to_string_pretty(&rows)?,
        OutputFormat::Text => render_tasks(&rows, matched, listing.dropped),
    };
    println!("{output}");
    Ok(())
}

pub fn summary(command: SummaryCommand) -> anyhow::Result<()> {
    let SummaryCommand::Tasks(args) = command;
    let listing = fetch(&args.status, args.job)?;
    let summary = raylet_state::summarize_tasks(&listing.tasks);
    let output = match args.status.format {
        OutputFormat::Json => serde_json::to_string_pretty(&summary)?,
        OutputFormat::Text => render_summary(&summary, listing.tasks.len()),
    };
    println!("{output}");
    Ok(())
}

pub fn timeline(args: TimelineArgs) -> anyhow::Result<()> {
    let (address, token) = args.status.cluster.head()?;
    let trace = crate::runtime()?
        .block_on(raylet_state::chrome_trace(&address, &token, args.job))
        .with_context(|| format!("reading the task records of the cluster at {address}"))?;
    let file = std::fs::File::create(&args.output).with_context(|| format!("creating {}", args.output.display()))?;
    serde_json::to_writer(std::io::BufWriter::new(file), &trace)?;
    println!(
        "Wrote {} task runs ({} events) to {}; open it in chrome://tracing or https://ui.perfetto.dev",
        trace.task_runs,
        trace.trace_events.len(),
        args.output.display()
    );
    if trace.runs_without_spans > 0 {
        println!(
            "{} runs show no phases: their jobs ran without the timeline on (set RAYLET_TIMELINE=1 for the driver)",
            trace.runs_without_spans
        );
    }
    Ok(())
}

pub fn logs(args: LogsArgs) -> anyhow::Result<()> {
    let source = match (args.worker, args.pid, args.actor, args.task) {
        (Some(id), ..) => raylet_state::LogSource::Worker { id, node: args.node },
        (_, Some(pid), ..) => raylet_state::LogSource::Pid { pid, node: args.node },
        (.., Some(actor), _) => raylet_state::LogSource::Actor(actor),
        (.., Some(task)) => raylet_state::LogSource::Task(task),
        (None, None, None, None) => unreachable!("clap requires one source"),
    };
    let (address, token) = args.cluster.head()?;
    let runtime = crate::runtime()?;
    let log = runtime
        .block_on(raylet_state::read_worker_log(&address, &token, &source, args.err))
        .with_context(|| format!("reading logs from the cluster at {address}"))?;
    let lines: Vec<&str> = log.text.lines().collect();
    let shown = &lines[lines.len().saturating_sub(args.tail.unwrap_or(usize::MAX))..];
    eprintln!("--- {} on node {} ---", log.file, log.node_id.short());
    if log.truncated {
        eprintln!("(the log is longer: its end is shown)");
    }
    for line in shown {
        println!("{line}");
    }
    if args.follow {
        runtime.block_on(follow(log.follower))?;
    }
    Ok(())
}

/// How often `raylet logs --follow` asks for more.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// Prints what the log gets, until interrupted or the node stops answering.
async fn follow(mut follower: raylet_state::LogFollower) -> anyhow::Result<()> {
    loop {
        let next = follower.next().await.context("following the log")?;
        if next.lines_lost {
            eprintln!("(lines were lost: the log rotated past them before they were read)");
        }
        print!("{}", next.text);
        std::io::Write::flush(&mut std::io::stdout())?;
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

pub fn stack(args: StackArgs) -> anyhow::Result<()> {
    let (address, token) = args.cluster.head()?;
    let dumps = crate::runtime()?
        .block_on(raylet_state::dump_worker_stacks(
            &address,
            &token,
            args.node,
            args.worker,
        ))
        .with_context(|| format!("dumping the stacks of the workers of the cluster at {address}"))?;
    if dumps.is_empty() {
        eprintln!("(no workers are running)");
    }
    for dump in dumps {
        let worker = dump.worker_id.map_or_else(|| "?".to_string(), |id| id.to_string());
        println!(
            "======== worker {worker}, pid {}, on node {} ========",
            dump.pid,
            dump.node_id.short()
        );
        match dump.error {
            Some(error) => println!("(no dump: {error})\n"),
            None => println!("{}", dump.text),
        }
    }
    Ok(())
}

fn fetch(status: &StatusArgs, job: Option<raylet::JobId>) -> anyhow::Result<raylet_state::TaskListing> {
    let (address, token) = status.cluster.head()?;
    crate::runtime()?
        .block_on(raylet_state::list_tasks(&address, &token, job, u32::MAX))
        .with_context(|| format!("listing the tasks of the cluster at {address}"))
}

fn render_tasks(tasks: &[TaskInfo], matched: usize, dropped: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "======== {} of {matched} tasks (newest first) ========",
        tasks.len()
    );
    let _ = writeln!(
        out,
        "{:<32}  {:>3}  {:<28}  {:<23}  {:<8}  {:>7}  {:>10}  {:>7}  ERROR",
        "TASK ID", "TRY", "NAME", "STATE", "NODE", "PID", "RUN MS", "ITEMS"
    );
    for task in tasks {
        let name = short_name(&task.name);
        let node = task.node_id.map(|id| id.short()).unwrap_or_else(|| "-".into());
        let pid = task.worker_pid.map_or("-".into(), |pid| pid.to_string());
        let run = task.duration_ms.map_or("-".into(), |ms| format!("{ms:.1}"));
        let items = task.items_yielded.map_or("-".into(), |items| items.to_string());
        let error = task.error.as_deref().unwrap_or("").lines().next().unwrap_or("");
        let _ = writeln!(
            out,
            "{:<32}  {:>3}  {:<28}  {:<23}  {:<8}  {:>7}  {:>10}  {:>7}  {}",
            task.task_id.to_string(),
            task.attempt,
            name,
            task.state,
            node,
            pid,
            run,
            items,
            error
        );
    }
    if dropped > 0 {
        let _ = writeln!(out, "({dropped} task events were dropped: the oldest records are gone)");
    }
    out.trim_end().to_string()
}

fn render_summary(summary: &[FunctionSummary], tasks: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "======== {tasks} task attempts of {} functions ========",
        summary.len()
    );
    let _ = writeln!(out, "{:<40}  {:<12}  {:>10}  STATES", "NAME", "KIND", "MEAN MS");
    for function in summary {
        let states: Vec<String> = function
            .states
            .iter()
            .map(|(state, count)| format!("{state}: {count}"))
            .collect();
        let kind = match function.kind.as_str() {
            "ACTOR_TASK" => "actor call",
            "ACTOR_CREATION_TASK" => "actor",
            _ => "task",
        };
        let mean = function.mean_duration_ms.map_or("-".into(), |ms| format!("{ms:.2}"));
        let _ = writeln!(
            out,
            "{:<40}  {:<12}  {:>10}  {}",
            function.name,
            kind,
            mean,
            states.join(", ")
        );
    }
    out.trim_end().to_string()
}

/// The last two parts of a path-like name: `module::function`.
fn short_name(name: &str) -> String {
    let parts: Vec<&str> = name.rsplitn(3, "::").collect();
    match parts.as_slice() {
        [last, before, _] => format!("{before}::{last}"),
        _ => name.to_string(),
    }
}
