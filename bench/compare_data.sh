#!/usr/bin/env bash
# Side-by-side benchmark of raylet-data against Ray Data 2.60.0: files per second
# through a binary-file read and a trivial per-batch model in a pool of 2 actors,
# and the peak memory of the driver and of the workers; writes bench/data.md.
#
#   bench/compare_data.sh [--reps N] [--sink take_all|jsonl|both] [--files N]
#                         [--large-files N] [--large-size BYTES] [--skip-small|--skip-large] [--install-only]
#
# 1. Checks that the Rust example is built (it never builds it); if not,
#    prints the command and exits 1:
#      cargo build --release -p raylet-data --examples
# 2. Ensures a venv at target/bench-venv (reused when it already has it) with
#    ray[data]==2.60.0. The pip output is appended to target/bench/data-install.log.
# 3. Runs bench/compare_data.py with the venv's python, which makes two sets of
#    inputs with `data_throughput --make-only`: 10,000 files of 1 KiB
#    (target/bench/data-files, made afresh) and 100,000 files of 100 KiB
#    (10.2 GB in target/bench/data-files-large, made once and then reused;
#    check the disk space), and, for each set and repetition, runs on it
#    - Ray Data: `ray.init(num_cpus=2)`, `ray.data.read_binary_files(dir)
#      .map_batches(Trivial, concurrency=2, batch_size=64, num_cpus=0.5)` and the
#      same with Ray's default batch size (the read then fused into the actors),
#      each in a fresh python process;
#    - raylet: target/release/examples/data_throughput (embedded 2-CPU cluster,
#      `read_binary` + `map_batches_with(Trivial, 64, ActorPoolStrategy::fixed(2))`);
#    all consuming the rows with take_all() and with a JSON-lines sink, timed
#    apart from the cluster start, every file checked to appear exactly once,
#    each run started on a warm page cache (the harness reads every input file
#    first), the driver's peak RSS and the workers' peak summed RSS sampled
#    from /proc every 0.1 s, alternating which goes first repetition by
#    repetition; and writes bench/data.md (a section that bench/compare_ray.py
#    inlines into BENCHMARKS.md) and the raw numbers to
#    target/bench/data-results.json.
#
# Options (passed through to bench/compare_data.py, except --install-only):
#   --reps N            repetitions per set of inputs (default 3)
#   --sink S            take_all, jsonl or both (default both)
#   --files N           files of the small set (default 10000)
#   --large-files N     files of the large set (default 100000)
#   --large-size BYTES  bytes per file of the large set (default 102400)
#   --skip-small        only the large set
#   --skip-large        only the small set
#   --install-only      set up the venv and stop
#
# To rewrite bench/data.md from the last run's raw numbers without measuring again:
#   python3 bench/compare_data.py --report-from target/bench/data-results.json
#
# Every process a measurement starts runs in its own session, and each Ray run
# has a temp dir of its own (/tmp/rd<pid>r<rep>); after a run exits, whatever
# is left of its session or names its temp dir (Ray's gcs, raylet, workers),
# with their descendants, is ended by pid (SIGTERM, then SIGKILL), and a final
# check does the same for every temp dir of the script before it exits. No
# other process is touched: not every process running from target/bench-venv,
# which other work on the machine may be using, and not `ray stop --force`,
# which matches processes by the name `raylet`, as this project's binary is named.
# Needs: python3 (with venv).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
RAY_SPEC="ray[data]==$RAY_VERSION"
LOG=target/bench/data-install.log

read_args --install-only "$@"
install_only=$flag

if [[ $install_only == 0 ]]; then
    need_examples raylet-data data_throughput
fi

# ray[data]: the data extra's packages (pandas, pyarrow, ...) must import too.
ensure_ray "$RAY_SPEC" "$LOG" "ray.data, pandas, pyarrow, numpy"
log "versions: $("$VENV/bin/python" -c 'import ray, pyarrow; print("ray", ray.__version__, "/ pyarrow", pyarrow.__version__)')"

if [[ $install_only == 1 ]]; then
    exit 0
fi

exec "$VENV/bin/python" "$ROOT/bench/compare_data.py" "${args[@]+"${args[@]}"}"
