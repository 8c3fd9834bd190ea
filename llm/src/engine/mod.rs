//! The engine: one thread that owns a model and decodes every sequence it
//! serves in one batch, changing the batch at every step (continuous, or
//! iteration-level, batching, as Orca and vLLM do).
//!
//! **A step.** New requests are taken in; those whose clients went away
//! are dropped. Waiting requests join the batch, first come first served,
//! while the batch has room (`max_batch_size`) and the cache budget has
//! room for all the tokens each may hold ([`budget`]). Then one batched
//! call feeds the sequences: each decoding one its last token, and those
//! still reading their prompts (prefill) as much of the rest as
//! `max_prefill_tokens` leaves, first come first served, so a long prompt
//! is read in parts over several steps (chunked prefill) and a flood of
//! prompts delays the decoding sequences by a bounded amount. The prompts
//! ride on the same pass over the weights as the decoding, and keep a step
//! split among cores even. A sequence's first token comes from the step
//! that reads the end of its prompt. Sequences that are done (their
//! `max_tokens`, end of text, a stop sequence) leave at once and give back
//! their cache. A long request therefore never holds back a short one that
//! arrives after it.
//!
//! **Requests** are refused at once, not queued, when they can never run:
//! an empty prompt, a prompt and `max_tokens` beyond the context, a cache
//! reservation larger than the whole budget; and with back-pressure when
//! `max_waiting` requests already wait.
//!
//! **Events.** Each request gets its tokens' text as they are made, then
//! how it finished; dropping the [`Generation`] cancels it and frees its
//! place at the next step.

mod budget;
mod sampling;
mod text;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

pub use budget::CacheBudget;
pub use sampling::SamplingParams;

use raylet::error::panic_message;

use crate::LlmError;
use crate::model::{LanguageModel, Tokenizer};
use crate::stats::ServingStats;
use sampling::Sampler;
use text::{Added, TextOutput};

/// How an engine batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineOptions {
    /// Bytes of key/value cache for all sequences together.
    pub kv_cache_bytes: usize,
    /// The most sequences decoding at once.
    pub max_batch_size: usize,
    /// The most prompt tokens read in one step, over all sequences; a
    /// longer prompt is read in parts over several steps.
    pub max_prefill_tokens: usize,
    /// The most requests waiting to join; more are refused.
    pub max_waiting: usize,
}

impl Default for EngineOptions {
    /// 256 MiB of cache, 64 sequences, 256 prompt tokens a step, 1024
    /// waiting.
    fn default() -> Self {
        EngineOptions {
            kv_cache_bytes: 256 << 20,
            max_batch_size: 64,
            max_prefill_tokens: 256,
            max_waiting: 1024,
        }
    }
}

/// One request to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The most tokens to generate.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Texts that end the output where they appear (and are not sent).
    pub stop: Vec<String>,
    /// Keep generating past the end-of-text token (as vLLM's `ignore_eos`).
    pub ignore_eos: bool,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// It made `max_tokens`.
    Length,
    /// The end-of-text token or a stop sequence.
    Stop,
}

/// What a generation sends.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The text of the next token (empty while a character or a possible
    /// stop sequence is incomplete).
    Token(String),
    /// The end, and the tokens made.
    Finished {
        reason: FinishReason,
        completion_tokens: usize,
    },
    /// The model failed; the generation ends here.
    Failed(String),
}

/// A running request: its events, as they come. Dropping it cancels it.
pub struct Generation {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Unbounded, so that a slow client never stalls the batch: it holds at
    /// most one event per token of `max_tokens` and the end.
    pub events: UnboundedReceiver<Event>,
}

/// A handle to an engine thread; dropping the last one stops the thread
/// once its sequences are done. Requests reach the thread over a channel
/// that `max_waiting` bounds: a request beyond it is refused
/// ([`LlmError::Busy`]), never queued.
pub struct Engine {
    arrivals: Option<mpsc::Sender<Arrival>>,
    thread: Option<JoinHandle<()>>,
    limits: Limits,
    budget: Arc<CacheBudget>,
    load: Arc<Load>,
}

/// What decides whether a request can ever run.
#[derive(Clone, Copy, Debug)]
struct Limits {
    context_length: usize,
    max_waiting: usize,
}

/// Sequences at the engine, readable from any thread.
#[derive(Debug, Default)]
struct Load {
    running: AtomicUsize,
    /// Requests submitted and not yet in the batch.
    waiting: AtomicUsize,
    /// The cache tokens those requests will reserve.
    waiting_tokens: AtomicUsize,
}

impl Engine {
    /// Starts an engine thread decoding with `model`.
    pub fn start<M: LanguageModel>(
        model: M,
        tokenizer: Arc<dyn Tokenizer>,
        options: EngineOptions,
        stats: Arc<ServingStats>,
    ) -> Result<Self, LlmError> {
        let capacity = options.kv_cache_bytes / model.cache_bytes_per_token().max(1);
        if capacity == 0 || options.max_batch_size == 0 {
            return Err(LlmError::HoldsNothing {
                kv_cache_bytes: options.kv_cache_bytes,
                bytes_per_token: model.cache_bytes_per_token(),
            });
        }
        if options.max_prefill_tokens == 0 {
            return Err(LlmError::ReadsNoPrompt);
        }
        let limits = Limits {
            context_length: model.context_length(),
            max_waiting: options.max_waiting,
        };
        let budget = CacheBudget::new(capacity);
        let load = Arc::new(Load::default());
        let (arrivals, arrived) = mpsc::channel();
        let decoder = Decoder {
            model,
            tokenizer,
            options,
            stats,
            budget: budget.clone(),
            load: load.clone(),
            arrived,
            waiting: VecDeque::new(),
            running: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("llm-engine".into())
            .spawn(move || decoder.run())
            .map_err(LlmError::Thread)?;
        Ok(Engine {
            arrivals: Some(arrivals),
            thread: Some(thread),
            limits,
            budget,
            load,
        })
    }

    /// Queues `request`, or refuses it when it can never run or too many
    /// wait.
    pub fn submit(&self, request: GenerationRequest) -> Result<Generation, LlmError> {
        let reservation = self.check(&request)?;
        let (events, received) = unbounded_channel();
        let prompt_tokens = request.prompt.len();
        self.load.waiting.fetch_add(1, Ordering::Relaxed);
        self.load.waiting_tokens.fetch_add(reservation, Ordering::Relaxed);
        let arrival = Arrival {
            request,
            reservation,
            events,
            arrived_at: Instant::now(),
        };
        let sent = self.arrivals.as_ref().map(|arrivals| arrivals.send(arrival));
        if !matches!(sent, Some(Ok(()))) {
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            self.load.waiting_tokens.fetch_sub(reservation, Ordering::Relaxed);
            return Err(LlmError::EngineStopped);
        }
        Ok(Generation {
            prompt_tokens,
            events: received,
        })
    }

    /// The most tokens a sequence can hold.
    pub fn context_length(&self) -> usize {
        self.limits.context_length
    }

    /// The cache budget, in tokens.
    pub fn budget(&self) -> &CacheBudget {
        &self.budget
    }

    /// Sequences in the batch now.
    pub fn running(&self) -> usize {
        self.load.running.load(Ordering::Relaxed)
    }

    /// Requests waiting to join the batch.
    pub fn waiting(&self) -> usize {
        self.load.waiting.load(Ordering::Relaxed)
    }

    /// How full the engine is: the cache its running sequences reserved
    /// plus what its waiting requests will reserve, over the budget (above
    /// 1 when requests wait for room).
    pub fn fullness(&self) -> f64 {
        let waiting = self.load.waiting_tokens.load(Ordering::Relaxed);
        (self.budget.reserved() + waiting) as f64 / self.budget.capacity() as f64
    }

    /// The tokens `request` reserves, or why it can never run.
    fn check(&self, request: &GenerationRequest) -> Result<usize, LlmError> {
        let context = self.limits.context_length;
        let prompt = request.prompt.len();
        if prompt == 0 {
            return Err(LlmError::EmptyPrompt);
        }
        if request.max_tokens == 0 || prompt + request.max_tokens > context {
            return Err(LlmError::BeyondContext {
                prompt,
                max_tokens: request.max_tokens,
                context,
            });
        }
        let reservation = prompt + request.max_tokens;
        if reservation > self.budget.capacity() {
            return Err(LlmError::BeyondCache {
                tokens: reservation,
                capacity: self.budget.capacity(),
            });
        }
        if self.waiting() >= self.limits.max_waiting {
            return Err(LlmError::Busy {
                waiting: self.waiting(),
            });
        }
        Ok(reservation)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.arrivals.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Load {
    /// Counts `arrival` out of the waiting requests.
    fn leave_waiting(&self, arrival: &Arrival) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.waiting_tokens.fetch_sub(arrival.reservation, Ordering::Relaxed);
    }
}

/// A request on its way to the engine thread.
struct Arrival {
    request: GenerationRequest,
    reservation: usize,
    events: UnboundedSender<Event>,
    arrived_at: Instant,
}

/// A sequence in the batch.
struct Sequence<C> {
    cache: C,
    /// The tokens it has still to read: the rest of its prompt, then the
    /// token it made last.
    feed: Vec<u32>,
    made: usize,
    max_tokens: usize,
    reservation: usize,
    ignore_eos: bool,
    sampler: Sampler,
    text: TextOutput,
    events: UnboundedSender<Event>,
    /// When its request arrived, then when it made its last token.
    last_token_at: Instant,
}

/// The engine thread's state.
struct Decoder<M: LanguageModel> {
    model: M,
    tokenizer: Arc<dyn Tokenizer>,
    options: EngineOptions,
    stats: Arc<ServingStats>,
    budget: Arc<CacheBudget>,
    load: Arc<Load>,
    arrived: mpsc::Receiver<Arrival>,
    waiting: VecDeque<Arrival>,
    running: Vec<Sequence<M::Cache>>,
}

impl<M: LanguageModel> Decoder<M> {
    fn run(mut self) {
        while self.take_arrivals() {
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step();
            }
            self.publish_load();
        }
    }

    /// Takes in new requests, waiting for one when there is nothing to do;
    /// false once every handle is gone and nothing is left.
    fn take_arrivals(&mut self) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() {
            match self.arrived.recv() {
                Ok(arrival) => self.waiting.push_back(arrival),
                Err(_) => return false,
            }
        }
        self.waiting.extend(self.arrived.try_iter());
        true
    }

    /// Drops the sequences and waiting requests whose receiver is gone.
    fn drop_cancelled(&mut self) {
        let load = &self.load;
        self.waiting.retain(|arrival| {
            let gone = arrival.events.is_closed();
            if gone {
                load.leave_waiting(arrival);
            }
            !gone
        });
        let budget = &self.budget;
        self.running.retain(|sequence| {
            let gone = sequence.events.is_closed();
            if gone {
                budget.release(sequence.reservation);
            }
            !gone
        });
    }

    /// Moves waiting requests into the batch while they fit.
    fn admit(&mut self) {
        while let Some(front) = self.waiting.front() {
            if self.running.len() >= self.options.max_batch_size || !self.budget.try_reserve(front.reservation) {
                return;
            }
            let arrival = self.waiting.pop_front().expect("the front is there");
            self.load.leave_waiting(&arrival);
            self.start(arrival);
        }
    }

    /// An admitted request's sequence, with an empty cache of its
    /// reservation; it reads its prompt at the next step.
    fn start(&mut self, arrival: Arrival) {
        let Arrival {
            request,
            reservation,
            events,
            arrived_at,
        } = arrival;
        self.running.push(Sequence {
            cache: self.model.new_cache(reservation),
            feed: request.prompt,
            made: 0,
            max_tokens: request.max_tokens,
            reservation,
            ignore_eos: request.ignore_eos,
            sampler: Sampler::new(request.sampling),
            text: TextOutput::new(request.stop),
            events,
            last_token_at: arrived_at,
        });
    }

    /// One step: the sequences [`Decoder::reads`] gives tokens read them;
    /// each that has read all it had makes its next token.
    fn step(&mut self) {
        let reads = self.reads();
        let mut batch: Vec<(&[u32], &mut M::Cache)> = self
            .running
            .iter_mut()
            .zip(&reads)
            .filter(|(_, read)| **read > 0)
            .map(|(sequence, &read)| (&sequence.feed[..read], &mut sequence.cache))
            .collect();
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| self.model.step(&mut batch)));
        drop(batch);
        let logits = match stepped {
            Ok(logits) => logits,
            Err(panic) => return self.fail_running(&panic_message(panic.as_ref())),
        };
        let mut rows = logits.chunks_exact(self.model.vocab_size());
        let now = Instant::now();
        let mut running = std::mem::take(&mut self.running);
        let mut kept = Vec::with_capacity(running.len());
        let mut made = 0;
        for (mut sequence, read) in running.drain(..).zip(reads) {
            if read == 0 {
                kept.push(sequence);
                continue;
            }
            let row = rows.next().expect("the model gives a row of logits per sequence");
            sequence.feed.drain(..read);
            if !sequence.feed.is_empty() {
                kept.push(sequence);
                continue;
            }
            made += 1;
            match sequence.made {
                0 => self.stats.first_token(now - sequence.last_token_at),
                _ => self.stats.inter_token(now - sequence.last_token_at),
            }
            sequence.last_token_at = now;
            let token = sequence.sampler.sample(row);
            if self.emit(&mut sequence, token) {
                kept.push(sequence);
            }
        }
        self.stats.tokens_made(made);
        self.running = kept;
    }

    /// The tokens each running sequence reads this step: a decoding one its
    /// last token; one reading its prompt as much of the rest as the step's
    /// `max_prefill_tokens` leaves, first come first served (none once it
    /// is spent).
    fn reads(&self) -> Vec<usize> {
        let mut allowance = self.options.max_prefill_tokens;
        self.running
            .iter()
            .map(|sequence| match sequence.made {
                0 => {
                    let read = sequence.feed.len().min(allowance);
                    allowance -= read;
                    read
                }
                _ => 1,
            })
            .collect()
    }

    /// Sends `token`'s text; false when the sequence is done or its client
    /// is gone, its cache given back (before its end is sent, so that a
    /// client that saw the end sees the cache free).
    fn emit(&self, sequence: &mut Sequence<M::Cache>, token: u32) -> bool {
        sequence.made += 1;
        sequence.feed.clear();
        sequence.feed.push(token);
        let end_of_text = token == self.tokenizer.end_of_text() && !sequence.ignore_eos;
        let added = match end_of_text {
            true => Added::Stopped(sequence.text.finish()),
            false => sequence.text.add(self.tokenizer.token_bytes(token)),
        };
        let (text, reason) = match added {
            Added::Stopped(text) => (text, Some(FinishReason::Stop)),
            Added::Text(text) if sequence.made >= sequence.max_tokens => {
                (text + &sequence.text.finish(), Some(FinishReason::Length))
            }
            Added::Text(text) => (text, None),
        };
        if sequence.events.send(Event::Token(text)).is_err() {
            self.budget.release(sequence.reservation);
            return false;
        }
        let Some(reason) = reason else {
            return true;
        };
        self.budget.release(sequence.reservation);
        let _ = sequence.events.send(Event::Finished {
            reason,
            completion_tokens: sequence.made,
        });
        false
    }

    /// Ends every running sequence with `message`.
    fn fail_running(&mut self, message: &str) {
        tracing::error!("the model failed a decoding step: {message}");
        for sequence in self.running.drain(..) {
            self.budget.release(sequence.reservation);
            let _ = sequence.events.send(Event::Failed(format!("decoding: {message}")));
        }
    }

    fn publish_load(&self) {
        self.load.running.store(self.running.len(), Ordering::Relaxed);
        self.stats.occupancy(
            self.running.len(),
            self.waiting.len(),
            self.budget.reserved(),
            self.budget.capacity(),
        );
    }
}

#[cfg(test)]
mod tests;
