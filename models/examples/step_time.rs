//! Times training steps of a GPT preset on a CPU backend of burn: the
//! forward and backward pass, then the AdamW update, on a batch of random
//! tokens that fills the context, at an 8192-token vocabulary.
//!
//! `cargo run --release -p raylet-models --example step_time -- [preset] [batch] [steps] [backend]`
//! (defaults: `small 8 5 flex`; one untimed warm-up step comes first). The
//! backends besides `flex` need their feature: `ndarray` (feature
//! `ndarray`) and `libtorch` (feature `tch`, built against a libtorch such
//! as the pip `torch` one: `LIBTORCH_USE_PYTORCH=1`).

use std::error::Error;
use std::time::{Duration, Instant};

use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Distribution;
use raylet_models::gpt::{Gpt, GptConfig};

const VOCAB_SIZE: usize = 8192;

fn main() {
    if let Err(error) = run() {
        eprintln!("step_time: {error}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let preset = args.next().unwrap_or_else(|| "small".to_owned());
    let batch: usize = args.next().map_or(Ok(8), |arg| arg.parse())?;
    let steps: u32 = args.next().map_or(Ok(5), |arg| arg.parse())?;
    if batch == 0 || steps == 0 {
        return Err("the batch and the timed steps must be at least 1".into());
    }
    let backend = args.next().unwrap_or_else(|| "flex".to_owned());
    let config = GptConfig::named(&preset, VOCAB_SIZE)?;

    let device = cpu_device(&backend)?.autodiff();
    device.seed(0);
    let mut model = Gpt::new(&config, &device)?;
    let mut optimizer = AdamWConfig::new().init();
    let (mut forward_backward, mut update) = (Duration::ZERO, Duration::ZERO);
    for step in 0..=steps {
        let tokens = Tensor::<2, Int>::random(
            [batch, config.context_length + 1],
            Distribution::Uniform(0.0, VOCAB_SIZE as f64),
            &device,
        );
        let started = Instant::now();
        let loss = model.loss(tokens);
        let gradients = GradientsParams::from_grads(loss.backward(), &model);
        device.sync()?;
        let backward_done = Instant::now();
        model = optimizer.step(3e-4, model, gradients);
        device.sync()?;
        if step > 0 {
            forward_backward += backward_done - started;
            update += backward_done.elapsed();
        }
    }

    let per_step = |total: Duration| total.as_secs_f64() * 1e3 / f64::from(steps);
    let tokens_per_step = (batch * config.context_length) as f64;
    let step_ms = per_step(forward_backward + update);
    println!(
        "{backend}: {preset} ({:.1}M parameters), batch {batch} x {} tokens, {steps} steps: \
         forward+backward {:.0} ms, AdamW {:.0} ms, step {step_ms:.0} ms, {:.0} tokens/s",
        config.parameter_count() as f64 / 1e6,
        config.context_length,
        per_step(forward_backward),
        per_step(update),
        tokens_per_step / (step_ms / 1e3),
    );
    Ok(())
}

/// The CPU device of the backend called `name`, when this build has it.
fn cpu_device(name: &str) -> Result<Device, Box<dyn Error>> {
    match name {
        "flex" => Ok(Device::flex()),
        // Deprecated in favour of flex: measured to show by how much.
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Ok(Device::ndarray()),
        #[cfg(feature = "tch")]
        "libtorch" => Ok(Device::libtorch()),
        other => Err(format!(
            "no CPU backend {other:?} in this build: flex, or ndarray and libtorch with their features"
        )
        .into()),
    }
}
