#!/usr/bin/env bash
# raylet-serve against Ray Serve 2.60 on this machine, side by side: a no-op
# application and an MLP of the digits model's shape, each with 2 replicas,
# loaded by oha at concurrencies 1, 16 and 64; writes bench/serve.md.
#
#   bench/compare_serve.sh [--reps N] [--seconds S] [--concurrency 1,16,64]
#
# 1. Checks that target/release/examples/serve_bench is built (it never
#    builds it); if not, prints the cargo command and exits 1.
# 2. Installs what is missing: ray[serve]==2.60.0 into target/bench-venv
#    (pip; its output goes to target/bench/serve-install.log) and oha into
#    target/bench-tools (`cargo install oha --locked`, a few minutes once).
# 3. bench/compare_serve.py runs the repetitions (default 3), the systems
#    taking turns, and writes bench/serve.md; the raw figures go to
#    target/bench/serve/results.json. Each server is ended by closing its
#    stdin, then whatever it left is ended by pid.
# Needs: python3 (with venv), cargo.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
LOG=target/bench/serve-install.log
OHA=target/bench-tools/bin/oha

read_args --never "$@"
need_examples raylet-serve serve_bench
ensure_ray "ray[serve]==$RAY_VERSION" "$LOG" "ray.serve, starlette, numpy"
if [[ ! -x $OHA ]]; then
    log "installing oha into target/bench-tools (log: $LOG)"
    cargo install oha --locked --root target/bench-tools >> "$LOG" 2>&1
fi
log "oha: $($OHA --version)"
python3 bench/compare_serve.py --raylet target/release/examples/serve_bench --oha "$OHA" "${args[@]+"${args[@]}"}"
