"""The PyTorch-on-Ray side of bench/compare_lm.sh: the GPT workload of
raylet-lm (lm/examples/lm_bench.rs is the raylet side) with the same
architecture in PyTorch, each run appending one JSON line to --json.

  plain   forward, backward and AdamW steps in this one process, one thread,
          on random token ids (the baseline)
  train   Ray Train's TorchTrainer on --workers workers (DDP over gloo, one
          CPU and one torch thread each), reading the prepared Parquet rows
          through Ray Data (a random shuffle, split among the workers)
  score   Ray Data read_binary_files -> map_batches with a pool of torch
          actors (one to --actors) that score each listed file: its loss over
          windows of context + 1 tokens and a greedy continuation of its first
          lines, written as Parquet

The model is raylet-models' GPT: learned positions, pre-norm blocks, one fused
query/key/value projection, causal attention, an MLP 4x wide with exact GELU,
tied embeddings, GPT-2's initialization. The optimizer is AdamW (weight decay
0.01, eps 1e-8), a linear warmup and a cosine decay to 0.1 of the peak, the
gradients' global norm clipped to 1.0. Steps before --skip are warm-up and
left out of the figures.
"""

import argparse
import json
import math
import os
import shutil
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"tiny": (128, 4, 2), "small": (384, 6, 6), "base": (768, 12, 12)}
CONTEXT = 128
VOCAB = 8192
LEARNING_RATE = 1e-3
WARMUP_STEPS = 2
SCORING_BATCH_ROWS = 16
PROMPT_LINES = 3
NEW_TOKENS = 32


class Block(nn.Module):
    def __init__(self, d_model, n_heads, residual_std):
        super().__init__()
        self.n_heads = n_heads
        self.attention_norm = nn.LayerNorm(d_model)
        self.query_key_value = nn.Linear(d_model, 3 * d_model)
        self.output = nn.Linear(d_model, d_model)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.expand = nn.Linear(d_model, 4 * d_model)
        self.contract = nn.Linear(4 * d_model, d_model)
        for layer, std in ((self.query_key_value, 0.02), (self.output, residual_std),
                           (self.expand, 0.02), (self.contract, residual_std)):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        batch, seq, d_model = x.shape
        heads = lambda t: t.view(batch, seq, self.n_heads, d_model // self.n_heads).transpose(1, 2)
        q, k, v = self.query_key_value(self.attention_norm(x)).split(d_model, dim=2)
        attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.output(attended.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.contract(F.gelu(self.expand(self.mlp_norm(x))))


class Gpt(nn.Module):
    def __init__(self, preset):
        super().__init__()
        d_model, n_heads, n_layers = PRESETS[preset]
        self.token_embedding = nn.Embedding(VOCAB, d_model)
        self.position_embedding = nn.Parameter(torch.empty(CONTEXT, d_model))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * n_layers)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, residual_std) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(d_model)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x) @ self.token_embedding.weight.T

    def loss(self, tokens):
        logits = self.forward(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class LossModel(nn.Module):
    """The GPT whose forward is its loss, so DDP's hooks see the whole step."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens):
        return self.gpt.loss(tokens)


def learning_rate(step, steps):
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS - 1)
    return LEARNING_RATE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def optimizer_for(model):
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01, eps=1e-8)


def train_step(model, optimizer, tokens, step, steps):
    """One step of a LossModel (or DDP around one): forward, backward, the
    gradients' global norm clipped to 1.0, AdamW at the step's learning rate."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps)
    loss = model(tokens)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def peak_rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def append_json(path, line):
    line["system"] = "ray"
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)


def plain(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LossModel(Gpt(args.model))
    optimizer = optimizer_for(model)
    timed = []
    for step in range(args.steps):
        started = time.perf_counter()
        tokens = torch.randint(0, VOCAB, (args.rows, CONTEXT + 1))
        train_step(model, optimizer, tokens, step, args.steps)
        if step >= args.skip:
            timed.append(time.perf_counter() - started)
    seconds = sum(timed)
    append_json(args.json, {
        "run": "plain", "model": args.model, "workers": 1, "rows_per_worker": args.rows,
        "steps_timed": len(timed), "tokens_per_second": len(timed) * args.rows * CONTEXT / seconds,
        "step_seconds": seconds / len(timed), "peak_rss_bytes": peak_rss_bytes(),
        "torch": torch.__version__,
    })


def train_loop_per_worker(config):
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(LossModel(Gpt(config["model"])))
    optimizer = optimizer_for(model)
    shard = ray.train.get_dataset_shard("train")
    batches = iter(shard.iter_batches(batch_size=config["rows"], batch_format="numpy", drop_last=True))
    steps, skip, rows = config["steps"], config["skip"], config["rows"]
    timed = []
    for step in range(steps):
        started = time.perf_counter()
        ids = np.stack(next(batches)["ids"]).astype(np.int64)
        train_step(model, optimizer, torch.from_numpy(ids), step, steps)
        if step >= skip:
            timed.append(time.perf_counter() - started)
    peak = torch.tensor([float(peak_rss_bytes())])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    seconds = sum(timed)
    world = dist.get_world_size()
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["figures"], "w") as out:
            json.dump({
                "tokens_per_second": len(timed) * rows * world * CONTEXT / seconds,
                "step_seconds": seconds / len(timed),
                "steps_timed": len(timed),
                "peak_rss_bytes": peak.item(),
            }, out)


def train(args):
    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=args.workers + 1, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = ray.data.read_parquet(os.path.join(args.data, "train")).random_shuffle(seed=0)
    # Ray Train keeps a report's metrics only beside a checkpoint: rank 0
    # writes its figures here instead.
    figures = os.path.abspath(os.path.join(args.runs, f"figures-{os.getpid()}.json"))
    os.makedirs(args.runs, exist_ok=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"model": args.model, "steps": args.steps, "skip": args.skip, "rows": args.rows,
                           "figures": figures},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=f"lm-bench-{args.workers}-{os.getpid()}", storage_path=os.path.abspath(args.runs)),
        datasets={"train": rows},
    )
    trainer.fit()
    with open(figures) as written:
        metrics = json.load(written)
    append_json(args.json, {
        "run": "train", "model": args.model, "workers": args.workers, "rows_per_worker": args.rows,
        "steps_timed": metrics["steps_timed"], "tokens_per_second": metrics["tokens_per_second"],
        "step_seconds": metrics["step_seconds"], "peak_rss_bytes": metrics["peak_rss_bytes"],
        "torch": torch.__version__, "ray": ray.__version__,
    })
    ray.shutdown()


class ScoreFiles:
    """A Ray Data actor: scores a batch of files as raylet-lm's score_files does."""

    def __init__(self, tokenizer_json, model):
        from tokenizers import Tokenizer

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.tokenizer = Tokenizer.from_file(tokenizer_json)
        self.eot = self.tokenizer.token_to_id("<|endoftext|>")
        self.model = Gpt(model).eval()

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def text_loss(self, text):
        ids = self.encode(text) + [self.eot]
        window = CONTEXT + 1
        windows = [ids[start:start + window] for start in range(0, max(len(ids) - 1, 0), window - 1)]
        whole = [w for w in windows if len(w) == window]
        tail = [w for w in windows if len(w) < window]
        batches = [whole[i:i + SCORING_BATCH_ROWS] for i in range(0, len(whole), SCORING_BATCH_ROWS)]
        batches += [[w] for w in tail]
        total, predicted = 0.0, 0
        for batch in batches:
            tokens = sum(len(w) - 1 for w in batch)
            total += self.model.loss(torch.tensor(batch)).item() * tokens
            predicted += tokens
        return predicted, total / max(predicted, 1)

    def continue_text(self, prompt):
        ids = self.encode(prompt) or [self.eot]
        prompt_length = len(ids)
        for _ in range(NEW_TOKENS):
            window = ids[-CONTEXT:]
            logits = self.model(torch.tensor([window]))
            ids.append(int(logits[0, -1].argmax()))
        return self.tokenizer.decode(ids[prompt_length:])

    def __call__(self, batch):
        out = {"path": [], "tokens": [], "loss": [], "prompt": [], "continuation": []}
        with torch.inference_mode():
            for path, data in zip(batch["path"], batch["bytes"]):
                text = bytes(data).decode("utf-8")
                predicted, loss = self.text_loss(text)
                prompt = "".join(text.splitlines(keepends=True)[:PROMPT_LINES])
                out["path"].append(path)
                out["tokens"].append(predicted)
                out["loss"].append(loss)
                out["prompt"].append(prompt)
                out["continuation"].append(self.continue_text(prompt))
        return out


def score(args):
    import pyarrow.parquet as pq
    import ray
    import ray.data

    ray.init(num_cpus=args.actors + 1, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with open(args.files) as listing:
        paths = [line.strip() for line in listing if line.strip()]
    shutil.rmtree(args.out, ignore_errors=True)
    started = time.perf_counter()
    (ray.data.read_binary_files(paths, include_paths=True)
        .map_batches(ScoreFiles, fn_constructor_args=(os.path.join(args.data, "tokenizer.json"), args.model),
                     batch_size=8, concurrency=(1, args.actors), num_cpus=1)
        .write_parquet(args.out))
    seconds = time.perf_counter() - started
    table = pq.read_table(args.out)
    tokens = int(sum(table.column("tokens").to_pylist()))
    append_json(args.json, {
        "run": "score", "actors": args.actors, "files": table.num_rows, "tokens": tokens,
        "generated_per_file": NEW_TOKENS, "seconds": seconds, "tokens_per_second": tokens / seconds,
        "torch": torch.__version__, "ray": ray.__version__,
    })
    ray.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", choices=["plain", "train", "score"])
    parser.add_argument("--json", required=True, help="the file each run appends its JSON line to")
    parser.add_argument("--data", default="target/gpt-example/data", help="the corpus lm_bench prepared")
    parser.add_argument("--model", default="small", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps, warm-up included")
    parser.add_argument("--skip", type=int, default=2, help="steps left out of the figures")
    parser.add_argument("--rows", type=int, default=8, help="rows of context + 1 tokens per worker per step")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers, one CPU each")
    parser.add_argument("--runs", default="target/bench/lm/ray-runs", help="Ray Train's storage path")
    parser.add_argument("--files", help="score: the files to score, a path per line")
    parser.add_argument("--actors", type=int, default=2, help="score: the most scoring actors, one CPU each")
    parser.add_argument("--out", default="target/bench/lm/ray-scores", help="score: where the Parquet goes")
    args = parser.parse_args()
    {"plain": plain, "train": train, "score": score}[args.run](args)


if __name__ == "__main__":
    main()
