# Shared parts of bench/compare_*.sh, sourced by them (not run on its own):
# the repository root (made the working directory), the Ray venv at
# target/bench-venv, the --help text, logging, the check that the Rust
# examples are built, and installing Ray into the venv.
#
# Sets SCRIPT (the absolute path of the script that sources this file), ROOT,
# VENV and RAY_VERSION.

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)/$(basename "${BASH_SOURCE[1]}")"
ROOT="$(cd "$(dirname "$SCRIPT")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/target/bench-venv"
RAY_VERSION=2.60.0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# read_args SWITCH ARG...: -h/--help prints the comment block at the top of
# $SCRIPT and exits 0; SWITCH, the script's own option, sets flag=1; every
# other argument goes, in order, into the array args.
read_args() {
    local switch=$1 arg
    shift
    flag=0
    args=()
    for arg in "$@"; do
        case "$arg" in
            "$switch") flag=1 ;;
            -h|--help)
                awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SCRIPT"
                exit 0 ;;
            *) args+=("$arg") ;;
        esac
    done
}

# need_examples PACKAGE EXAMPLE...: exits 1, naming the cargo command that
# builds them, unless every EXAMPLE is in target/release/examples.
need_examples() {
    local package=$1 ex missing=0
    shift
    for ex in "$@"; do
        if [[ ! -x "target/release/examples/$ex" ]]; then
            log "missing target/release/examples/$ex"
            missing=1
        fi
    done
    if [[ $missing == 1 ]]; then
        if [[ $# == 1 ]]; then
            echo "The Rust example is not built; build it first with:" >&2
        else
            echo "The Rust examples are not built; build them first with:" >&2
        fi
        echo "    cargo build --release -p $package --examples" >&2
        exit 1
    fi
}

# pip_errors LOG: the last error lines pip wrote to LOG, on one line.
pip_errors() {
    grep -E 'ERROR|Error' "$1" | tail -n 3 | tr '\n' ' ' | cut -c1-600
}

# ensure_ray SPEC LOG MODULES: appends a header to LOG (under target/bench),
# creates $VENV unless it has a python, and pip-installs SPEC into it unless
# Ray $RAY_VERSION is there and MODULES (comma-separated) import; pip's output
# goes to LOG. Exits 1 when pip fails.
ensure_ray() {
    local spec=$1 log_file=$2 modules=$3
    mkdir -p target/bench
    echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) bench/$(basename "$SCRIPT")" >> "$log_file"

    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV"
        python3 -m venv "$VENV" >> "$log_file" 2>&1
    fi

    if "$VENV/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" >> "$log_file" 2>&1 \
       && "$VENV/bin/python" -c "import $modules" >> "$log_file" 2>&1; then
        log "$spec already installed in $VENV"
    else
        log "installing $spec into $VENV (several minutes; log: $log_file)"
        if ! "$VENV/bin/pip" install --disable-pip-version-check "$spec" >> "$log_file" 2>&1; then
            log "installing $spec failed: $(pip_errors "$log_file")"
            exit 1
        fi
    fi
}

# ensure_pip LOG CHECK SPEC...: pip-installs SPEC... into $VENV (output
# appended to LOG) unless the python code CHECK already runs there without
# error. Returns 1 when pip fails or CHECK still fails after it (the caller
# decides whether that is fatal).
ensure_pip() {
    local log_file=$1 check=$2
    shift 2
    if "$VENV/bin/python" -c "$check" >> "$log_file" 2>&1; then
        log "$1 already installed in $VENV"
        return 0
    fi
    log "installing $* into $VENV (log: $log_file)"
    if ! "$VENV/bin/pip" install --disable-pip-version-check "$@" >> "$log_file" 2>&1; then
        log "installing $* failed: $(pip_errors "$log_file")"
        return 1
    fi
    "$VENV/bin/python" -c "$check" >> "$log_file" 2>&1
}
