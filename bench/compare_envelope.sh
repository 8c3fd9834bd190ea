#!/usr/bin/env bash
# The release-test envelope of raylet and Ray 2.60.0 side by side: our own
# versions of Ray's scalability release tests (release/benchmarks in
# ray-project/ray) on this machine; writes bench/envelope.md.
#
#   bench/compare_envelope.sh [--reps N] [--only W]... [--quick] [--raylet-only | --ray-only]
#                             [--scale W=N]... [--raylet-extra W=N]... [--out FILE]
#
# Workloads W: tasks_1m, args_10k, pgs_1000, many_actors, broadcast_1g
# (bench/compare_envelope.py describes each, and what is measured).
#
# 1. Checks that target/release/raylet and target/release/examples/scale_envelope
#    are built (it never builds them; skipped with --ray-only); if not, prints
#    the command and exits 1.
# 2. Ensures a venv at target/bench-venv with ray[default]==2.60.0 and numpy
#    (skipped with --raylet-only); pip's output goes to target/bench/envelope-install.log.
# 3. Runs bench/compare_envelope.py with the system python3: for each workload
#    and repetition, Ray (bench/envelope_ray.py) and raylet (scale_envelope)
#    each on a fresh 2-CPU head (plus, for broadcast_1g, N nodes in the network
#    namespaces of bench/netns_hosts.sh, which needs root), alternating which
#    goes first; it samples the processes' RSS from /proc while the driver runs.
#    The report goes to bench/envelope.md for a full run, otherwise (--quick,
#    --only, --raylet-only, --ray-only) to target/bench/envelope.partial.md;
#    the raw numbers to target/bench/envelope-results.json, each run's logs to
#    target/bench/envelope-logs/.
#
# Options (passed through to bench/compare_envelope.py):
#   --reps N            repetitions (default 3)
#   --only W            only these workloads (repeatable or comma-separated)
#   --quick             1 repetition at small scales (1,000 tasks, 100 refs, 10
#                       groups, 4 actors, 1 GiB to 1 host): a smoke run
#   --raylet-only       skip Ray (no venv needed): with --quick, the CI smoke run
#   --ray-only          skip raylet
#   --scale W=N         run W at N on both sides instead of its default
#   --raylet-extra W=N  also run W at N on raylet alone, as an extra row
#   --out FILE          where to write the report
#
# To rewrite the report from the last run's raw numbers without measuring again:
#   python3 bench/compare_envelope.py --report-from target/bench/envelope-results.json [--out FILE]
#
# Every start command and driver runs in its own session; after each run the
# raylet clusters are stopped with `raylet stop --temp-dir DIR`, and whatever
# is left of those sessions or names the run's temp dir is ended by pid
# (SIGTERM, then SIGKILL). Not `ray stop`: it ends every Ray cluster on the
# machine and every process named `raylet`, which this project's binary also
# is. The namespaces are removed at the end (bench/netns_hosts.sh down).
# Needs: python3 (with venv); root and iproute2 for broadcast_1g.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
LOG=target/bench/envelope-install.log

read_args --raylet-only "$@"
raylet_only=$flag

if [[ " $* " != *" --ray-only "* ]]; then
    missing=0
    for bin in target/release/raylet target/release/examples/scale_envelope; do
        if [[ ! -x $bin ]]; then
            log "missing $bin"
            missing=1
        fi
    done
    if [[ $missing == 1 ]]; then
        echo "Build the raylet binary and examples first with:" >&2
        echo "    cargo build --release --workspace --bins --examples" >&2
        exit 1
    fi
fi

if [[ $raylet_only == 0 ]]; then
    ensure_ray "ray[default]==$RAY_VERSION" "$LOG" "ray.dashboard"
    if ! "$VENV/bin/python" -c "import numpy" >> "$LOG" 2>&1; then
        log "installing numpy into $VENV"
        "$VENV/bin/pip" install --disable-pip-version-check numpy >> "$LOG" 2>&1
    fi
fi

# The system python runs the driver, so that its command line names neither
# system's install path.
exec python3 "$ROOT/bench/compare_envelope.py" "$@"
