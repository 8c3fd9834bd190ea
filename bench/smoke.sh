#!/usr/bin/env bash
# Smoke run of every Rust benchmark binary, so that none of them rots: each
# runs a few seconds on its smallest setting, without Ray, and must exit 0
# and print its figures (a line that matches what it prints when it works).
# Nothing here measures or asserts a speed. .ci/run calls it after the tests.
#
#   bench/smoke.sh [--profile debug|release]
#
# Builds the binaries first (`cargo build --bins --examples`, a no-op where
# the tests built them). Prints one line per binary and exits 1 naming the
# ones that failed.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
if [[ ${1:-} == --profile ]]; then
    profile=${2:?--profile takes debug or release}
fi
build_flags=()
[[ $profile == release ]] && build_flags=(--release)
cargo build "${build_flags[@]}" --workspace --bins --examples

bin="target/$profile"
examples="$bin/examples"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()

# smoke NAME PATTERN COMMAND...: runs COMMAND; it passes when it exits 0 and
# its output has a line matching PATTERN (an extended regex).
smoke() {
    local name=$1 pattern=$2 started=$SECONDS
    shift 2
    if "$@" > "$scratch/out" 2>&1 && grep -Eq "$pattern" "$scratch/out"; then
        printf 'PASS %-32s %3ds  %s\n' "$name" $((SECONDS - started)) "$(grep -Em1 "$pattern" "$scratch/out" | cut -c1-100)"
    else
        printf 'FAIL %-32s %3ds\n' "$name" $((SECONDS - started))
        tail -n 30 "$scratch/out" | sed 's/^/    /'
        failed+=("$name")
    fi
}

number='[0-9]+(\.[0-9]+)?'
smoke "raylet microbenchmark --quick" "^generator items \(1 MiB\) per second $number" \
    "$bin/raylet" microbenchmark --quick
smoke allreduce_bench "^\| shm \| 4 \| 1 MiB \| " "$examples/allreduce_bench" --max-mib 1
smoke sharding_bench "^\| Parameters \| 4 \| " "$examples/sharding_bench" --width 256 --steps 2
smoke digits_throughput "^\| 1024 \| 256 \| 2 \| $number" "$examples/digits_throughput" --reps 1 --epochs 2
smoke data_throughput "^files_per_s $number" \
    "$examples/data_throughput" --dir "$scratch/files" --files 300 --size 1024
"$examples/data_bench" sample --output "$scratch/data" --rows 20000 --images 200 > /dev/null
smoke "data_bench parquet" "\"rows_per_s\": ?$number" \
    "$examples/data_bench" parquet --input "$scratch/data/parquet" --output "$scratch/data/parquet-out"
smoke "data_bench shuffle" "\"rows_per_s\": ?$number" \
    "$examples/data_bench" shuffle --input "$scratch/data/parquet" --seed 0
"$examples/data_bench" checkpoint --output "$scratch/data/cnn.ckpt" --seed 0 --epochs 1 > /dev/null
smoke "data_bench images" "\"rows_per_s\": ?$number" \
    "$examples/data_bench" images --input "$scratch/data/images" --checkpoint "$scratch/data/cnn.ckpt"
smoke tune_overhead "\"fit_s\": ?$number" "$examples/tune_overhead" --trials 4 --reports 2
smoke search_quality "median" \
    "$examples/search_quality" --function branin --budget 12 --seeds 2 --searcher tpe
smoke tune_digits "FIFO, the same" "$examples/tune_digits" --samples 3 --epochs 2 --compare
for workload in "tasks_1m 2000" "args_10k 100" "pgs_1000 20" "many_actors 4"; do
    set -- $workload
    smoke "scale_envelope $1" "\"seconds\": ?$number" "$examples/scale_envelope" "$1" --scale "$2"
done

if ((${#failed[@]})); then
    echo "benchmark smoke runs failed: ${failed[*]}" >&2
    exit 1
fi
echo "every benchmark binary ran and printed its figures"
