#!/usr/bin/env bash
# raylet's GPT workload (raylet-lm) against PyTorch on Ray 2.60.0, same
# model, data and optimizer on both sides; writes bench/lm.md.
#
#   bench/compare_lm.sh [--reps N] [--quick]
#
# 1. Checks that the raylet side is built (it never builds it); if not,
#    prints the command and exits 1:
#      cargo build --release -p raylet-lm --example lm_bench
#      cargo build --release -p raylet-models --example step_time
#    When the libtorch build is there too, its rows are added (it needs the
#    pip torch==2.9.0 that tch 0.22 expects, in target/libtorch-venv):
#      python3 -m venv target/libtorch-venv
#      target/libtorch-venv/bin/pip install torch==2.9.0
#      PATH=$PWD/target/libtorch-venv/bin:$PATH LIBTORCH_USE_PYTORCH=1 \
#        CARGO_TARGET_DIR=target/tch cargo build --release \
#        -p raylet-lm --example lm_bench --features raylet-lm/libtorch \
#        -p raylet-models --example step_time --features raylet-models/tch,raylet-models/ndarray
# 2. Installs into the venv target/bench-venv, skipping what is there:
#    ray[train,data]==2.60.0, torch (the plain PyPI wheel; it runs on the
#    CPU), tokenizers and pyarrow (pip's output goes to
#    target/bench/lm-install.log).
# 3. Prepares the corpus once (`lm_bench prepare`: this machine's Python
#    standard library, an 8192-token BPE, rows of 129 tokens) into
#    target/gpt-example/data, the example's directory.
# 4. Runs N repetitions (default 2); in each, the order rotated one further
#    every repetition, for raylet (each build) and for Ray + PyTorch:
#    - plain: steps of the `small` GPT in one process with one thread
#      (RAYON_NUM_THREADS=1, OMP_NUM_THREADS=1; torch.set_num_threads(1));
#    - train: 2 data-parallel workers of one CPU and one thread each on a
#      3-CPU cluster, 8 rows per worker per step, 12 steps (the first 2
#      left out): raylet-train against Ray Train's TorchTrainer (DDP over
#      gloo), both reading a shuffled split of the prepared Parquet;
#    - score: the validation files scored (loss and a 32-token greedy
#      continuation each) by a pool of 1 to 2 actors into Parquet:
#      raylet-data against Ray Data's map_batches with torch actors;
#    and, once, the backend table: target/*/release/examples/step_time
#    (small, batch 8 x 256 tokens, one thread) on each backend built.
#    Each run appends a JSON line to target/bench/lm/runs.jsonl.
# 5. bench/compare_lm.py turns the medians into bench/lm.md, which
#    bench/compare_ray.py inlines into BENCHMARKS.md.
#
# Options:
#   --reps N   repetitions (default 2)
#   --quick    1 repetition of 4 steps (the first left out), written to
#              target/bench/lm-quick.md (bench/lm.md stays)
# Needs: python3 (with venv); about 12 GB of disk for the two venvs.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
LOG=target/bench/lm-install.log
RUNS=target/bench/lm
FLEX=target/release/examples/lm_bench
LIBTORCH=target/tch/release/examples/lm_bench
# The libtorch build finds libtorch in the pip wheel it was built against.
TORCH_LIB=$ROOT/target/libtorch-venv/lib/python3.11/site-packages/torch/lib
DATA=target/gpt-example/data
FILES=$RUNS/validation-files.txt

read_args --quick "$@"
reps=2
steps=12
skip=2
report=bench/lm.md
if [[ $flag == 1 ]]; then
    reps=1
    steps=4
    skip=1
    report=target/bench/lm-quick.md
fi
set -- "${args[@]+"${args[@]}"}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

need_examples raylet-lm lm_bench
need_examples raylet-models step_time
ensure_ray "ray[train,data]==$RAY_VERSION" "$LOG" "ray.train.torch,ray.data"
ensure_pip "$LOG" "import torch, tokenizers, pyarrow" torch tokenizers pyarrow || {
    log "torch, tokenizers or pyarrow did not install: see $LOG"
    exit 1
}

mkdir -p "$RUNS"
JSON=$RUNS/runs.jsonl
: > "$JSON"
export RAY_USAGE_STATS_ENABLED=0 RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
log "preparing the corpus into $DATA (skipped when it is there)"
"$FLEX" prepare --data "$DATA" --files "$FILES" --json "$JSON" > /dev/null

builds=("$FLEX")
if [[ -x "$LIBTORCH" ]]; then
    builds+=("$LIBTORCH")
else
    log "no libtorch build at $LIBTORCH: its rows are left out (see --help)"
fi

# run_side SIDE RUN: one run of SIDE (a raylet build, or "ray").
run_side() {
    local side=$1 run=$2 workload=(--steps "$steps" --skip "$skip")
    log "$side $run"
    if [[ $side == ray ]]; then
        case $run in
            plain) "$VENV/bin/python" bench/lm_torch.py plain --json "$JSON" "${workload[@]}" ;;
            train) "$VENV/bin/python" bench/lm_torch.py train --json "$JSON" "${workload[@]}" --data "$DATA" ;;
            score) "$VENV/bin/python" bench/lm_torch.py score --json "$JSON" --data "$DATA" --files "$FILES" ;;
        esac
    else
        local build=("$side")
        [[ $side == "$LIBTORCH" ]] && build=(env "LD_LIBRARY_PATH=$TORCH_LIB" "$side")
        case $run in
            plain) "${build[@]}" plain --json "$JSON" "${workload[@]}" ;;
            train) "${build[@]}" train --json "$JSON" "${workload[@]}" --data "$DATA" --runs "$RUNS/runs-$rep" ;;
            score)
                local checkpoint
                checkpoint=$("$VENV/bin/python" - "$JSON" "$side" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
backend = "libtorch" if "/tch/" in sys.argv[2] else "flex"
print([l for l in lines if l["run"] == "train" and l.get("backend") == backend][-1]["checkpoint"])
EOF
)
                "${build[@]}" score --json "$JSON" --data "$DATA" --files "$FILES" --checkpoint "$checkpoint"
                ;;
        esac
    fi > "$RUNS/last-run.log" 2>&1 || {
        log "$side $run failed; its output:"
        tail -n 20 "$RUNS/last-run.log" >&2
        exit 1
    }
}

sides=("${builds[@]}" ray)
for ((rep = 1; rep <= reps; rep++)); do
    for run in plain train score; do
        for ((i = 0; i < ${#sides[@]}; i++)); do
            run_side "${sides[$(((i + rep) % ${#sides[@]}))]}" "$run"
        done
    done
done

log "backend table (step_time, one thread)"
for step_time in target/release/examples/step_time target/tch/release/examples/step_time; do
    [[ -x $step_time ]] || continue
    for backend in flex ndarray libtorch; do
        if [[ $step_time == target/release/* || $backend != flex ]]; then
            env "LD_LIBRARY_PATH=$TORCH_LIB" "$step_time" small 8 3 "$backend" 2>&1 | grep tokens/s | sed 's/^/step_time /' >> "$RUNS/step_time.txt" || true
        fi
    done
done
"$VENV/bin/python" - "$JSON" "$RUNS/step_time.txt" <<'EOF'
import json, sys
with open(sys.argv[1], "a") as out:
    for line in open(sys.argv[2]):
        out.write(json.dumps({"run": "step_time", "line": line.strip()}) + "\n")
EOF
rm -f "$RUNS/step_time.txt"
"$VENV/bin/python" bench/compare_lm.py "$JSON" "$report" --reps "$reps" --steps "$steps" --skip "$skip"
log "wrote $report"
