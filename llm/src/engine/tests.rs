//! The engine against a virtual model whose tokens are bytes and whose
//! every step is observed (batch sizes, a delay per step, a token that
//! makes it panic), and against a real GPT.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::prelude::Device;
use raylet_models::gpt::{Gpt, GptConfig};
use raylet_models::tokenizer::LmTokenizer;

use super::*;
use crate::model::{GptModel, GptTokenizer};

const END_OF_TEXT: u32 = 256;
/// Decoding a sequence whose prompt starts with this token panics.
const POISON: u32 = b'P' as u32;

/// Tokens are bytes; after byte `b` the most likely token is `b + 1`, and
/// after `!`, end of text. Its cache is the tokens seen. A prompt that
/// starts with `P` makes decoding panic.
#[derive(Clone)]
struct CountingModel {
    context_length: usize,
    step_delay: Duration,
    batch_sizes: Arc<Mutex<Vec<usize>>>,
    /// Per step, the tokens each sequence read.
    reads: Arc<Mutex<Vec<Vec<usize>>>>,
}

impl CountingModel {
    fn new(context_length: usize, step_delay: Duration) -> Self {
        CountingModel {
            context_length,
            step_delay,
            batch_sizes: Arc::default(),
            reads: Arc::default(),
        }
    }

    fn logits_after(last: u32) -> Vec<f32> {
        let next = match last {
            33 => END_OF_TEXT,
            last => (last + 1) % 256,
        };
        let mut logits = vec![0.0; 257];
        logits[next as usize] = 10.0;
        logits
    }

    fn largest_batch(&self) -> usize {
        self.batch_sizes.lock().unwrap().iter().copied().max().unwrap_or(0)
    }
}

impl LanguageModel for CountingModel {
    type Cache = Vec<u32>;

    fn context_length(&self) -> usize {
        self.context_length
    }

    fn vocab_size(&self) -> usize {
        257
    }

    fn cache_bytes_per_token(&self) -> usize {
        1
    }

    fn new_cache(&self, capacity: usize) -> Vec<u32> {
        Vec::with_capacity(capacity)
    }

    fn step(&self, batch: &mut [(&[u32], &mut Vec<u32>)]) -> Vec<f32> {
        std::thread::sleep(self.step_delay);
        self.batch_sizes.lock().unwrap().push(batch.len());
        let reads = batch.iter().map(|(tokens, _)| tokens.len()).collect();
        self.reads.lock().unwrap().push(reads);
        let mut logits = Vec::new();
        for (tokens, cache) in batch.iter_mut() {
            assert!(
                cache.len() + tokens.len() <= cache.capacity(),
                "decoding past the cache's capacity"
            );
            cache.extend_from_slice(tokens);
            assert!(cache[0] != POISON, "a prompt that starts with the poison token");
            logits.extend(Self::logits_after(*cache.last().unwrap()));
        }
        logits
    }
}

/// One token per byte; end of text is 256.
struct ByteTokenizer {
    bytes: Vec<Vec<u8>>,
}

impl ByteTokenizer {
    fn shared() -> Arc<dyn Tokenizer> {
        Arc::new(ByteTokenizer {
            bytes: (0..=255u8).map(|b| vec![b]).collect(),
        })
    }
}

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    fn end_of_text(&self) -> u32 {
        END_OF_TEXT
    }
}

fn engine(model: CountingModel, options: EngineOptions) -> Engine {
    Engine::start(
        model,
        ByteTokenizer::shared(),
        options,
        Arc::new(ServingStats::unlabelled()),
    )
    .unwrap()
}

fn options(cache_tokens: usize) -> EngineOptions {
    EngineOptions {
        kv_cache_bytes: cache_tokens,
        ..EngineOptions::default()
    }
}

/// A request that runs to its `max_tokens`, counting past end of text.
fn long_request(prompt: &str, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        ignore_eos: true,
        ..request(prompt, max_tokens)
    }
}

fn request(prompt: &str, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.bytes().map(u32::from).collect(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        ignore_eos: false,
    }
}

/// The text of every event and the last event, waiting for the end.
fn finish(generation: &mut Generation) -> (String, Event) {
    let mut text = String::new();
    loop {
        match generation
            .events
            .blocking_recv()
            .expect("the engine ends every generation")
        {
            Event::Token(piece) => text.push_str(&piece),
            end => return (text, end),
        }
    }
}

fn finished(reason: FinishReason, completion_tokens: usize) -> Event {
    Event::Finished {
        reason,
        completion_tokens,
    }
}

#[test]
fn greedy_decoding_sends_each_tokens_text_and_ends_at_max_tokens() {
    let engine = engine(CountingModel::new(64, Duration::ZERO), options(1000));
    let mut generation = engine.submit(request("abc", 5)).unwrap();
    assert_eq!(generation.prompt_tokens, 3);
    let mut texts = Vec::new();
    while let Some(Event::Token(text)) = generation.events.blocking_recv() {
        texts.push(text);
    }
    assert_eq!(texts, ["d", "e", "f", "g", "h"]);
}

#[test]
fn end_of_text_stops_a_sequence_unless_it_is_ignored() {
    let engine = engine(CountingModel::new(64, Duration::ZERO), options(1000));
    let stopped = finish(&mut engine.submit(request(" ", 10)).unwrap());
    assert_eq!(stopped, ("!".to_string(), finished(FinishReason::Stop, 2)));
    let ignoring = GenerationRequest {
        ignore_eos: true,
        ..request(" ", 4)
    };
    let (text, end) = finish(&mut engine.submit(ignoring).unwrap());
    assert_eq!(end, finished(FinishReason::Length, 4));
    assert_eq!(text, "!\u{1}\u{2}", "end of text adds no text");
}

#[test]
fn a_stop_sequence_ends_the_output_before_it() {
    let engine = engine(CountingModel::new(64, Duration::ZERO), options(1000));
    let stopping = GenerationRequest {
        stop: vec!["ef".into(), "zz".into()],
        ..request("a", 20)
    };
    let (text, end) = finish(&mut engine.submit(stopping).unwrap());
    assert_eq!(text, "bcd");
    assert_eq!(end, finished(FinishReason::Stop, 5));
}

#[test]
fn a_long_request_does_not_hold_back_a_short_one_that_arrives_after_it() {
    let model = CountingModel::new(400, Duration::from_millis(2));
    let engine = engine(model.clone(), options(1000));
    let mut long = engine.submit(long_request("a", 300)).unwrap();
    assert!(matches!(long.events.blocking_recv(), Some(Event::Token(_))));

    let (text, end) = finish(&mut engine.submit(request("0", 5)).unwrap());

    assert_eq!((text.as_str(), end), ("12345", finished(FinishReason::Length, 5)));
    let mut long_so_far = 1;
    while let Ok(event) = long.events.try_recv() {
        assert!(
            matches!(event, Event::Token(_)),
            "the long request ended first: {event:?}"
        );
        long_so_far += 1;
    }
    assert!(long_so_far < 300, "the long request made {long_so_far} tokens first");
    assert_eq!(
        model.largest_batch(),
        2,
        "the short request joined the long one's batch"
    );
    assert_eq!(finish(&mut long).1, finished(FinishReason::Length, 300));
}

#[test]
fn the_cache_budget_is_never_exceeded_and_requests_that_do_not_fit_wait() {
    let model = CountingModel::new(64, Duration::from_millis(1));
    // Each request reserves 10 + 30 tokens: two fit in 100.
    let engine = engine(model.clone(), options(100));
    let mut generations: Vec<Generation> = (0..6)
        .map(|_| engine.submit(request("0123456789", 30)).unwrap())
        .collect();
    let fullness = engine.fullness();
    assert!(
        fullness > 1.0 && fullness <= 2.4,
        "six requests of 40 tokens over 100: {fullness}"
    );

    for generation in &mut generations {
        assert_eq!(finish(generation).1, finished(FinishReason::Length, 30));
    }

    assert_eq!(engine.budget().peak(), 80, "two requests at once, never three");
    assert_eq!(engine.fullness(), 0.0, "nothing reserved or waiting");
    assert_eq!(model.largest_batch(), 2);
    assert_eq!(engine.budget().reserved(), 0, "every reservation came back");
}

#[test]
fn the_batch_and_the_prompt_tokens_per_step_stay_within_their_limits() {
    let model = CountingModel::new(64, Duration::from_millis(1));
    let limited = EngineOptions {
        max_batch_size: 3,
        max_prefill_tokens: 6,
        ..options(10_000)
    };
    let engine = engine(model.clone(), limited);
    // Prompts of 3 tokens within an allowance of 6 are never cut, so every
    // read of more than one token is a whole prompt.
    let mut generations: Vec<Generation> = (0..7).map(|_| engine.submit(request("abc", 20)).unwrap()).collect();
    for generation in &mut generations {
        assert_eq!(finish(generation).1, finished(FinishReason::Length, 20));
    }
    assert_eq!(model.largest_batch(), 3);
    let reads = model.reads.lock().unwrap();
    for step in reads.iter() {
        let prompt_tokens: usize = step.iter().filter(|&&read| read > 1).sum();
        assert!(prompt_tokens <= 6, "a step read {step:?}");
    }
    assert!(
        reads
            .iter()
            .any(|step| step.iter().filter(|&&read| read > 1).sum::<usize>() == 6)
    );
}

#[test]
fn a_prompt_beyond_a_steps_allowance_is_read_in_parts_and_gives_the_same_text() {
    let model = CountingModel::new(64, Duration::ZERO);
    let chunked = EngineOptions {
        max_prefill_tokens: 4,
        ..options(1000)
    };
    let engine = engine(model.clone(), chunked);

    let (text, end) = finish(&mut engine.submit(request("abcdefghij", 3)).unwrap());

    assert_eq!((text.as_str(), end), ("klm", finished(FinishReason::Length, 3)));
    let reads = model.reads.lock().unwrap().clone();
    assert_eq!(reads, [[4], [4], [2], [1], [1]]);
}

#[test]
fn an_engine_that_reads_no_prompt_token_a_step_is_refused() {
    let none = EngineOptions {
        max_prefill_tokens: 0,
        ..options(1000)
    };
    let refused = Engine::start(
        CountingModel::new(64, Duration::ZERO),
        ByteTokenizer::shared(),
        none,
        Arc::new(ServingStats::unlabelled()),
    );
    assert!(matches!(refused, Err(LlmError::ReadsNoPrompt)));
}

#[test]
fn requests_that_can_never_run_are_refused_at_once() {
    let engine = engine(CountingModel::new(32, Duration::ZERO), options(20));
    let refused = |request| engine.submit(request).err().unwrap().to_string();
    assert_eq!(
        refused(request("", 4)),
        "the prompt is empty: it needs at least one token"
    );
    assert!(refused(request("abc", 0)).contains("max_tokens must be at least 1"));
    let beyond = refused(request("abcdefghij", 30));
    assert!(
        beyond.starts_with("the prompt has 10 tokens and max_tokens is 30"),
        "{beyond}"
    );
    assert!(beyond.contains("the context length, 32 tokens"), "{beyond}");
    let too_big = refused(request("abcdefghij", 15));
    assert!(too_big.contains("whole cache (20 tokens)"), "{too_big}");

    let no_waiting = EngineOptions {
        max_waiting: 0,
        ..options(20)
    };
    let full = super::tests::engine(CountingModel::new(32, Duration::ZERO), no_waiting);
    assert!(matches!(full.submit(request("a", 2)), Err(LlmError::Busy { .. })));
}

#[test]
fn a_dropped_generation_frees_its_place_for_a_waiting_one() {
    let model = CountingModel::new(400, Duration::from_millis(1));
    // Room for one request at a time.
    let engine = engine(model, options(350));
    let mut first = engine.submit(long_request("a", 300)).unwrap();
    assert!(matches!(first.events.blocking_recv(), Some(Event::Token(_))));
    let mut second = engine.submit(long_request("a", 300)).unwrap();
    drop(first);
    let (_, end) = finish(&mut second);
    assert_eq!(end, finished(FinishReason::Length, 300));
    assert_eq!(engine.budget().peak(), 301);
}

#[test]
fn a_model_that_panics_fails_its_sequences_and_the_engine_goes_on() {
    let engine = engine(CountingModel::new(64, Duration::ZERO), options(1000));
    let (_, end) = finish(&mut engine.submit(request("PQ", 5)).unwrap());
    let Event::Failed(message) = end else {
        panic!("the poisoned sequence ended with {end:?}");
    };
    assert!(message.contains("the poison token"), "{message}");
    assert!(message.starts_with("decoding: "), "{message}");
    assert_eq!(engine.budget().reserved(), 0);
    assert_eq!(finish(&mut engine.submit(request("a", 3)).unwrap()).0, "bcd");
}

#[test]
fn a_seeded_request_repeats_its_text() {
    let engine = engine(CountingModel::new(64, Duration::ZERO), options(1000));
    let seeded = |seed| GenerationRequest {
        sampling: SamplingParams {
            temperature: 50.0,
            top_p: 1.0,
            seed: Some(seed),
        },
        ..long_request("a", 12)
    };
    let first = finish(&mut engine.submit(seeded(1)).unwrap()).0;
    assert_eq!(finish(&mut engine.submit(seeded(1)).unwrap()).0, first);
    assert_ne!(finish(&mut engine.submit(seeded(2)).unwrap()).0, first);
}

#[test]
fn a_gpt_decodes_in_a_batch_what_it_decodes_alone() {
    let device = Device::flex();
    let texts = ["def add(a, b):\n    return a + b\n"; 20];
    let tokenizer = LmTokenizer::train(texts, 300).unwrap();
    let config = GptConfig {
        vocab_size: tokenizer.vocab_size(),
        context_length: 48,
        d_model: 32,
        n_heads: 4,
        n_layers: 2,
        mlp_ratio: 4,
        dropout: 0.0,
    };
    device.seed(3);
    let gpt = Gpt::new(&config, &device).unwrap();
    // Eight prompts: on two or more cores, a step is split among them.
    let prompts = [
        "def",
        "return a",
        "def add(a, b):\n",
        "b",
        "add",
        "(a",
        "    return",
        "a + b",
    ];
    let tokenizer = Arc::new(GptTokenizer::new(tokenizer));
    let alone: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            let ids = tokenizer.encode(prompt).unwrap();
            let generated = gpt.generate_greedy(&ids, 12, &device);
            let bytes: Vec<u8> = generated[ids.len()..]
                .iter()
                .flat_map(|&id| tokenizer.token_bytes(id).to_vec())
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect();

    // Three prompt tokens a step: the longer prompts are read in parts,
    // beside sequences already decoding.
    let chunked = EngineOptions {
        max_prefill_tokens: 3,
        ..EngineOptions::default()
    };
    let engine = Engine::start(
        GptModel::new(gpt, device),
        tokenizer.clone(),
        chunked,
        Arc::new(ServingStats::unlabelled()),
    )
    .unwrap();
    let mut generations: Vec<Generation> = prompts
        .iter()
        .map(|prompt| {
            let ids = tokenizer.encode(prompt).unwrap();
            let request = GenerationRequest {
                prompt: ids,
                ignore_eos: true,
                ..request("", 12)
            };
            engine.submit(request).unwrap()
        })
        .collect();
    let batched: Vec<String> = generations.iter_mut().map(|g| finish(g).0).collect();

    assert_eq!(batched, alone);
}
