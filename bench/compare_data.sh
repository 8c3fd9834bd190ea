#!/usr/bin/env bash
# Side-by-side benchmark of raylet-data against Ray Data 2.60.0: files per second
# through a binary-file read and a trivial per-batch model in a pool of 2 actors,
# and the peak memory of the driver and of the workers; writes bench/data.md.
#
#   bench/compare_data.sh [--reps N] [--sink take_all|jsonl|both] [--files N]
#                         [--large-files N] [--large-size BYTES] [--skip-small|--skip-large] [--install-only]
#   bench/compare_data.sh --only parquet|images|shuffle[,...] [--reps N] [--ray-only] [--rows N]
#                         [--parquet-files N] [--images N] [--seed S] [--digits CSV] [--checkpoint FILE]
#                         [--ray-backend auto|torch|numpy] [--install-only]
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
# With --only, the Parquet, images and shuffle benchmarks (issue 33) instead,
# side by side with Ray Data 2.60 (bench/compare_data_wave2.py, whose
# docstring tells them; bench/ray_data_wave2.py is the Ray side, and
# bench/make_data.py makes the seeded inputs once under target/bench):
#   parquet   10,000,000 rows x 8 float64 columns: read_parquet -> map_batches
#             (out = c0 * 2 + c1) -> write_parquet; rows/s, peak RSS
#   images    20,000 32x32 grayscale PNGs -> a small CNN in 2 actors
#             (Ray: torch on the CPU, or numpy when torch cannot be had);
#             images/s, peak RSS
#   shuffle   random_shuffle of the parquet rows, consumed fully; seconds, peak RSS
# The raylet side is target/release/examples/data_bench (its command lines
# and JSON output: "the raylet side's contract" in compare_data_wave2.py);
# when it is not built the script says so and exits 1, unless --ray-only,
# which measures Ray alone (DATA_BENCH_BIN=PATH runs PATH instead of the
# example). Writes bench/data_<mode>.md (--ray-only:
# target/bench/data-<mode>-ray-only.md) and target/bench/data-<mode>-results.json
# (-results-ray-only.json).
# The images mode also installs pillow (Ray's read_images needs it) and torch
# into the venv: pip's torch wheel for Linux brings the CUDA libraries too,
# about 4 GB to download and 5.4 GB on disk, used here on the CPU only.
#   --only MODES        parquet, images, shuffle, or several comma-separated
#   --ray-only          Ray alone (no raylet example needed)
#   --rows N            rows of the parquet data set (default 10,000,000)
#   --parquet-files N   its files (default 10, row groups of at most 1,000,000 rows)
#   --images N          images (default 20,000)
#   --seed S            seed of the data, of the shuffle and of Ray's CNN weights (default 0)
#   --digits CSV        the 8x8 digits (default target/bench/digits.csv, which
#                       `data_bench digits` exports when absent)
#   --checkpoint FILE   raylet's CNN weights (default target/bench/data-cnn-s<seed>.ckpt,
#                       made by `data_bench checkpoint` when absent)
#   --ray-backend B     Ray's CNN: auto (torch when importable; default), torch, numpy
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

# --only MODES and --ray-only, read here too (compare_data.py parses them).
only=""
ray_only=0
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --only) only=${args[i + 1]:-} ;;
        --only=*) only=${args[i]#--only=} ;;
        --ray-only) ray_only=1 ;;
    esac
done

if [[ $install_only == 0 ]]; then
    if [[ -z $only ]]; then
        need_examples raylet-data data_throughput
    elif [[ $ray_only == 0 && -z ${DATA_BENCH_BIN:-} ]]; then
        need_examples raylet-data data_bench
    fi
fi

# ray[data]: the data extra's packages (pandas, pyarrow, ...) must import too.
ensure_ray "$RAY_SPEC" "$LOG" "ray.data, pandas, pyarrow, numpy"
log "versions: $("$VENV/bin/python" -c 'import ray, pyarrow; print("ray", ray.__version__, "/ pyarrow", pyarrow.__version__)')"

if [[ ",$only," == *",images,"* ]]; then
    # read_images decodes with pillow.
    if ! ensure_pip "$LOG" "import PIL" pillow; then
        exit 1
    fi
    # The Ray side's CNN: torch on the CPU when it can be had, else numpy (its
    # output says which). setuptools stays below 81, which keeps pkg_resources.
    if ensure_pip "$LOG" "import torch; torch.zeros(1)" torch "setuptools>=77.0.3,<81"; then
        log "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') for the Ray side's CNN"
    else
        log "torch is not usable here; the Ray side's CNN runs on numpy (its results say so)"
        if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" \
               2>/dev/null; then
            # A torch that is there but does not import would break Ray's own
            # `try: import torch` checks, which expect an ImportError.
            "$VENV/bin/pip" uninstall -y torch >> "$LOG" 2>&1 || true
        fi
    fi
fi

if [[ $install_only == 1 ]]; then
    exit 0
fi

exec "$VENV/bin/python" "$ROOT/bench/compare_data.py" "${args[@]+"${args[@]}"}"
