#!/usr/bin/env bash
# Regenerates every table of BENCHMARKS.md with one command: builds the
# release binaries, runs each section's side-by-side script (each writes its
# bench/*.md, with each row's exact workload on both sides), then
# bench/compare_ray.sh, which measures the microbenchmark, lifecycle and
# physical-limit tables and writes BENCHMARKS.md with those sections inlined.
# Every script installs what its Ray side needs into a venv under target/.
#
#   bench/run_all.sh [--reps N] [--skip SECTION]...
#
# Sections, in the order they run: tune, data, envelope, allreduce,
# train-digits, sharding, serve, llm-serve, lm, microbenchmarks. --reps N goes to every script (default: each
# script's own); --skip leaves a section's bench/*.md as it is. A full run
# takes about three hours on a 2-core machine, most of it Ray's side; run it
# on a machine with nothing else running, as the figures are ratios of runs
# made back to back.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=()
skip=" "
while (($#)); do
    case "$1" in
        --reps) reps=(--reps "${2:?--reps takes a number}"); shift 2 ;;
        --skip) skip+="${2:?--skip takes a section} "; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
wanted() { [[ $skip != *" $1 "* ]]; }

log "building the release binaries and examples"
cargo build --release --workspace --bins --examples

if wanted tune; then log "section tune"; bench/compare_tune.sh "${reps[@]}"; fi
if wanted data; then log "section data"; bench/compare_data.sh "${reps[@]}"; fi
if wanted envelope; then log "section envelope"; bench/compare_envelope.sh "${reps[@]}"; fi
if wanted allreduce; then log "section allreduce"; bench/compare_allreduce.sh "${reps[@]}"; fi
if wanted train-digits; then
    log "section train-digits"
    target/release/examples/digits_throughput --reps "${reps[1]:-3}" --write bench/train_digits.md
fi
if wanted sharding; then
    log "section sharding"
    target/release/examples/sharding_bench --steps 6 --write bench/sharding.md
fi
if wanted serve; then log "section serve"; bench/compare_serve.sh "${reps[@]}"; fi
if wanted llm-serve; then log "section llm-serve"; bench/compare_llm_serve.sh "${reps[@]}"; fi
if wanted lm; then log "section lm"; bench/compare_lm.sh "${reps[@]}"; fi
if wanted microbenchmarks; then
    log "section microbenchmarks (writes BENCHMARKS.md)"
    bench/compare_ray.sh "${reps[@]}"
else
    log "rewriting the sections of BENCHMARKS.md, keeping its microbenchmark tables"
    python3 bench/compare_ray.py --refresh-sections
fi
log "done: BENCHMARKS.md"
