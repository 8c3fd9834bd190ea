#!/usr/bin/env bash
# `raylet microbenchmark` of two commits side by side, alternating runs, for
# a change that must not slow anything down (issue 51's rule: any row more
# than 5% slower is explained or fixed).
#
#   bench/compare_commits.sh BEFORE AFTER [--reps N] [--filter METRIC] [--out FILE]
#
# 1. Checks out each commit in a worktree of its own under target/commits/
#    and builds its `raylet` binary there (`cargo build --release --bin
#    raylet`), each worktree in its own target folder, seeded with a copy of
#    this checkout's target/release so that only raylet's crates build.
# 2. Runs bench/compare_commits.py: BEFORE, AFTER, BEFORE, AFTER, ... one
#    whole `raylet microbenchmark` run each (or only --filter's metric), and
#    writes the table (medians with ranges, AFTER/BEFORE) to
#    target/bench/commits.md or --out FILE.
#
# The worktrees stay for the next run; `git worktree remove` them when done.
set -euo pipefail

[[ $# -ge 2 ]] || { sed -n 2,16p "$0"; exit 2; }
before=$(git rev-parse --short "$1")
after=$(git rev-parse --short "$2")
shift 2
mkdir -p target/commits target/bench

build() {
    local commit=$1 dir=target/commits/$1
    if [[ ! -d $dir ]]; then
        git worktree add --detach "$dir" "$commit" >&2
    fi
    if [[ ! -d $dir/target/release && -d target/release ]]; then
        mkdir -p "$dir/target"
        cp -r target/release "$dir/target/release"
    fi
    (cd "$dir" && cargo build --release --bin raylet >&2)
    echo "$dir/target/release/raylet"
}

before_bin=$(build "$before")
after_bin=$(build "$after")
python3 bench/compare_commits.py --before "$before=$before_bin" --after "$after=$after_bin" "$@"
