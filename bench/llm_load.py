"""A closed-loop load generator for an OpenAI-compatible `/v1/completions`
server (bench/compare_llm_serve.sh runs it against raylet's `llm_serve` and
against bench/llm_serve_ray.py); prints one JSON object and appends it to
--json.

The prompt set is fixed and deterministic: --prompts (64) prompts cut from
files of this machine's Python standard library (the files, start lines and
lengths drawn with random.Random(--seed)), each 16 to 96 tokens of the given
tokenizer, each with a fixed output length cycling through 16, 32, 64, 128
tokens, capped so that prompt + output fits the context. Its sha256 is in the
output, so two runs can be checked to have sent the same requests.

Every request is `stream: true`, `temperature: 0`, `ignore_eos: true` (so a
request generates exactly its max_tokens). C clients each send their next
request when the previous one has ended (closed loop): first a warm-up round
of --warmup requests per client, left out of the figures, then --requests
requests in all; request k takes prompt k mod the set's size.

Tokens are counted by the usage chunk: every request asks for
`stream_options.include_usage` (both servers measured honour it) and its
usage's completion_tokens are the request's output tokens (with
--events-only, the token events are counted instead, for a server without
it). Per request: TTFT is the time from sending it to the first event
carrying text; inter-token latencies (ITL) are the gaps between its later
events carrying text. Both servers send one event per token, except that a
token ending inside a UTF-8 character sends nothing and its bytes go out
with the next token's (events_per_token in the output says how close to one
it is); a final chunk that only carries finish_reason, or the usage, is not
a text event. A request counts as an error when it answers any status but
200, its stream ends without `data: [DONE]` or breaks, has no usage, or
generated other than its max_tokens (with ignore_eos it must generate them
all).

Output: output tokens/s (all completion tokens of the timed requests over the
wall time from the first timed request sent to the last one ended), TTFT
p50/p99, ITL p50/p99 (over all gaps of all requests), end-to-end latency
p50/p99, requests and errors.

  target/bench-venv/bin/python bench/llm_load.py --url http://127.0.0.1:8000 \\
      --api-key-file KEY --model gpt --tokenizer target/gpt-example/data/tokenizer.json \\
      --context 256 --concurrency 16 --requests 64 [--json OUT.jsonl --label ray]
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

OUTPUT_LENGTHS = (16, 32, 64, 128)
# What a non-final token event holds when sent as compact JSON (as both
# servers here send it); such events are not parsed (the client shares the
# servers' cores), the others are.
TOKEN_EVENT = b'"finish_reason":null'
EMPTY_TEXT = b'"text":""'


def stdlib_files():
    """The .py files of this Python's standard library (not site-packages, not tests), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in ("site-packages", "dist-packages") or any(p in ("test", "tests", "idle_test") for p in parts):
            continue
        files.append(path)
    return files, root


def prompt_set(tokenizer_path, context, count=64, seed=0, min_tokens=16, max_tokens=96):
    """[(prompt text, prompt tokens, max_tokens)] and the set's sha256."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    rng = random.Random(seed)
    files, root = stdlib_files()
    prompts = []
    while len(prompts) < count:
        path = rng.choice(files)
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        if len(lines) < 8:
            continue
        start = rng.randrange(len(lines) - 4)
        want = rng.randint(min_tokens, max_tokens)
        text = "".join(lines[start:start + 200])
        if not text.strip():
            continue
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) < want:
            continue
        cut = text[:encoding.offsets[want - 1][1]]
        length = len(tokenizer.encode(cut, add_special_tokens=False).ids)
        if not min_tokens <= length <= max_tokens or length >= context:
            continue
        out = min(OUTPUT_LENGTHS[len(prompts) % len(OUTPUT_LENGTHS)], context - length)
        prompts.append({"prompt": cut, "prompt_tokens": length, "max_tokens": out,
                        "source": f"{path.relative_to(root)}:{start + 1}"})
    digest = hashlib.sha256(json.dumps([(p["prompt"], p["max_tokens"]) for p in prompts]).encode()).hexdigest()
    return prompts, digest


def percentile(values, q):
    """The q-th percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(s) - 1)
    return s[low] + (s[high] - s[low]) * (pos - low)


async def one_request(session, args, api_key, item):
    """Sends one streaming request; returns its record."""
    body = {"model": args.model, "prompt": item["prompt"], "max_tokens": item["max_tokens"], "temperature": 0,
            "stream": True, "ignore_eos": True}
    if not args.events_only:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    record = {"max_tokens": item["max_tokens"], "prompt_tokens": item["prompt_tokens"], "error": None}
    times, usage, done = [], None, False
    sent = time.perf_counter()
    try:
        async with session.post(args.url.rstrip("/") + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                record["error"] = f"status {resp.status}: {text}"
                return record
            buffer = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buffer += data.replace(b"\r", b"")
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            continue
                        if TOKEN_EVENT in payload:
                            if EMPTY_TEXT not in payload:
                                times.append(now)
                            continue
                        chunk = json.loads(payload)
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        choices = chunk.get("choices") or []
                        if choices and choices[0].get("text"):
                            times.append(now)
    except Exception as e:  # a broken connection, a bad event
        record["error"] = f"{type(e).__name__}: {e}"[:300]
        return record
    ended = time.perf_counter()
    tokens = len(times) if args.events_only else (usage or {}).get("completion_tokens")
    record.update(sent=sent, ended=ended, tokens=tokens, events=len(times), e2e=ended - sent,
                  ttft=times[0] - sent if times else None,
                  itl=[b - a for a, b in zip(times, times[1:])])
    if not done:
        record["error"] = "the stream ended without data: [DONE]"
    elif tokens is None:
        record["error"] = "no usage chunk (try --events-only)"
    elif tokens != item["max_tokens"]:
        record["error"] = f"{tokens} tokens ({len(times)} text events) for max_tokens {item['max_tokens']}"
    elif not times:
        record["error"] = "no event carried text"
    return record


async def run(args, api_key, prompts):
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async def phase(first, count):
            """count requests (request k takes prompt k) by the clients in a closed loop."""
            indices = iter(range(first, first + count))
            records = []

            async def client():
                for k in indices:
                    records.append(await one_request(session, args, api_key, prompts[k % len(prompts)]))

            await asyncio.gather(*(client() for _ in range(args.concurrency)))
            return records

        warm_total = args.warmup * args.concurrency
        warm = await phase(0, warm_total)
        started = time.perf_counter()
        records = await phase(warm_total, args.requests)
        wall = time.perf_counter() - started
        return warm, records, wall


def summarize(args, warm, records, wall, digest):
    ok = [r for r in records if r["error"] is None]
    errors = [r["error"] for r in records if r["error"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] * 1e3 for r in ok]
    itl = [g * 1e3 for r in ok for g in r["itl"]]
    e2e = [r["e2e"] * 1e3 for r in ok]
    return {
        "label": args.label, "url": args.url, "model": args.model, "concurrency": args.concurrency,
        "requests": len(records), "completed": len(ok), "errors": len(errors), "error_samples": errors[:5],
        "warmup_requests": len(warm), "warmup_errors": sum(1 for r in warm if r["error"] is not None),
        "warmup_error_samples": [r["error"] for r in warm if r["error"] is not None][:3],
        "output_tokens": tokens, "prompt_tokens": sum(r["prompt_tokens"] for r in ok), "wall_s": wall,
        "output_tokens_per_s": tokens / wall if wall > 0 else 0.0, "requests_per_s": len(ok) / wall if wall else 0.0,
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
        "itl_p50_ms": percentile(itl, 50), "itl_p99_ms": percentile(itl, 99),
        "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
        "events_per_token": sum(r["events"] for r in ok) / tokens if tokens else None,
        "token_count": "text events" if args.events_only else "usage (stream_options.include_usage)",
        "client_loop": args.loop,
        "prompt_set": {"count": args.prompts, "seed": args.seed, "sha256": digest, "context": args.context},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the server's base URL (…/v1/completions is appended)")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--api-key")
    key.add_argument("--api-key-file", help="a file holding the key")
    p.add_argument("--model", required=True, help="the model name sent in each request")
    p.add_argument("--tokenizer", required=True, help="the tokenizers JSON (to cut prompts to token lengths)")
    p.add_argument("--context", type=int, required=True, help="the model's context (prompt + output fit in it)")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop clients")
    p.add_argument("--requests", type=int, default=64, help="timed requests in all")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests per client, left out")
    p.add_argument("--prompts", type=int, default=64, help="the prompt set's size")
    p.add_argument("--seed", type=int, default=0, help="the prompt set's seed")
    p.add_argument("--events-only", action="store_true",
                   help="count tokens by text events, without asking for stream_options.include_usage")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--label", default="", help="a name recorded in the output")
    p.add_argument("--json", help="append the result line to this file")
    p.add_argument("--save-prompts", help="write the prompt set as JSON to this file")
    args = p.parse_args()
    api_key = args.api_key or Path(args.api_key_file).read_text().strip()
    prompts, digest = prompt_set(args.tokenizer, args.context, args.prompts, args.seed)
    if args.save_prompts:
        Path(args.save_prompts).write_text(json.dumps({"sha256": digest, "prompts": prompts}, indent=1))
    try:
        import uvloop  # comes with ray[serve]; a cheaper event loop for the client

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        args.loop = "uvloop"
    except ImportError:
        args.loop = "asyncio"
    warm, records, wall = asyncio.run(run(args, api_key, prompts))
    result = summarize(args, warm, records, wall, digest)
    line = json.dumps(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "a") as f:
            f.write(line + "\n")
    print(line, flush=True)
    return 1 if result["errors"] or result["warmup_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
