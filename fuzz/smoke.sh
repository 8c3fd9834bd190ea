#!/usr/bin/env bash
# CI smoke run of the fuzz targets: builds every target with cargo-fuzz on
# stable Rust (RUSTC_BOOTSTRAP=1 lets it pass the nightly-only sanitizer
# flags; AddressSanitizer, cargo-fuzz's default), then runs each for about
# 20 s from its committed corpus. A crash, a failed assertion or a leak
# fails the script; the input that did it is left in fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${SECONDS_PER_TARGET:-20}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

cargo fuzz build --fuzz-dir fuzz

# New inputs go to a scratch corpus, so the committed one stays as it is.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo fuzz list --fuzz-dir fuzz); do
    echo "fuzzing $target for ${SECONDS_PER_TARGET}s"
    mkdir -p "$scratch/$target"
    log="$scratch/$target.log"
    if ! cargo fuzz run --fuzz-dir fuzz "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=30 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 80 "$log" >&2
        echo "fuzz target $target failed; the input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units)' "$log"
done
