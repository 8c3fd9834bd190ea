#!/usr/bin/env python3
"""Serving a language model: raylet-llm's `llm_serve` (continuous batching)
against the same weights in PyTorch served by Ray Serve 2.60 with
`@serve.batch` (static batching; bench/llm_serve_ray.py), both OpenAI-
compatible, loaded by bench/llm_load.py; writes bench/llm_serve.md and
target/bench/llm_serve/results.json.

Run it through bench/compare_llm_serve.sh, which checks the raylet build,
sets up target/bench-venv and exports the checkpoint to safetensors first.
This driver uses only the standard library (the system python runs it); the
load generator and Ray's server run with the venv's python.

Each repetition starts one side's server (its own session; the line `ready
http://127.0.0.1:PORT` says it serves, the API key is in its token file),
sends one greedy request (to compare the two sides' outputs), runs the load
generator at each concurrency in turn, then stops the server with SIGTERM
and ends by pid whatever it left. The sides take turns, the order rotated by
one each repetition. Both servers get the same CPUs: they run under
`taskset -c 0-(T-1)` with T compute threads (RAYON_NUM_THREADS,
OMP_NUM_THREADS, MKL_NUM_THREADS = T; Ray's replica also calls
torch.set_num_threads(T), and ray.init gets num_cpus=T); the load generator
is not pinned.

  python3 bench/compare_llm_serve.py --raylet target/release/examples/llm_serve \\
      --checkpoint DIR --weights FILE.safetensors [--reps 2] [--concurrency 1,16,64]
  python3 bench/compare_llm_serve.py --ray-only --weights FILE --tokenizer T.json --quick   # Ray's side alone
  python3 bench/compare_llm_serve.py --report-from target/bench/llm_serve/results.json
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchlib import ENV, PY, ROOT, WORK, log, machine_info, now_utc, run_line, stop_leftovers

RUNS = WORK / "llm_serve"
REPORT = ROOT / "bench" / "llm_serve.md"
QUICK_REPORT = WORK / "llm_serve-quick.md"
RESULTS = RUNS / "results.json"
SIDES = {"raylet": "raylet (`llm_serve`)", "ray": "Ray Serve + PyTorch"}
GREEDY_PROMPT = "import os\nimport sys\n\n\ndef main():\n"
GREEDY_TOKENS = 32
# The goal this benchmark measures against (at GOAL_CONCURRENCY).
GOAL_CONCURRENCY = 16
GOAL_TOKENS_RATIO = 5.0
GOAL_TTFT_P99_RATIO = 0.2


def safetensors_config(path):
    """The `config` JSON of a safetensors file's __metadata__, read without safetensors."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return json.loads(header["__metadata__"]["config"])


# ---------------------------------------------------------------- servers


class Server:
    """One side's server in its own session; its output goes to a log file."""

    def __init__(self, side, args, port, rep):
        self.side, self.port = side, port
        self.token_file = RUNS / f"{side}.key"
        self.token_file.unlink(missing_ok=True)
        self.log_path = RUNS / f"{side}-server.log"
        self.temp_dir = f"/tmp/rayllm{os.getpid()}r{rep}"
        cpus = f"0-{args.threads - 1}"
        if side == "raylet":
            cmd = [args.raylet, "--checkpoint", args.checkpoint, "--model", args.model, "--port", str(port),
                   "--token-file", str(self.token_file)] + args.raylet_args.split()
        else:
            cmd = [str(PY), str(ROOT / "bench" / "llm_serve_ray.py"), "serve", "--weights", args.weights,
                   "--tokenizer", args.tokenizer, "--model", args.model, "--port", str(port),
                   "--token-file", str(self.token_file), "--threads", str(args.ray_threads or args.threads),
                   "--num-cpus", str(args.threads), "--max-batch-size", str(args.max_batch_size),
                   "--batch-wait-timeout-s", str(args.batch_wait_timeout_s), "--temp-dir", self.temp_dir]
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", cpus] + cmd
        env = dict(ENV, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
                   MKL_NUM_THREADS=str(args.threads), RAY_USAGE_STATS_ENABLED="0")
        self.ready = threading.Event()
        self.log = open(self.log_path, "a")
        self.log.write(f"=== {now_utc()} {' '.join(map(str, cmd))}\n")
        self.log.flush()
        self.proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + args.start_timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{side}: the server did not say `ready` (see {self.log_path}):\n{self.tail()}")
        self.api_key = self.token_file.read_text().strip()
        self.url = f"http://127.0.0.1:{port}"

    def _drain(self):
        # Reads the server's output to the end, so that it never blocks on a full pipe.
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith("ready http"):
                self.ready.set()

    def tail(self, lines=20):
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        stop_leftovers(f"{self.side} server", {self.proc.pid}, markers=[self.temp_dir])
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def post(server, path, body):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(req, timeout=300) as answer:
        return json.loads(answer.read())


def batch_stats(server):
    """Ray's replica counters (GET /v1/batch_stats); None where the server has none."""
    req = urllib.request.Request(server.url + "/v1/batch_stats", headers={"Authorization": f"Bearer {server.api_key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def greedy(server, args):
    try:
        answer = post(server, "/v1/completions", {"model": args.model, "prompt": GREEDY_PROMPT,
                                                  "max_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True})
        return {"text": answer["choices"][0]["text"], "usage": answer.get("usage")}
    except Exception as e:  # reported, not fatal: the load shows whether the server works
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def load(server, args, concurrency, rep):
    requests = max(args.min_requests, args.rounds * concurrency)
    cmd = [str(PY), str(ROOT / "bench" / "llm_load.py"), "--url", server.url, "--api-key-file",
           str(server.token_file), "--model", args.model, "--tokenizer", args.tokenizer, "--context",
           str(args.context), "--concurrency", str(concurrency), "--requests", str(requests), "--warmup", "1",
           "--label", server.side, "--json", str(RUNS / "runs.jsonl")]
    before = batch_stats(server) if server.side == "ray" else None
    out = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=args.load_timeout)
    if not out.stdout.strip():
        raise RuntimeError(f"{server.side} c={concurrency}: the load generator printed nothing:\n{out.stderr[-3000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    after = batch_stats(server) if server.side == "ray" else None
    if before and after:
        figures["batches"] = {k: after[k] - before[k] for k in after}
    figures.update(side=server.side, rep=rep)
    return figures


def run_side(side, args, rep, results):
    server = Server(side, args, args.port, rep)
    try:
        results["greedy"].setdefault(side, greedy(server, args))
        for concurrency in args.concurrency:
            figures = load(server, args, concurrency, rep)
            log(f"rep {rep} {side:6} c={concurrency:<3} {figures['output_tokens_per_s']:8.1f} tokens/s "
                f"TTFT p50 {fmt_ms(figures['ttft_p50_ms'])} p99 {fmt_ms(figures['ttft_p99_ms'])} "
                f"ITL p50 {fmt_ms(figures['itl_p50_ms'])} p99 {fmt_ms(figures['itl_p99_ms'])} "
                f"errors {figures['errors'] + figures['warmup_errors']}")
            results["runs"].append(figures)
            RESULTS.write_text(json.dumps(results, indent=1))
    finally:
        server.stop()


# ---------------------------------------------------------------- report


def fmt_ms(v):
    if v is None:
        return "—"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 10:
        return f"{v:.1f} ms"
    return f"{v:.2f} ms"


def fmt_ratio(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:,.0f}×"
    if x >= 1:
        return f"{x:.1f}×"
    return f"{x:.2g}×"


def medians(runs, side, concurrency, key):
    values = [r[key] for r in runs if r["side"] == side and r["concurrency"] == concurrency and r.get(key) is not None]
    return (statistics.median(values) if values else None), values


def ratio_text(runs, concurrency, key):
    """raylet's median over Ray's, with the min–max of the per-repetition ratios."""
    ours, theirs = medians(runs, "raylet", concurrency, key)[0], medians(runs, "ray", concurrency, key)[0]
    if not ours or not theirs:
        return "—", None
    pairs = {}
    for r in runs:
        if r["concurrency"] == concurrency and r.get(key):
            pairs.setdefault(r["rep"], {})[r["side"]] = r[key]
    per = [p["raylet"] / p["ray"] for p in pairs.values() if "raylet" in p and "ray" in p]
    ratio = ours / theirs
    text = fmt_ratio(ratio)
    if len(per) > 1:
        text += f" ({fmt_ratio(min(per))[:-1]}–{fmt_ratio(max(per))})"
    return text, ratio


def what_differs(side, concurrency, info):
    """The row's column: what its side does differently at this concurrency
    (the bullets above the table say what each side is)."""
    size, wait = info["max_batch_size"], info["batch_wait_timeout_s"]
    if side == "ray":
        if concurrency == 1:
            return f"static batching: a lone request still waits out the {wait * 1e3:g} ms batch timeout"
        if concurrency <= size:
            return ("static batches: each fixed when it forms, run until its longest member ends; a request "
                    "arriving meanwhile waits for a later batch")
        return (f"static batches of at most {size}, one at a time: {concurrency - size} or more requests wait "
                "for later batches")
    if concurrency == 1:
        return "continuous batching: no batch wait"
    return "continuous batching: a request joins the running batch at the next step and leaves it when done"


def events_note(runs):
    """Text events per generated token, by side, over all runs."""
    parts = []
    for side in ("raylet", "ray"):
        done = [r for r in runs if r["side"] == side and r.get("events_per_token")]
        if done:
            tokens = sum(r["output_tokens"] for r in done)
            events = sum(r["events_per_token"] * r["output_tokens"] for r in done)
            parts.append(f"{SIDES[side]}: {events / tokens:.3f} events per token")
    return "; ".join(parts) or "events per token not recorded"


def report(results, path=None):
    path = Path(path or results["report"])
    info, runs = results["info"], results["runs"]
    sides = [s for s in ("raylet", "ray") if any(r["side"] == s for r in runs)]
    concurrencies = sorted({r["concurrency"] for r in runs})
    vers = info["versions"]
    lines = [
        run_line(info, "compare_llm_serve.sh") + ": serving a GPT OpenAI-compatibly (`POST /v1/completions`, "
        "server-sent events, one event per token), raylet's `llm_serve` (continuous batching) against the same "
        f"weights in PyTorch served by Ray Serve {vers.get('ray', '?')} with `@serve.batch` (static batching, "
        "Ray Serve's documented way to batch a model without vLLM; `bench/llm_serve_ray.py`). "
        f"{info['reps']} repetition(s), the sides taking turns; a value is the median over the repetitions.\n",
        f"- **Model:** {info['model_desc']}; "
        + ("raylet serves the checkpoint, Ray the safetensors file `export_gpt` wrote from it (PyTorch's layout); "
           "the tokenizer (Hugging Face `tokenizers`, byte-level BPE) is the checkpoint's on both sides."
           if info.get("checkpoint") else "the tokenizer is Hugging Face `tokenizers`' byte-level BPE."),
        f"- **Load:** `bench/llm_load.py`, closed loop: C clients each send their next request when the previous "
        f"ends; at concurrency C, max({info['min_requests']}, {info['rounds']}·C) timed requests after a warm-up "
        "round of C (left out). A fixed prompt set: 64 prompts cut from this machine's Python standard library "
        "(16–96 tokens, drawn with seed 0; sha256 "
        f"`{info.get('prompt_set_sha256', '?')[:16]}`), output lengths cycling through 16, 32, 64 and 128 tokens "
        f"(capped to fit the {info['context']}-token context); every request `stream: true`, `temperature: 0`, "
        "`ignore_eos: true`, so each generates exactly its max_tokens.",
        "- **Figures:** output tokens/s = completion tokens of the timed requests (each request's usage, "
        "`stream_options.include_usage`; a request that generated other than its max_tokens is an error) / their "
        "wall time; TTFT = request sent to its first event carrying text; ITL = the gaps between a request's later "
        "text events, pooled over all requests. Both servers send one event per token, except that a token ending "
        "inside a UTF-8 character sends nothing and its bytes go with the next token's "
        f"({events_note(runs)}).",
        f"- **CPUs:** both servers run under `taskset -c 0-{info['threads'] - 1}` with {info['threads']} compute "
        f"threads (`RAYON_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS` = {info['threads']}; Ray's replica "
        f"`torch.set_num_threads({info.get('ray_threads', info['threads'])})`, "
        f"`ray.init(num_cpus={info['threads']})`); the load generator "
        f"(Python asyncio, aiohttp) runs on the same machine{' and cores' if info['threads'] >= info['machine']['cores'] else ''}.",
        f"- **Ray's side:** PyTorch {vers.get('torch', '?')} eager, f32, in 1 Ray Serve replica behind Ray's HTTP "
        f"proxy actor, `@serve.batch(max_batch_size={info['max_batch_size']}, "
        f"batch_wait_timeout_s={info['batch_wait_timeout_s']:g})` on an async generator (one forward pass per "
        "decoding step for the whole batch, prompts left-padded, a key/value cache); one batch at a time.",
        "- **raylet's side:** raylet-llm's `llm_serve` (Rust) on an embedded raylet cluster, continuous batching, "
        + (f"with `{info['raylet_args']}`." if info.get("raylet_args") else
           "with its default engine options (when this was written: 1 replica, at most 64 sequences decoded at "
           "once, 256 MiB of key/value cache, 256 prompt tokens read a step, longer prompts in parts)."),
        f"- **Versions:** Ray {vers.get('ray', '?')}, torch {vers.get('torch', '?')}, Python {vers.get('python', '?')}; "
        f"raylet {vers.get('raylet', '?')}.",
        "",
        "| side | concurrency | output tokens/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | requests (errors) | "
        "what differs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in concurrencies:
        for side in sides:
            get = lambda key: medians(runs, side, c, key)[0]  # noqa: E731
            if get("output_tokens_per_s") is None:
                continue
            done = [r for r in runs if r["side"] == side and r["concurrency"] == c]
            errors = sum(r["errors"] + r["warmup_errors"] for r in done)
            lines.append(
                f"| {SIDES[side]} | {c} | {get('output_tokens_per_s'):,.1f} | {fmt_ms(get('ttft_p50_ms'))} | "
                f"{fmt_ms(get('ttft_p99_ms'))} | {fmt_ms(get('itl_p50_ms'))} | {fmt_ms(get('itl_p99_ms'))} | "
                f"{sum(r['requests'] for r in done)} ({errors}) | {what_differs(side, c, info)} |")
    if len(sides) == 2:
        lines += ["", "Ratios raylet / Ray (min–max of the per-repetition ratios): above 1 is better for tokens/s, "
                  "below 1 for latencies.", "",
                  "| concurrency | output tokens/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for c in concurrencies:
            cells = [ratio_text(runs, c, k)[0] for k in
                     ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        tokens = ratio_text(runs, GOAL_CONCURRENCY, "output_tokens_per_s")[1]
        ttft = ratio_text(runs, GOAL_CONCURRENCY, "ttft_p99_ms")[1]
        if tokens is not None and ttft is not None:
            met = tokens >= GOAL_TOKENS_RATIO and ttft <= GOAL_TTFT_P99_RATIO
            lines += ["", f"**Goal** (at concurrency {GOAL_CONCURRENCY}: raylet ≥ {GOAL_TOKENS_RATIO:g}× Ray Serve's "
                      f"output tokens/s and ≤ 1/{1 / GOAL_TTFT_P99_RATIO:g} of its TTFT p99): "
                      f"**{'met' if met else 'not met'}** ({fmt_ratio(tokens)} the tokens/s, "
                      f"{fmt_ratio(ttft)} the TTFT p99)."]
    stats = []
    for c in concurrencies:
        b = [r["batches"] for r in runs if r["side"] == "ray" and r["concurrency"] == c and r.get("batches")]
        if b and sum(x["batches"] for x in b):
            size = sum(x["requests"] for x in b) / sum(x["batches"] for x in b)
            live = sum(x["live_row_steps"] for x in b) / max(1, sum(x["row_steps"] for x in b))
            stats.append(f"{size:.1f} requests per batch and {live:.0%} of the rows computed still generating "
                         f"at concurrency {c}")
    if stats:
        lines += ["", "Ray's static batches (the replica's counters over the timed and warm-up requests): "
                  + "; ".join(stats) + ". A request that ends early leaves its row computing until the batch's "
                  "longest member is done, and the requests its client sends next wait for a later batch; and Ray's batch queue "
                  "closes the next batch (after its wait timeout) while the running one still runs, so under a "
                  "closed loop the batches fragment into the requests that happened to end together."]
    errors = [(r["side"], r["concurrency"], r["rep"], r["error_samples"] + r["warmup_error_samples"])
              for r in runs if r["errors"] or r["warmup_errors"]]
    lines += ["", "Errors: " + ("none (every request answered 200 with all its tokens and `[DONE]`)." if not errors
                                else "; ".join(f"{s} c={c} rep {rep}: {samples[:2]}" for s, c, rep, samples in errors))]
    g = results.get("greedy", {})
    if "raylet" in g and "ray" in g:
        a, b = g["raylet"].get("text"), g["ray"].get("text")
        if a is None or b is None:
            verdict = f"could not be compared (raylet: {g['raylet'].get('error', 'ok')}; Ray: {g['ray'].get('error', 'ok')})"
        elif a == b:
            verdict = "identical on both sides"
        else:
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            verdict = f"the same for the first {same} characters, then different (f32 rounding can flip a near tie)"
        lines += ["", f"Greedy check: the {GREEDY_TOKENS}-token greedy continuation of `{GREEDY_PROMPT!r}` is "
                  f"{verdict}."]
    path.write_text("\n".join(lines) + "\n")
    log(f"wrote {path}")


def versions(args):
    out = {}
    code = "import ray, torch, sys; print(ray.__version__); print(torch.__version__); print(sys.version.split()[0])"
    proc = subprocess.run([str(PY), "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        out.update(zip(("ray", "torch", "python"), proc.stdout.split()))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    out["raylet"] = (f"commit {commit.stdout.strip()}" + (" (uncommitted changes)" if dirty else "")
                     + ", `cargo build --release`")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raylet", help="the llm_serve example")
    p.add_argument("--checkpoint", help="the checkpoint raylet serves (its tokenizer.json is used on both sides)")
    p.add_argument("--weights", help="the checkpoint exported to safetensors (Ray's side)")
    p.add_argument("--tokenizer", help="the tokenizers JSON (default: the checkpoint's)")
    p.add_argument("--model", default="gpt-small", help="the model name both servers answer to")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16, 64])
    p.add_argument("--min-requests", type=int, default=32, help="timed requests at least, per concurrency")
    p.add_argument("--rounds", type=int, default=4, help="timed requests per client at least")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="compute threads (and cores) per server")
    p.add_argument("--ray-threads", type=int,
                   help="torch threads in Ray's replica, if not --threads (on the same --threads cores)")
    p.add_argument("--max-batch-size", type=int, default=16, help="Ray's @serve.batch max_batch_size")
    p.add_argument("--batch-wait-timeout-s", type=float, default=0.05, help="Ray's @serve.batch batch_wait_timeout_s")
    p.add_argument("--port", type=int, default=18300)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--load-timeout", type=float, default=1800.0)
    p.add_argument("--raylet-args", default="",
                   help="more arguments for llm_serve, one string (e.g. '--max-batch-size 16')")
    p.add_argument("--ray-only", action="store_true", help="run Ray's side only (a check of it; no raylet build)")
    p.add_argument("--quick", action="store_true",
                   help=f"1 repetition, fewer requests, written to {QUICK_REPORT.relative_to(ROOT)}")
    p.add_argument("--report-from", metavar="JSON", help="rewrite the report from saved results")
    args = p.parse_args()
    if args.report_from:
        report(json.loads(Path(args.report_from).read_text()))
        return
    if not args.weights or (not args.ray_only and not (args.raylet and args.checkpoint)):
        p.error("give --raylet, --checkpoint and --weights (or --ray-only with --weights)")
    args.tokenizer = args.tokenizer or (str(Path(args.checkpoint) / "tokenizer.json") if args.checkpoint else None)
    if not args.tokenizer:
        p.error("give --tokenizer (or --checkpoint)")
    for name in ("raylet", "checkpoint", "weights", "tokenizer"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    if args.quick:
        args.reps, args.min_requests, args.rounds = 1, 16, 2
    config = safetensors_config(args.weights)
    args.context = config["context_length"]
    RUNS.mkdir(parents=True, exist_ok=True)
    global RESULTS
    RESULTS = RUNS / ("results-quick.json" if args.quick else "results.json")
    (RUNS / "runs.jsonl").unlink(missing_ok=True)
    sys.path.insert(0, str(ROOT / "bench"))
    prompt_sha = subprocess.run(
        [str(PY), "-c", "import sys; sys.path.insert(0, 'bench'); import llm_load; "
         f"print(llm_load.prompt_set({args.tokenizer!r}, {args.context})[1])"],
        env=ENV, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    d, r = config["d_model"], config["mlp_ratio"]
    # Embeddings; per block two norms, the fused projection, the output, the MLP; the final norm.
    params = (config["vocab_size"] + config["context_length"]) * d + 2 * d + config["n_layers"] * (
        4 * d + (3 * d * d + 3 * d) + (d * d + d) + (r * d * d + r * d) + (r * d * d + d))
    shown = [a for i, a in enumerate(sys.argv[1:])
             if a not in ("--raylet", "--checkpoint", "--weights", "--tokenizer")
             and sys.argv[i] not in ("--raylet", "--checkpoint", "--weights", "--tokenizer")]
    info = {
        "machine": machine_info(), "started": now_utc(), "argv": shown, "reps": args.reps,
        "versions": versions(args), "raylet_args": args.raylet_args, "threads": args.threads, "ray_threads": args.ray_threads or args.threads, "max_batch_size": args.max_batch_size,
        "batch_wait_timeout_s": args.batch_wait_timeout_s, "context": args.context, "config": config,
        "min_requests": args.min_requests, "rounds": args.rounds, "prompt_set_sha256": prompt_sha,
        "checkpoint": args.checkpoint, "weights": args.weights,
        "model_desc": (f"the GPT of `{Path(args.checkpoint).parent.name}/{Path(args.checkpoint).name}`" if args.checkpoint
                       else f"random weights `{Path(args.weights).name}`")
        + f" ({config['n_layers']} layers, width {config['d_model']}, {config['n_heads']} heads, context "
          f"{config['context_length']}, vocabulary {config['vocab_size']}, {params / 1e6:.1f} M parameters), f32",
    }
    results = {"info": info, "runs": [], "greedy": {},
               "report": str(QUICK_REPORT if args.quick or args.ray_only else REPORT)}
    sides = ["ray"] if args.ray_only else ["raylet", "ray"]
    try:
        for rep in range(args.reps):
            for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
                run_side(side, args, rep, results)
    finally:
        results["finished"] = now_utc()
        RESULTS.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
