#!/usr/bin/env bash
# Side-by-side benchmark of raylet-tune against Ray Tune 2.60.0 and Optuna's TPE;
# writes bench/tune.md.
#
#   bench/compare_tune.sh [--reps N] [--trials N] [--skip-overhead] [--skip-quality] [--install-only]
#
# 1. Checks that the Rust examples are built (it never builds them); if not,
#    prints the command and exits 1:
#      cargo build --release -p raylet-tune --examples
# 2. Ensures a venv at target/bench-venv (reused when it already has both) with
#    ray[tune]==2.60.0 and Optuna 5.0.x (pip's `optuna==5.0.*`; when no 5.0
#    release can be installed, the newest Optuna, and the report says so).
#    The pip output is appended to target/bench/tune-install.log.
# 3. Runs bench/compare_tune.py with the venv's python, which measures
#    - overhead: 100 trivial trials x 10 reports each, 1 CPU per trial on 2 CPUs,
#      Ray Tune (fresh `ray.init(num_cpus=2)` subprocess) against raylet's
#      `tune_overhead`, each with trial actors reused and not (Ray's
#      `TuneConfig(reuse_actors=False|True)`, `tune_overhead --reuse-actors
#      false|true`), the four runs of a repetition alternating systems;
#    - search quality: Optuna TPESampler(seed=s) against raylet's `search_quality`
#      (tpe and random) on Branin and Hartmann6, budgets 50 and 100, seeds 0..99
#      (medians over 0..9 and over all, and how often raylet beats Optuna);
#    - ASHA vs FIFO: `tune_digits --compare` (the same 16 digits-MLP trials
#      under each, optimizing accuracy on a validation split; the epochs each
#      trained, and the test accuracy of the trial each chose);
#    and writes bench/tune.md (a section that bench/compare_ray.py inlines into
#    BENCHMARKS.md) and the raw numbers to target/bench/tune-results.json.
#
# Options (passed through to bench/compare_tune.py, except --install-only):
#   --reps N          overhead repetitions (default 3)
#   --trials N        overhead trials per run (default 100)
#   --skip-overhead   only the search-quality and ASHA-vs-FIFO parts
#   --skip-quality    only the overhead part
#   --install-only    set up the venv and stop
#
# Every process a measurement starts runs in its own session, and each Ray run
# has a temp dir of its own (/tmp/rt<pid>r<rep>); after a run exits, whatever
# is left of its session or names its temp dir (Ray's gcs, raylet, workers),
# with their descendants, is ended by pid (SIGTERM, then SIGKILL), and a final
# check does the same for every temp dir of the script before it exits. No
# other process is touched: not every process running from target/bench-venv,
# which other work on the machine may be using, and not `ray stop --force`,
# which matches processes by the name `raylet`, as this project's binary is named.
# Needs: python3 (with venv).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
RAY_SPEC="ray[tune]==$RAY_VERSION"
OPTUNA_SPEC='optuna==5.0.*'
LOG=target/bench/tune-install.log

read_args --install-only "$@"
install_only=$flag

if [[ $install_only == 0 ]]; then
    need_examples raylet-tune tune_overhead search_quality tune_digits
fi

# ray[tune]: the tune extra's packages (pandas, pyarrow, ...) must import too.
ensure_ray "$RAY_SPEC" "$LOG" "ray.tune, pandas, pyarrow"

optuna_note=""
if "$VENV/bin/python" -c "import optuna, sys; sys.exit(not optuna.__version__.startswith('5.0.'))" >> "$LOG" 2>&1; then
    log "Optuna $("$VENV/bin/python" -c 'import optuna; print(optuna.__version__)') already installed in $VENV"
else
    log "installing $OPTUNA_SPEC into $VENV"
    if ! "$VENV/bin/pip" install --disable-pip-version-check "$OPTUNA_SPEC" >> "$LOG" 2>&1; then
        log "no Optuna 5.0.x could be installed; installing the newest Optuna instead"
        "$VENV/bin/pip" install --disable-pip-version-check --upgrade optuna >> "$LOG" 2>&1
        optuna_note="Optuna 5.0.x was not installable with pip here; the newest available Optuna was used instead."
    fi
fi
log "versions: $("$VENV/bin/python" -c 'import ray, optuna; print("ray", ray.__version__, "/ optuna", optuna.__version__)')"

if [[ $install_only == 1 ]]; then
    exit 0
fi

note_args=()
if [[ -n $optuna_note ]]; then
    note_args=(--optuna-note "$optuna_note")
fi
exec "$VENV/bin/python" "$ROOT/bench/compare_tune.py" "${args[@]+"${args[@]}"}" "${note_args[@]+"${note_args[@]}"}"
