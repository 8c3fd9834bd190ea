//! `raylet job submit|status|logs|stop|delete|list`: Ray's job CLI over the
//! head's job service.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use raylet::{Job, JobClient, JobInfo, JobStatus};
use raylet_proto::JobId;

use crate::args::{
    ClusterArgs, JobCommand, JobIdArgs, JobLogsArgs, JobStatusArgs, JobStopArgs, JobSubmitArgs, OutputFormat,
    StatusArgs,
};

pub fn job(command: JobCommand) -> anyhow::Result<ExitCode> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            JobCommand::Submit(args) => submit(args).await,
            JobCommand::Status(args) => status(args).await.map(|()| ExitCode::SUCCESS),
            JobCommand::Logs(args) => logs(args).await.map(|()| ExitCode::SUCCESS),
            JobCommand::Stop(args) => stop(args).await.map(|()| ExitCode::SUCCESS),
            JobCommand::Delete(args) => delete(args).await.map(|()| ExitCode::SUCCESS),
            JobCommand::List(args) => list(args).await.map(|()| ExitCode::SUCCESS),
        }
    })
}

pub(crate) async fn connect(args: &ClusterArgs) -> anyhow::Result<JobClient> {
    let (address, token) = args.head()?;
    JobClient::connect(&address, &token)
        .await
        .with_context(|| format!("connecting to the head at {address}"))
}

async fn submit(args: JobSubmitArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&args.cluster).await?;
    let (binary, rest) = args.entrypoint.split_first().context("name the binary to run")?;
    let mut job = Job::new(binary)
        .args(rest.iter().cloned())
        .files(args.files.iter().cloned())
        .num_cpus(args.num_cpus)
        .num_gpus(args.num_gpus);
    if let Some(name) = &args.name {
        job = job.name(name.clone());
    }
    for (key, value) in &args.env {
        job = job.env(key.clone(), value.clone());
    }
    for (key, value) in &args.metadata {
        job = job.metadata(key.clone(), value.clone());
    }
    let submitted = client
        .submit(&job)
        .await
        .with_context(|| format!("submitting {binary}"))?;
    eprintln!(
        "job {} submitted ({} bytes uploaded)",
        submitted.id, submitted.uploaded_bytes
    );
    if args.no_wait {
        println!("{}", submitted.id);
        eprintln!("follow it with: raylet job logs --follow {}", submitted.id);
        return Ok(ExitCode::SUCCESS);
    }
    let info = follow_to_end(&client, submitted.id).await?;
    eprintln!("job {} {}: {}", info.id, info.status, info.message);
    Ok(exit_code_of(&info))
}

/// Prints the job's output as it comes until the job ends; returns how it ended.
pub(crate) async fn follow_to_end(client: &JobClient, id: JobId) -> anyhow::Result<JobInfo> {
    print_output(client, id, true).await?;
    Ok(client.wait(id).await?)
}

/// 0 for a success; the driver's exit code, or 128 + its signal, for a
/// failure; 1 otherwise.
pub(crate) fn exit_code_of(info: &JobInfo) -> ExitCode {
    match (info.status, info.exit_code, info.signal) {
        (JobStatus::Succeeded, _, _) => ExitCode::SUCCESS,
        (JobStatus::Failed, Some(code), _) if (1..=255).contains(&code) => ExitCode::from(code as u8),
        (JobStatus::Failed, None, Some(signal)) if (1..=127).contains(&signal) => ExitCode::from(128 + signal as u8),
        _ => ExitCode::FAILURE,
    }
}

/// Prints the job's output so far; with `follow`, until the job ends,
/// waiting out a restart of the head.
async fn print_output(client: &JobClient, id: JobId, follow: bool) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    let mut print = |chunk: Vec<u8>| -> std::io::Result<()> {
        stdout.write_all(&chunk)?;
        stdout.flush()
    };
    if !follow {
        return Ok(print(client.logs(id).await?)?);
    }
    let (sender, mut chunks) = tokio::sync::mpsc::channel(16);
    let follower = client.clone();
    tokio::spawn(async move { follower.follow(id, sender).await });
    while let Some(chunk) = chunks.recv().await {
        print(chunk.context("reading the job's output")?)?;
    }
    Ok(())
}

async fn status(args: JobStatusArgs) -> anyhow::Result<()> {
    let info = connect(&args.job.cluster).await?.info(args.job.job_id).await?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&info)?,
        OutputFormat::Text => describe(&info),
    };
    println!("{output}");
    Ok(())
}

fn describe(info: &JobInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "job {}: {}", info.id, info.status);
    let _ = writeln!(out, "  {}", info.message);
    let _ = writeln!(out, "  entrypoint: {}", info.entrypoint.join(" "));
    if let Some(node) = info.node {
        let _ = writeln!(out, "  node: {node}");
    }
    if info.status == JobStatus::Failed && !info.stderr_tail.is_empty() {
        let _ = writeln!(out, "  the end of its stderr:");
        for line in info.stderr_tail.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    out.trim_end().to_string()
}

async fn logs(args: JobLogsArgs) -> anyhow::Result<()> {
    let client = connect(&args.job.cluster).await?;
    print_output(&client, args.job.job_id, args.follow).await
}

async fn stop(args: JobStopArgs) -> anyhow::Result<()> {
    let client = connect(&args.job.cluster).await?;
    let id = args.job.job_id;
    client.stop(id, args.grace_period).await?;
    let info = client.wait(id).await?;
    println!("job {id} {}: {}", info.status, info.message);
    Ok(())
}

async fn delete(args: JobIdArgs) -> anyhow::Result<()> {
    let client = connect(&args.cluster).await?;
    client.delete(args.job_id).await?;
    println!("job {} deleted", args.job_id);
    Ok(())
}

/// Every job of the cluster, ended ones included.
pub(crate) async fn list_jobs(cluster: &ClusterArgs) -> anyhow::Result<Vec<JobInfo>> {
    Ok(connect(cluster).await?.list().await?)
}

async fn list(args: StatusArgs) -> anyhow::Result<()> {
    let jobs = list_jobs(&args.cluster).await?;
    let output = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&jobs)?,
        OutputFormat::Text => render_jobs(&jobs),
    };
    println!("{output}");
    Ok(())
}

pub(crate) fn render_jobs(jobs: &[JobInfo]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "======== {} jobs ========", jobs.len());
    let _ = writeln!(
        out,
        "{:<32}  {:<16}  {:<9}  {:<6}  ENTRYPOINT",
        "JOB ID", "NAME", "STATUS", "EXIT"
    );
    for job in jobs {
        let exit = match (job.exit_code, job.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(signal)) => format!("sig{signal}"),
            (None, None) => "-".into(),
        };
        let name = if job.name.is_empty() { "-" } else { &job.name };
        let _ = writeln!(
            out,
            "{:<32}  {:<16}  {:<9}  {:<6}  {}",
            job.id.to_string(),
            name,
            job.status.to_string(),
            exit,
            job.entrypoint.join(" ")
        );
    }
    out.trim_end().to_string()
}
