//! The `raylet` command line: start, inspect and stop raylet clusters.

mod args;
mod cluster;
mod daemon;
mod flag_values;
mod head_node;
mod job;
mod list;
mod memory;
mod microbenchmark;
mod row_filter;
mod serve;
mod spill_bucket;
mod start;
mod status;
mod stop;
mod tasks;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.tls.configure() {
        Err(error) => Err(error),
        Ok(()) => run(cli.command),
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}

/// Runs one command.
fn run(command: Command) -> anyhow::Result<ExitCode> {
    let done = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
    match command {
        Command::Start(args) => done(start::start(*args)),
        Command::Status(args) => done(status::status(args)),
        Command::Memory(args) => done(memory::memory(args)),
        Command::List(command) => done(list::list(command)),
        Command::Summary(command) => done(tasks::summary(command)),
        Command::Timeline(args) => done(tasks::timeline(args)),
        Command::Logs(args) => done(tasks::logs(args)),
        Command::Stack(args) => done(tasks::stack(args)),
        Command::Job(command) => job::job(command),
        Command::Serve(command) => serve::serve(command),
        Command::Stop(args) => done(stop::stop(args)),
        Command::Up(args) => cluster::up(args),
        Command::Down(args) => done(cluster::down(args)),
        Command::Microbenchmark(args) => done(microbenchmark::microbenchmark(args)),
    }
}

/// A tokio runtime for one command.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Logs to stderr at `default_level`, or as `RAYLET_LOG` says.
fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAYLET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
}
