//! Serves a trained GPT OpenAI-compatibly on an embedded raylet cluster,
//! until SIGINT or SIGTERM: what `bench/compare_llm_serve.sh` runs, and a
//! way to try the API by hand.
//!
//! ```text
//! cargo run --release -p raylet-llm --example llm_serve -- \
//!     --checkpoint target/gpt-example/runs/gpt-small-2115/checkpoint_000005 --port 8000
//! curl -H "Authorization: Bearer $(cat <token-file>)" localhost:8000/v1/models
//! ```

use std::path::PathBuf;

use clap::Parser;
use raylet_llm::EngineOptions;
use raylet_llm::openai::{ServerInit, application};
use raylet_serve::HttpOptions;

/// Serves a GPT checkpoint at http://127.0.0.1:PORT/v1 (completions, chat
/// completions, models), the cluster token as the API key.
#[derive(Parser)]
struct Args {
    /// A checkpoint directory of raylet-lm's GPT training (model.bpk,
    /// state.json, tokenizer.json).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The name clients ask for in `model`.
    #[arg(long, default_value = "gpt")]
    model: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Where to write the API key (the cluster token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Replicas, each with its own engine.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// MiB of key/value cache per replica.
    #[arg(long, default_value_t = 256)]
    kv_cache_mib: usize,
    /// The most sequences a replica decodes at once.
    #[arg(long, default_value_t = 64)]
    max_batch_size: usize,
    /// The most prompt tokens a step reads; longer prompts are read in
    /// parts over several steps.
    #[arg(long, default_value_t = EngineOptions::default().max_prefill_tokens)]
    max_prefill_tokens: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let cluster = raylet::init()?;
    let init = ServerInit {
        model_name: args.model,
        checkpoint: std::path::absolute(&args.checkpoint)?,
        engine: EngineOptions {
            kv_cache_bytes: args.kv_cache_mib << 20,
            max_batch_size: args.max_batch_size,
            max_prefill_tokens: args.max_prefill_tokens,
            ..EngineOptions::default()
        },
    };
    let http = HttpOptions::default().host([127, 0, 0, 1].into()).port(args.port);
    let serve = raylet_serve::run_with(&cluster, application("llm", init, args.replicas)?, http)?;
    if let Some(path) = &args.token_file {
        std::fs::write(path, cluster.token())?;
    }
    println!("ready http://{}", serve.address());
    wait_for_signal()?;
    serve.shutdown()?;
    Ok(())
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        Ok(())
    })
}
