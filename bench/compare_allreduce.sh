#!/usr/bin/env bash
# raylet's allreduce against torch.distributed (Gloo, CPU) and Open MPI
# (mpi4py): sum allreduce of f32 on 2 and 4 ranks over loopback; writes
# bench/allreduce.md.
#
#   bench/compare_allreduce.sh [--reps N] [--max-mib M] [--quick]
#
# 1. Checks that target/release/examples/allreduce_bench is built (it never
#    builds it); if not, prints the command and exits 1:
#      cargo build --release -p raylet-train --example allreduce_bench
# 2. Installs the peers, skipping what is there (pip's and apt's output goes
#    to target/bench/allreduce-install.log):
#    - the venv target/allreduce-venv (python3 -m venv);
#    - torch and numpy from PyPI (`pip install torch numpy`). The plain wheel
#      is the CUDA build: it pulls the nvidia-* packages (about 5.4 GB of
#      venv in all, 1.5 minutes here) but runs on CPU, and Gloo is in it;
#    - Open MPI from Debian (`apt-get update`, `apt-get install -y
#      openmpi-bin libopenmpi-dev`; as root, only when mpirun is missing;
#      Open MPI 4.1.4 on bookworm, 107 MB, 25 s);
#    - mpi4py from PyPI (`pip install mpi4py`): mpi4py 4.x ships a binary
#      wheel that loads the system's libmpi at run time, so nothing is built
#      (mpi4py 4.1.2 here, against Debian's Open MPI 4.1.4; Debian's
#      python3-mpi4py, the fallback for a failed build, was not needed).
#    A peer that does not install is left out of the run and of the tables.
# 3. Runs N repetitions (default 3); in each, raylet's
#      target/release/examples/allreduce_bench --json target/bench/allreduce/repR-raylet.jsonl --max-mib M
#    and bench/allreduce_peers.py for each peer (torch-gloo; Open MPI over
#    TCP on lo; Open MPI with shared memory allowed, a row for reference),
#    the order rotated one system further each repetition. M is 256 by
#    default. Each run writes its own JSON lines under target/bench/allreduce/.
# 4. bench/compare_allreduce.py merges them (medians over the repetitions)
#    into bench/allreduce.md, which bench/compare_ray.py inlines into
#    BENCHMARKS.md.
#
# Options:
#   --reps N      repetitions (default 3)
#   --max-mib M   the largest size, in MiB (default 256)
#   --quick       1 repetition up to 4 MiB, written to
#                 target/bench/allreduce-quick.md (bench/allreduce.md stays)
# Needs: python3 (with venv); apt-get and root for Open MPI when it is absent.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
PEER_VENV="$ROOT/target/allreduce-venv"
PY="$PEER_VENV/bin/python"
LOG=target/bench/allreduce-install.log
RUNS=target/bench/allreduce
BENCH=target/release/examples/allreduce_bench

argv="$*"
read_args --quick "$@"
reps=3
max_mib=256
report=bench/allreduce.md
if [[ $flag == 1 ]]; then
    reps=1
    max_mib=4
    report=target/bench/allreduce-quick.md
fi
set -- "${args[@]+"${args[@]}"}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --max-mib) max_mib=$2; shift 2 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ ! -x $BENCH ]]; then
    log "missing $BENCH"
    echo "The Rust example is not built; build it first with:" >&2
    echo "    cargo build --release -p raylet-train --example allreduce_bench" >&2
    exit 1
fi

# ---------------------------------------------------------------- installing

# pip_install SPEC...: installs into the peers' venv, its output to LOG.
pip_install() {
    log "installing $* into $PEER_VENV (log: $LOG)"
    if ! "$PEER_VENV/bin/pip" install --disable-pip-version-check "$@" >> "$LOG" 2>&1; then
        log "installing $* failed: $(pip_errors "$LOG")"
        return 1
    fi
}

ensure_torch() {
    local check='import numpy, torch.distributed as d; assert d.is_gloo_available()'
    "$PY" -c "$check" >> "$LOG" 2>&1 || { pip_install torch numpy && "$PY" -c "$check" >> "$LOG" 2>&1; }
}

ensure_openmpi() {
    if ! command -v mpirun > /dev/null; then
        if [[ $(id -u) != 0 ]] || ! command -v apt-get > /dev/null; then
            log "no mpirun, and apt-get cannot be run as root here"
            return 1
        fi
        log "installing Open MPI with apt-get (log: $LOG)"
        { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev; } \
            >> "$LOG" 2>&1 || return 1
    fi
    mpirun --version 2>&1 | grep -q 'Open MPI' || { log "mpirun is not Open MPI's"; return 1; }
}

ensure_mpi4py() {
    local check='import numpy; from mpi4py import MPI; assert MPI.Get_library_version().startswith("Open MPI")'
    "$PY" -c "$check" >> "$LOG" 2>&1 || { pip_install mpi4py numpy && "$PY" -c "$check" >> "$LOG" 2>&1; }
}

mkdir -p target/bench
echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) bench/compare_allreduce.sh" >> "$LOG"
if [[ ! -x $PY ]]; then
    log "creating $PEER_VENV"
    python3 -m venv "$PEER_VENV" >> "$LOG" 2>&1
fi
systems=(raylet)
if ensure_torch; then
    systems+=(gloo)
else
    log "torch with Gloo is not available; the Gloo columns are left out"
fi
if ensure_openmpi && ensure_mpi4py; then
    systems+=(mpi mpi-shm)
else
    log "Open MPI with mpi4py is not available; the MPI columns are left out"
fi
log "measuring: ${systems[*]}"

# ---------------------------------------------------------------- measuring

# measure SYSTEM REP: one run of SYSTEM, its JSON lines to $RUNS/repREP-SYSTEM.jsonl.
measure() {
    local system=$1 rep=$2 out="$RUNS/rep$2-$1.jsonl"
    log "repetition $rep/$reps: $system"
    if [[ $system == raylet ]]; then
        "$BENCH" --json "$out" --max-mib "$max_mib" > "$RUNS/rep$rep-raylet.txt"
    else
        "$PY" bench/allreduce_peers.py --systems "$system" --ranks 2,4 --max-mib "$max_mib" --out "$out" > /dev/null
    fi
}

started=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
rm -rf "$RUNS"
mkdir -p "$RUNS"
for ((rep = 1; rep <= reps; rep++)); do
    n=${#systems[@]}
    for ((i = 0; i < n; i++)); do
        measure "${systems[(i + rep - 1) % n]}" "$rep"
    done
done

exec "$PY" bench/compare_allreduce.py --runs "$RUNS" --report "$report" --started "$started" --argv="$argv" \
    --max-mib "$max_mib" --raylet-command "$BENCH --json $RUNS/rep<R>-raylet.jsonl --max-mib $max_mib" \
    --peers-command "${PY#"$ROOT/"} bench/allreduce_peers.py --systems <S> --ranks 2,4 --max-mib $max_mib --out $RUNS/rep<R>-<S>.jsonl"
