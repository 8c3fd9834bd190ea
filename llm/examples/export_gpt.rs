//! Writes a trained GPT's weights as a safetensors file, under PyTorch's
//! names and layout, so that PyTorch serves the very same model (the
//! serving benchmark, `bench/compare_llm_serve.sh`).
//!
//! ```text
//! cargo run --release -p raylet-llm --example export_gpt -- \
//!     --checkpoint target/gpt-example/runs/gpt-small-2115/checkpoint_000005 --out gpt.safetensors
//! ```

use std::path::PathBuf;

use clap::Parser;
use raylet_lm::TrainedGpt;

/// Exports a GPT checkpoint's weights as safetensors (PyTorch layout).
#[derive(Parser)]
struct Args {
    /// A checkpoint directory of raylet-lm's GPT training.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The safetensors file to write.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let trained = TrainedGpt::load(&args.checkpoint, &raylet_train::cpu_device())?;
    trained.model.save_safetensors(&args.out)?;
    println!(
        "wrote {} ({} parameters, trained {} steps)",
        args.out.display(),
        trained
            .model
            .pytorch_tensors()
            .iter()
            .map(|t| t.values.len())
            .sum::<usize>(),
        trained.steps
    );
    Ok(())
}
