#!/usr/bin/env bash
# Serving a language model: raylet's `llm_serve` (continuous batching) against
# the same weights in PyTorch served by Ray Serve 2.60 with `@serve.batch`
# (static batching), both OpenAI-compatible; writes bench/llm_serve.md.
#
#   bench/compare_llm_serve.sh [--reps N] [--concurrency 1,16,64] [--quick] [--threads T]
#
# 1. Checks that the raylet side is built (it never builds it); if not,
#    prints the command and exits 1:
#      cargo build --release -p raylet-llm --example llm_serve --example export_gpt
# 2. Installs into the venv target/bench-venv, skipping what is there:
#    ray[serve]==2.60.0, torch, tokenizers, safetensors and aiohttp (pip's
#    output goes to target/bench/llm-serve-install.log).
# 3. Takes the newest checkpoint target/gpt-example/runs/gpt-small-*/checkpoint_*
#    (the `small` GPT, with tokenizer.json inside; `lm_bench` or the GPT
#    example writes it) and exports it once with
#    `export_gpt --checkpoint DIR --out target/bench/llm_serve/<run>-<checkpoint>.safetensors`
#    (PyTorch's layout, read by Ray's side).
# 4. bench/compare_llm_serve.py runs N repetitions (default 2), the sides
#    taking turns: each starts its server (raylet: `llm_serve --checkpoint DIR
#    --model gpt-small --port P --token-file F`; Ray: bench/llm_serve_ray.py
#    serve, max_batch_size 16, batch_wait_timeout_s 0.05), waits for its
#    `ready http://127.0.0.1:P` line, and runs bench/llm_load.py at each
#    concurrency (64 fixed prompts from this machine's Python standard
#    library, output lengths 16 to 128 tokens, streaming, greedy, ignore_eos,
#    closed loop), then stops it with SIGTERM. Both servers run under
#    `taskset -c 0-(T-1)` with T compute threads (default: every core).
#    Raw figures: target/bench/llm_serve/results.json (runs.jsonl per run).
#    bench/compare_ray.py inlines bench/llm_serve.md into BENCHMARKS.md.
#
# Options (passed to bench/compare_llm_serve.py; its --help has all):
#   --reps N              repetitions (default 2)
#   --concurrency LIST    closed-loop clients (default 1,16,64)
#   --threads T           compute threads and cores per server (default: all)
#   --quick               1 repetition, fewer requests, written to
#                         target/bench/llm_serve-quick.md (bench/llm_serve.md stays)
# Needs: python3 (with venv), taskset (util-linux; without it, nothing is pinned).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
LOG=target/bench/llm-serve-install.log
SERVE=target/release/examples/llm_serve
EXPORT=target/release/examples/export_gpt
OUT=target/bench/llm_serve

read_args --never "$@"

missing=0
for ex in "$SERVE" "$EXPORT"; do
    if [[ ! -x $ex ]]; then
        log "missing $ex"
        missing=1
    fi
done
if [[ $missing == 1 ]]; then
    echo "The Rust examples are not built; build them first with:" >&2
    echo "    cargo build --release -p raylet-llm --example llm_serve --example export_gpt" >&2
    exit 1
fi

ensure_ray "ray[serve]==$RAY_VERSION" "$LOG" "ray.serve, starlette"
ensure_pip "$LOG" "import torch, tokenizers, safetensors, aiohttp" torch tokenizers safetensors aiohttp || {
    log "torch, tokenizers, safetensors or aiohttp did not install: see $LOG"
    exit 1
}

# The newest checkpoint of the small GPT (by modification time) that has its tokenizer.
checkpoint=""
for dir in $(ls -dt target/gpt-example/runs/gpt-small-*/checkpoint_* 2>/dev/null); do
    if [[ -f $dir/tokenizer.json ]]; then
        checkpoint=$dir
        break
    fi
done
if [[ -z $checkpoint ]]; then
    echo "No checkpoint target/gpt-example/runs/gpt-small-*/checkpoint_* with a tokenizer.json;" >&2
    echo "train the small GPT first (see README's \"Language models\")." >&2
    exit 1
fi
log "checkpoint: $checkpoint"

mkdir -p "$OUT"
run=$(basename "$(dirname "$checkpoint")")
weights=$OUT/$run-$(basename "$checkpoint").safetensors
if [[ ! -s $weights || $checkpoint -nt $weights || $EXPORT -nt $weights ]]; then
    log "exporting it to $weights"
    "$EXPORT" --checkpoint "$checkpoint" --out "$weights" > "$OUT/export.log" 2>&1 || {
        log "export_gpt failed; its output:"
        tail -n 20 "$OUT/export.log" >&2
        exit 1
    }
fi

python3 bench/compare_llm_serve.py --raylet "$SERVE" --checkpoint "$checkpoint" --weights "$weights" \
    "${args[@]+"${args[@]}"}"
