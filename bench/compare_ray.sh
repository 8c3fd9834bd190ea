#!/usr/bin/env bash
# Side-by-side benchmark of raylet against Ray 2.60.0; writes BENCHMARKS.md.
#
#   bench/compare_ray.sh [--reps N] [--only ROW]... [--quick] [--raylet-only] [--out FILE] [--idle SECONDS]
#
# 1. Installs ray[default,tune,train]==2.60.0 into target/bench-venv with pip
#    (skipped when that venv already has it; skipped entirely with --raylet-only).
# 2. Builds raylet (`cargo build --release --bin raylet --example quickstart`)
#    and bench/physlimits.c (gcc) into target/bench/.
# 3. Runs bench/compare_ray.py, which measures every row on both systems,
#    alternating them repetition by repetition, and writes the report:
#    BENCHMARKS.md for a full run, target/bench/BENCHMARKS.partial.md when
#    --only, --quick or --raylet-only narrow it (or --out FILE); the raw
#    numbers go to target/bench/results.json (results.partial.json).
#
# Options (passed through to bench/compare_ray.py):
#   --reps N        repetitions per row (default 3)
#   --only ROW      only rows whose name contains ROW (case-insensitive; repeatable,
#                   or comma-separated): a metric name such as 'tasks sync', or
#                   start, idle-rss, status, stop (these four are one start/stop
#                   cycle and come together), first-task, memcpy, tcp
#   --quick         1 repetition, `raylet microbenchmark --quick` (Ray's own trials
#                   cannot be shortened), 2 s idle before the RSS snapshot
#   --raylet-only   skip Ray entirely (no venv, no install): a CI smoke run
#   --out FILE      where to write the report
#
# To rewrite the report from the last run's raw numbers without measuring again:
#   python3 bench/compare_ray.py --report-from target/bench/results.json [--out FILE]
#
# Every process the script starts is stopped before it exits (ray stop --force;
# raylet stop --temp-dir DIR). Needs: python3 (with venv), cargo, gcc.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
RAY_SPEC="ray[default,tune,train]==$RAY_VERSION"

read_args --raylet-only "$@"
raylet_only=$flag

mkdir -p target/bench
ray_note=()
if [[ $raylet_only == 0 ]]; then
    if "$VENV/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" 2>/dev/null; then
        log "Ray $RAY_VERSION already installed in $VENV"
    else
        log "installing $RAY_SPEC into $VENV (several minutes)"
        if ! { [[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV"; } > target/bench/ray-install.log 2>&1 \
            || ! "$VENV/bin/pip" install --disable-pip-version-check "$RAY_SPEC" >> target/bench/ray-install.log 2>&1 \
            || ! "$VENV/bin/python" -c "import ray" >> target/bench/ray-install.log 2>&1; then
            reason="installing $RAY_SPEC with pip into target/bench-venv failed: $(pip_errors target/bench/ray-install.log)"
            log "$reason"
            log "going on with raylet only (full log: target/bench/ray-install.log)"
            ray_note=(--ray-note "$reason")
        fi
    fi
fi

log "building raylet (release)"
cargo build --release --bin raylet --example quickstart

log "building bench/physlimits.c"
gcc -O2 -o target/bench/physlimits bench/physlimits.c

# The helper needs only the standard library; the system python runs it, so
# that its command line names neither system's install path.
exec python3 "$ROOT/bench/compare_ray.py" "$@" "${ray_note[@]}"
