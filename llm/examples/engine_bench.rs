//! The engine alone, without HTTP or a cluster: C clients in a closed loop
//! generate from a GPT of random weights (a preset's shape), each sending
//! its next request when the previous ends, as `bench/llm_load.py` does
//! over HTTP. Prints output tokens/s (over every request) and time to first token and
//! inter-token latency percentiles, for measuring a change to the engine
//! or the model's decoding step before the side-by-side benchmark.
//!
//! ```text
//! cargo run --release -p raylet-llm --example engine_bench -- --concurrency 16
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::prelude::Device;
use clap::Parser;
use raylet_llm::{
    Engine, EngineOptions, Event, GenerationRequest, GptModel, LlmError, SamplingParams, ServingStats, Tokenizer,
};
use raylet_models::gpt::{Gpt, GptConfig};

/// Measures the engine's output tokens/s under a closed loop.
#[derive(Parser)]
struct Args {
    /// Clients, each with one request at a time.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Requests each client sends (after one warm-up request).
    #[arg(long, default_value_t = 8)]
    requests_per_client: usize,
    /// The GPT preset (tiny, small, base).
    #[arg(long, default_value = "small")]
    model: String,
    #[arg(long, default_value_t = 8192)]
    vocab_size: usize,
    #[arg(long, default_value_t = 128)]
    context_length: usize,
    /// The most prompt tokens a step reads.
    #[arg(long, default_value_t = EngineOptions::default().max_prefill_tokens)]
    max_prefill_tokens: usize,
}

/// Token `id` is the letter `a + id % 26`: text the engine can send.
struct LetterTokenizer {
    letters: Vec<[u8; 1]>,
}

impl Tokenizer for LetterTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        &self.letters[id as usize % 26]
    }

    fn end_of_text(&self) -> u32 {
        0
    }
}

/// What one client saw of its timed requests.
#[derive(Default)]
struct ClientFigures {
    tokens: usize,
    first_tokens: Vec<Duration>,
    inter_tokens: Vec<Duration>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = Device::flex();
    let config = GptConfig {
        context_length: args.context_length,
        ..GptConfig::named(&args.model, args.vocab_size)?
    };
    device.seed(0);
    let gpt = Gpt::new(&config, &device)?;
    let tokenizer = Arc::new(LetterTokenizer {
        letters: (b'a'..=b'z').map(|letter| [letter]).collect(),
    });
    let engine = Arc::new(Engine::start(
        GptModel::new(gpt, device),
        tokenizer,
        EngineOptions {
            max_prefill_tokens: args.max_prefill_tokens,
            ..EngineOptions::default()
        },
        Arc::new(ServingStats::unlabelled()),
    )?);
    let started = Instant::now();
    let clients: Vec<_> = (0..args.concurrency)
        .map(|client| {
            let engine = engine.clone();
            let requests = args.requests_per_client;
            let vocab = args.vocab_size as u32;
            let context = args.context_length;
            std::thread::spawn(move || run_client(&engine, client, requests, vocab, context))
        })
        .collect();
    let mut all = ClientFigures::default();
    for client in clients {
        let figures = client.join().map_err(|_| "a client panicked")??;
        all.tokens += figures.tokens;
        all.first_tokens.extend(figures.first_tokens);
        all.inter_tokens.extend(figures.inter_tokens);
    }
    report(&args, &mut all, started.elapsed());
    Ok(())
}

/// One client's requests: prompts of 16 to 96 tokens, outputs of 16, 32,
/// 64 and 128 tokens in turn (capped to the context); the first request is
/// a warm-up whose figures are left out.
fn run_client(
    engine: &Engine,
    client: usize,
    requests: usize,
    vocab: u32,
    context: usize,
) -> Result<ClientFigures, String> {
    let mut figures = ClientFigures::default();
    for index in 0..=requests {
        let turn = client * 7 + index;
        let prompt_len = 16 + (turn * 37) % 81;
        let prompt: Vec<u32> = (0..prompt_len)
            .map(|at| ((turn * 131 + at * 17) as u32) % vocab)
            .collect();
        let max_tokens = (16 << (turn % 4)).min(context - prompt_len);
        let request = GenerationRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: true,
        };
        let sent = Instant::now();
        let mut generation = engine.submit(request).map_err(|e| e.to_string())?;
        let mut last = None;
        let mut timed = ClientFigures::default();
        while let Some(event) = generation.events.blocking_recv() {
            match event {
                Event::Token(_) => {
                    let now = Instant::now();
                    match last {
                        None => timed.first_tokens.push(now - sent),
                        Some(previous) => timed.inter_tokens.push(now - previous),
                    }
                    last = Some(now);
                }
                Event::Finished { completion_tokens, .. } => timed.tokens = completion_tokens,
                Event::Failed(message) => return Err(message),
            }
        }
        figures.tokens += timed.tokens;
        if index > 0 {
            figures.first_tokens.extend(timed.first_tokens);
            figures.inter_tokens.extend(timed.inter_tokens);
        }
    }
    Ok(figures)
}

fn report(args: &Args, all: &mut ClientFigures, elapsed: Duration) {
    all.first_tokens.sort();
    all.inter_tokens.sort();
    println!(
        "{} GPT, concurrency {}: {:.1} output tokens/s; TTFT p50 {:.1} ms p99 {:.1} ms; ITL p50 {:.2} ms p99 {:.2} ms",
        args.model,
        args.concurrency,
        all.tokens as f64 / elapsed.as_secs_f64(),
        millis(percentile(&all.first_tokens, 0.5)),
        millis(percentile(&all.first_tokens, 0.99)),
        millis(percentile(&all.inter_tokens, 0.5)),
        millis(percentile(&all.inter_tokens, 0.99)),
    );
}

fn percentile(sorted: &[Duration], quantile: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
