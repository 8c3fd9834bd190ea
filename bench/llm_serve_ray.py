"""Ray Serve's side of bench/compare_llm_serve.sh: raylet-llm's GPT in
PyTorch, served by Ray Serve 2.60 with an OpenAI-compatible
`POST /v1/completions`, batched with `@serve.batch` (static batching, Ray
Serve's documented way to batch a model without vLLM).

The model is the GPT of bench/lm_torch.py (pre-norm blocks, one fused
query/key/value projection, causal attention, an MLP with exact GELU,
learned positions, tied embeddings), read from the safetensors file that
raylet's `export_gpt` writes (PyTorch's layout, the parameter names below;
`__metadata__["config"]` holds the shape as JSON). The tokenizer is the
Hugging Face `tokenizers` JSON beside the checkpoint.

Requests: `model`, `prompt` (one string), `max_tokens` (default 16),
`temperature` (default 1.0; 0 is greedy), `top_p` (default 1.0), `seed`,
`stream`, `ignore_eos` (vLLM's extension: keep generating past
<|endoftext|>), `stream_options.include_usage`. A request needs
`Authorization: Bearer <key>`. A prompt longer than the context is refused
with 400; a completion stops when the context is full (every token fed to
the model has a position below the context), with finish_reason "length".

Batching: `@serve.batch(max_batch_size, batch_wait_timeout_s)` on an
async generator method, the streaming pattern of Ray Serve's batching guide:
the method gets the list of requests of a batch and yields, per decoding
step, a list with one item per request (StopIteration for a request that has
ended). A batch's prompts are left-padded to its longest, with an attention
mask and per-row position ids; one forward pass per step for the whole batch,
with a key/value cache. That is static batching: a batch runs until its
longest member is done (rows that ended still take part in every step), and
requests that arrive meanwhile wait for a later batch: at most one batch runs
at a time (`max_concurrent_batches=1`, the default), and Ray's queue closes
the next batch (at max_batch_size requests, or batch_wait_timeout_s after its
first) while the running one still runs. --max-batch-size and
--batch-wait-timeout-s set the two (defaults 16 and 0.05). Each step runs on
one worker thread of the replica so that its event loop keeps streaming.

`GET /v1/batch_stats` (with the key) answers the replica's counters since it
started: batches, requests, decoding steps, rows computed (row_steps) and
rows computed for a request still generating (live_row_steps).

Streaming answers are server-sent events in OpenAI's format, one event per
generated token with its text (as raylet's server: a token that ends inside
a UTF-8 character sends nothing, its bytes go out with the next), the last
token's event carrying finish_reason, the usage when
`stream_options.include_usage` asks, then `data: [DONE]`.

  # serve (prints `ready http://127.0.0.1:PORT` once it answers; SIGTERM or SIGINT stop it)
  target/bench-venv/bin/python bench/llm_serve_ray.py serve --weights W.safetensors \\
      --tokenizer target/gpt-example/data/tokenizer.json --model gpt --port 8000 --token-file KEY
  # random weights of a preset shape (the exporter's names and metadata)
  target/bench-venv/bin/python bench/llm_serve_ray.py random-weights --shape tiny --out W.safetensors
  # greedy continuation of a prompt, no server
  target/bench-venv/bin/python bench/llm_serve_ray.py generate --weights W.safetensors \\
      --tokenizer T.json --prompt 'def main():' --max-tokens 32
  # checks: cached decoding equals a full forward, a padded batch equals each prompt alone
  target/bench-venv/bin/python bench/llm_serve_ray.py selftest
"""

import argparse
import asyncio
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F

# The presets of raylet-models' GPT that this benchmark uses.
SHAPES = {
    "tiny": {"vocab_size": 8192, "context_length": 128, "d_model": 128, "n_heads": 4, "n_layers": 2, "mlp_ratio": 4},
    "small": {"vocab_size": 8192, "context_length": 256, "d_model": 384, "n_heads": 6, "n_layers": 6, "mlp_ratio": 4},
}
END_OF_TEXT = "<|endoftext|>"
# Compact JSON in the events, as OpenAI sends it.
SSE_JSON = (",", ":")


# ---------------------------------------------------------------- the model


class Attention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.query_key_value = nn.Linear(d_model, 3 * d_model)
        self.output = nn.Linear(d_model, d_model)

    def forward(self, x, mask, cache=None, start=0):
        """x [b, s, d]; mask [b, 1, s, keys] (True: attend). With cache
        ((k, v), each [b, heads, capacity, head_dim]), this step's keys and
        values go to slots start..start+s and the queries attend to slots
        0..start+s; without, to the s positions of x."""
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.query_key_value(x).split(d_model, dim=2)
        heads = lambda t: t.reshape(batch, seq, self.n_heads, head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        if cache is not None:
            keys, values = cache
            keys[:, :, start:start + seq] = k
            values[:, :, start:start + seq] = v
            k, v = keys[:, :, :start + seq], values[:, :, :start + seq]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.output(attended.transpose(1, 2).reshape(batch, seq, d_model))


class Mlp(nn.Module):
    def __init__(self, d_model, mlp_ratio):
        super().__init__()
        self.expand = nn.Linear(d_model, mlp_ratio * d_model)
        self.contract = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x):
        return self.contract(F.gelu(self.expand(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_heads, mlp_ratio):
        super().__init__()
        self.attention_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.attention = Attention(d_model, n_heads)
        self.mlp_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = Mlp(d_model, mlp_ratio)

    def forward(self, x, mask, cache=None, start=0):
        x = x + self.attention(self.attention_norm(x), mask, cache, start)
        return x + self.mlp(self.mlp_norm(x))


class Gpt(nn.Module):
    """Parameter names and shapes as raylet's exporter writes them."""

    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        d_model = config["d_model"]
        self.context = config["context_length"]
        self.n_heads = config["n_heads"]
        self.token_embedding = nn.Embedding(config["vocab_size"], d_model)
        self.position_embedding = nn.Parameter(torch.zeros(self.context, d_model))
        self.blocks = nn.ModuleList(Block(d_model, config["n_heads"], config["mlp_ratio"])
                                    for _ in range(config["n_layers"]))
        self.final_norm = nn.LayerNorm(d_model, eps=1e-5)

    def logits(self, states):
        return self.final_norm(states) @ self.token_embedding.weight.T

    def forward(self, tokens):
        """Logits [b, s, vocab] of token ids [b, s] at positions 0..s (no cache)."""
        seq = tokens.shape[1]
        x = self.token_embedding(tokens) + self.position_embedding[:seq]
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        for block in self.blocks:
            x = block(x, causal)
        return self.logits(x)

    def new_cache(self, batch, capacity):
        d_model = self.token_embedding.weight.shape[1]
        shape = (batch, self.n_heads, capacity, d_model // self.n_heads)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.blocks]

    def step(self, tokens, positions, mask, cache, start):
        """One cached forward of tokens [b, s] at positions [b, s], written to
        cache slots start..start+s; the logits of each row's last one, [b, vocab]."""
        x = self.token_embedding(tokens) + self.position_embedding[positions]
        for block, layer_cache in zip(self.blocks, cache):
            x = block(x, mask, layer_cache, start)
        return self.logits(x[:, -1])


def read_config(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    if "config" not in metadata:
        raise SystemExit(f"{path}: no `config` in the safetensors metadata")
    return json.loads(metadata["config"])


def load_model(path):
    from safetensors.torch import load_file

    model = Gpt(read_config(path))
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def write_random_weights(shape, out, seed=0):
    """A file as raylet's exporter writes one: GPT-2's initialization of the
    preset `shape` (or of a config dict), seeded."""
    from safetensors.torch import save_file

    config = SHAPES[shape] if isinstance(shape, str) else shape
    torch.manual_seed(seed)
    model = Gpt(config)
    residual_std = 0.02 / math.sqrt(2 * config["n_layers"])
    with torch.no_grad():
        nn.init.normal_(model.token_embedding.weight, std=0.02)
        nn.init.normal_(model.position_embedding, std=0.02)
        for block in model.blocks:
            for layer, std in ((block.attention.query_key_value, 0.02), (block.attention.output, residual_std),
                               (block.mlp.expand, 0.02), (block.mlp.contract, residual_std)):
                nn.init.normal_(layer.weight, std=std)
                nn.init.zeros_(layer.bias)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save_file(tensors, out, metadata={"config": json.dumps(config)})
    return out


# ---------------------------------------------------------------- a static batch


class Sampler:
    """Greedy at temperature 0, else temperature and top-p with its own seeded generator."""

    def __init__(self, temperature, top_p, seed):
        self.temperature = temperature
        self.top_p = top_p
        self.generator = None
        if temperature > 0:
            self.generator = torch.Generator()
            self.generator.manual_seed(seed if seed is not None else secrets.randbits(63))

    def __call__(self, logits):
        if self.temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # The smallest set of most likely tokens whose mass reaches top_p.
            keep = (sorted_probs.cumsum(0) - sorted_probs) < self.top_p
            keep[0] = True
            sorted_probs = sorted_probs * keep
            choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=self.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))


class StaticBatch:
    """The requests of one batch, decoded together until the longest is done.

    Each request is a dict with `ids` (the prompt's token ids, at most the
    context), `max_new` (tokens to generate, at least 1), `temperature`,
    `top_p`, `seed`, `ignore_eos`. step() returns one item per request:
    {"token": id, "finish_reason": None | "length" | "stop"} for the token it
    generated this step, or None once it has ended.
    """

    def __init__(self, model, requests, eot):
        self.model, self.eot = model, eot
        self.requests = requests
        rows = len(requests)
        lengths = [len(r["ids"]) for r in requests]
        self.lengths = torch.tensor(lengths)
        self.padded = max(lengths)
        self.max_new = [r["max_new"] for r in requests]
        self.capacity = self.padded + max(self.max_new)
        # Left padding: each prompt ends at slot padded - 1.
        ids = torch.zeros(rows, self.padded, dtype=torch.long)
        self.valid = torch.zeros(rows, self.capacity, dtype=torch.bool)
        for row, r in enumerate(requests):
            ids[row, self.padded - lengths[row]:] = torch.tensor(r["ids"])
            self.valid[row, self.padded - lengths[row]:] = True
        self.prompt_ids = ids
        self.samplers = [Sampler(r["temperature"], r["top_p"], r.get("seed")) for r in requests]
        self.generated = [0] * rows
        self.finished = [False] * rows
        self.cache = None
        self.last = None
        self.steps = 0

    @property
    def done(self):
        return all(self.finished)

    def _sample(self, logits):
        out = []
        for row, sampler in enumerate(self.samplers):
            if self.finished[row]:
                out.append(None)
                continue
            token = sampler(logits[row])
            self.generated[row] += 1
            reason = None
            if token == self.eot and not self.requests[row]["ignore_eos"]:
                reason = "stop"
            elif self.generated[row] >= self.max_new[row]:
                reason = "length"
            self.finished[row] = reason is not None
            out.append({"token": token, "finish_reason": reason})
        self.last = torch.tensor([item["token"] if item else 0 for item in out]).unsqueeze(1)
        return out

    @torch.inference_mode()
    def step(self):
        rows = len(self.requests)
        slots = torch.arange(self.capacity)
        if self.cache is None:
            # Prefill: the padded prompts in one pass. A padding slot attends to
            # itself only (a row of all-masked keys would give NaN).
            self.cache = self.model.new_cache(rows, self.capacity)
            positions = (self.valid[:, :self.padded].long().cumsum(1) - 1).clamp(min=0)
            query = slots[:self.padded].view(1, -1, 1)
            key = slots[:self.padded].view(1, 1, -1)
            mask = ((key <= query) & self.valid[:, None, :self.padded]) | (key == query)
            logits = self.model.step(self.prompt_ids, positions, mask.unsqueeze(1), self.cache, 0)
        else:
            # Decode: every row's last token at slot padded + steps - 1; rows
            # that have ended still compute (static batching), at a clamped position.
            slot = self.padded + self.steps - 1
            positions = (self.lengths + self.steps - 1).clamp(max=self.model.context - 1).unsqueeze(1)
            mask = self.valid[:, :slot + 1].clone()
            mask[:, slot] = True
            logits = self.model.step(self.last, positions, mask.view(rows, 1, 1, -1), self.cache, slot)
        self.steps += 1
        return self._sample(logits)


class Detokenizer:
    """Text per generated token: what decoding the completion so far adds,
    held back while it ends inside a UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids = []
        self.sent = 0

    def push(self, token, last=False):
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd") and not last:
            return ""
        new, self.sent = text[self.sent:], len(text)
        return new


# ---------------------------------------------------------------- the Ray Serve application


class CompletionError(Exception):
    def __init__(self, status, message, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def parse_request(body, tokenizer, context, model_name):
    if not isinstance(body, dict):
        raise CompletionError(400, "the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise CompletionError(400, "`prompt` must be one string")
    if body.get("model") not in (None, model_name):
        raise CompletionError(404, f"the model `{body.get('model')}` does not exist", "not_found_error")
    try:
        max_tokens = int(body.get("max_tokens") if body.get("max_tokens") is not None else 16)
        temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
        seed = body.get("seed")
        seed = int(seed) if seed is not None else None
    except (TypeError, ValueError) as e:
        raise CompletionError(400, f"bad parameter: {e}")
    if max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise CompletionError(400, "need max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    if not ids:
        raise CompletionError(400, "the prompt is empty")
    if len(ids) > context:
        raise CompletionError(400, f"the prompt has {len(ids)} tokens, more than the model's context of {context}")
    options = body.get("stream_options") or {}
    return {
        "ids": ids,
        # Every token fed to the model has a position below the context.
        "max_new": min(max_tokens, context + 1 - len(ids)),
        "temperature": temperature, "top_p": top_p, "seed": seed,
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "stream": bool(body.get("stream", False)),
        "include_usage": bool(options.get("include_usage", False)) if isinstance(options, dict) else False,
    }


def build_app(args, api_key):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse

    @serve.deployment(num_replicas=1, max_ongoing_requests=args.max_ongoing_requests,
                      ray_actor_options={"num_cpus": 0})
    class GptCompletions:
        def __init__(self, weights, tokenizer_path, model_name, api_key, threads, max_batch_size,
                     batch_wait_timeout_s):
            from tokenizers import Tokenizer

            torch.set_num_threads(threads)
            self.model = load_model(weights)
            self.context = self.model.context
            self.tokenizer = Tokenizer.from_file(tokenizer_path)
            self.eot = self.tokenizer.token_to_id(END_OF_TEXT)
            self.model_name = model_name
            self.api_key = api_key
            # One thread runs the forward passes, so the replica's event loop
            # keeps streaming tokens and taking requests meanwhile.
            self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpt-step")
            self.generate.set_max_batch_size(max_batch_size)
            self.generate.set_batch_wait_timeout_s(batch_wait_timeout_s)
            # What GET /v1/batch_stats answers: batches run, their requests,
            # decoding steps, rows computed and rows computed for a request
            # still generating.
            self.stats = {"batches": 0, "requests": 0, "steps": 0, "row_steps": 0, "live_row_steps": 0}

        @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.05)
        async def generate(self, requests):
            """The batched generator: one list per decoding step, an item per request."""
            loop = asyncio.get_running_loop()
            batch = StaticBatch(self.model, requests, self.eot)
            self.stats["batches"] += 1
            self.stats["requests"] += len(requests)
            while not batch.done:
                self.stats["steps"] += 1
                self.stats["row_steps"] += len(requests)
                self.stats["live_row_steps"] += batch.finished.count(False)
                items = await loop.run_in_executor(self.compute, batch.step)
                yield [item if item is not None else StopIteration for item in items]

        async def tokens(self, request):
            """(token id, text, finish_reason) per generated token of one request."""
            detokenizer = Detokenizer(self.tokenizer)
            async for item in self.generate(request):
                last = item["finish_reason"] is not None
                yield item["token"], detokenizer.push(item["token"], last), item["finish_reason"]
                if last:
                    return

        def chunk(self, completion_id, created, text, finish_reason):
            return {"id": completion_id, "object": "text_completion", "created": created, "model": self.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}

        async def stream(self, request, completion_id, created):
            generated = 0
            async for _, text, finish_reason in self.tokens(request):
                generated += 1
                if not text and finish_reason is None:
                    continue  # held back inside a UTF-8 character, sent with the next token (as raylet does)
                yield f"data: {json.dumps(self.chunk(completion_id, created, text, finish_reason), separators=SSE_JSON)}\n\n"
            if request["include_usage"]:
                prompt = len(request["ids"])
                usage = {"id": completion_id, "object": "text_completion", "created": created,
                         "model": self.model_name, "choices": [],
                         "usage": {"prompt_tokens": prompt, "completion_tokens": generated,
                                   "total_tokens": prompt + generated}}
                yield f"data: {json.dumps(usage, separators=SSE_JSON)}\n\n"
            yield "data: [DONE]\n\n"

        async def __call__(self, http: Request):
            path = http.url.path.rstrip("/")
            if path not in ("/v1/completions", "/v1/batch_stats"):
                return error(404, f"no route {http.url.path}", "not_found_error")
            if http.headers.get("authorization", "") != f"Bearer {self.api_key}":
                return error(401, "a valid `Authorization: Bearer <key>` header is needed", "authentication_error")
            if path == "/v1/batch_stats":
                return JSONResponse(self.stats)
            if http.method != "POST":
                return error(405, "use POST", "invalid_request_error")
            try:
                try:
                    body = await http.json()
                except Exception:
                    raise CompletionError(400, "the body is not JSON")
                request = parse_request(body, self.tokenizer, self.context, self.model_name)
            except CompletionError as e:
                return error(e.status, e.message, e.kind)
            completion_id = f"cmpl-{uuid.uuid4().hex}"
            created = int(time.time())
            if request["stream"]:
                return StreamingResponse(self.stream(request, completion_id, created), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            pieces, finish_reason = [], None
            async for _, text, finish_reason in self.tokens(request):
                pieces.append(text)
            prompt = len(request["ids"])
            answer = self.chunk(completion_id, created, "".join(pieces), finish_reason)
            answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(pieces),
                               "total_tokens": prompt + len(pieces)}
            return JSONResponse(answer)

    def error(status, message, kind):
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                            status_code=status)

    return GptCompletions.bind(os.path.abspath(args.weights), os.path.abspath(args.tokenizer), args.model, api_key,
                               args.threads, args.max_batch_size, args.batch_wait_timeout_s)


def wait_until_answering(port, api_key, model, timeout=300.0):
    import urllib.error
    import urllib.request

    body = json.dumps({"model": model, "prompt": "def", "max_tokens": 1, "temperature": 0}).encode()
    deadline = time.time() + timeout
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {api_key}"})
            with urllib.request.urlopen(req, timeout=30) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            if time.time() > deadline:
                raise
        time.sleep(0.5)


def serve_main(args):
    import ray
    from ray import serve

    if args.random_weights:
        args.weights = write_random_weights(args.random_weights, args.weights or os.path.join(
            "target", "bench", "llm_serve", f"random-{args.random_weights}.safetensors"))
    if not args.weights:
        raise SystemExit("give --weights FILE or --random-weights SHAPE")
    api_key = args.api_key or secrets.token_hex(16)
    if args.token_file:
        with open(args.token_file, "w") as f:
            f.write(api_key + "\n")
        os.chmod(args.token_file, 0o600)
    init = {"num_cpus": args.num_cpus, "include_dashboard": False, "log_to_driver": False}
    if args.temp_dir:
        init["_temp_dir"] = os.path.abspath(args.temp_dir)
    ray.init(**init)
    # After ray.init, which installs its own SIGTERM handler (it logs and dies).
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(build_app(args, api_key), name="llm", route_prefix="/v1")
        wait_until_answering(args.port, api_key, args.model)
        print(f"ready http://127.0.0.1:{args.port}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


# ---------------------------------------------------------------- without a server


def generate_main(args):
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    model = load_model(args.weights)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    eot = tokenizer.token_to_id(END_OF_TEXT)
    ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
    batch = StaticBatch(model, [{"ids": ids, "max_new": min(args.max_tokens, model.context + 1 - len(ids)),
                                 "temperature": 0.0, "top_p": 1.0, "seed": None, "ignore_eos": True}], eot)
    tokens = []
    while not batch.done:
        tokens.append(batch.step()[0]["token"])
    print(json.dumps({"config": model.config, "prompt_tokens": ids, "tokens": tokens,
                      "text": tokenizer.decode(tokens)}))


def selftest_main(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = dict(SHAPES["tiny"], vocab_size=512, context_length=64)
    model = Gpt(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    model.eval()
    eot = 3
    prompts = [[5, 9, 17, 33, 2, 8, 100], [7], [40, 41, 42, 43], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    max_new = [10, 25, 3, 64 + 1 - 12]
    # Greedy generation alone and in a left-padded batch give the same tokens.
    alone = []
    for ids, n in zip(prompts, max_new):
        batch = StaticBatch(model, [{"ids": ids, "max_new": n, "temperature": 0.0, "top_p": 1.0,
                                     "ignore_eos": True}], eot)
        out = []
        while not batch.done:
            out.append(batch.step()[0]["token"])
        alone.append(out)
    batch = StaticBatch(model, [{"ids": ids, "max_new": n, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}
                                for ids, n in zip(prompts, max_new)], eot)
    together = [[] for _ in prompts]
    while not batch.done:
        for row, item in enumerate(batch.step()):
            if item is not None:
                together[row].append(item["token"])
    assert together == alone, (together, alone)
    assert [len(t) for t in alone] == max_new
    # Cached greedy decoding equals recomputing the whole sequence each step.
    with torch.inference_mode():
        for ids, out in zip(prompts, alone):
            seq = list(ids)
            for token in out:
                assert int(model(torch.tensor([seq]))[0, -1].argmax()) == token
                seq.append(token)
    # Sampling with a seed repeats; top_p=tiny is greedy.
    runs = []
    for _ in range(2):
        b = StaticBatch(model, [{"ids": prompts[0], "max_new": 12, "temperature": 1.0, "top_p": 0.9, "seed": 7,
                                 "ignore_eos": True}], eot)
        runs.append([b.step()[0]["token"] for _ in range(12)])
    assert runs[0] == runs[1]
    b = StaticBatch(model, [{"ids": prompts[0], "max_new": 10, "temperature": 1.0, "top_p": 1e-6, "seed": 1,
                             "ignore_eos": True}], eot)
    assert [b.step()[0]["token"] for _ in range(10)] == alone[0]
    print("selftest passed: batched == alone, cached == full forward, seeded sampling repeats")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve /v1/completions with Ray Serve")
    s.add_argument("--weights", help="the safetensors file (export_gpt's output)")
    s.add_argument("--random-weights", choices=sorted(SHAPES),
                   help="write random weights of this shape (to --weights, or target/bench/llm_serve/) and serve them")
    s.add_argument("--tokenizer", required=True, help="the tokenizers JSON")
    s.add_argument("--model", default="gpt", help="the model name requests give")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="the bearer key (default: a random one)")
    s.add_argument("--token-file", help="write the key to this file")
    s.add_argument("--max-batch-size", type=int, default=16)
    s.add_argument("--batch-wait-timeout-s", type=float, default=0.05)
    s.add_argument("--max-ongoing-requests", type=int, default=256,
                   help="requests a replica takes at once (Ray's default is 5; the others queue in Ray's router)")
    s.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
                   help="torch threads in the replica (default: OMP_NUM_THREADS, else every core)")
    s.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1, help="ray.init(num_cpus=...)")
    s.add_argument("--temp-dir", help="Ray's temp dir (default Ray's own)")
    w = sub.add_parser("random-weights", help="write random weights of a preset shape")
    w.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("generate", help="a greedy continuation, without a server")
    g.add_argument("--weights", required=True)
    g.add_argument("--tokenizer", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--threads", type=int, default=1)
    t = sub.add_parser("selftest", help="check the batched, cached decoding against full forwards")
    t.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.command == "serve":
        serve_main(args)
    elif args.command == "random-weights":
        print(write_random_weights(args.shape, args.out, args.seed))
    elif args.command == "generate":
        generate_main(args)
    else:
        selftest_main(args)


if __name__ == "__main__":
    sys.exit(main())
