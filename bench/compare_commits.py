"""Alternating `raylet microbenchmark` runs of two builds, and the table of
their rates; see bench/compare_commits.sh."""

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

LINE = re.compile(r"^(.+?) per second ([0-9.eE+-]+|nan) \+- ([0-9.eE+-]+|nan)\s*$", re.M)
# A row this much slower after the change needs an explanation or a fix.
SLOWER = 0.95


def rates(binary, metric):
    """Every metric's mean rate from one run of `raylet microbenchmark`."""
    cmd = [binary, "microbenchmark"] + (["--filter", metric] if metric else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {name: float(rate) for name, rate, _ in LINE.findall(proc.stdout)}


def summary(values):
    median = statistics.median(values)
    return f"{median:,.1f} ({min(values):,.1f}–{max(values):,.1f})"


def table(before, after, runs):
    name_before, name_after = before[0], after[0]
    lines = [
        f"| metric | {name_before} (before) | {name_after} (after) | after / before |",
        "|---|---|---|---|",
    ]
    for metric in runs[name_before]:
        old, new = runs[name_before][metric], runs[name_after].get(metric, [])
        if not new:
            continue
        ratio = statistics.median(new) / statistics.median(old)
        flag = " **slower by more than 5%**" if ratio < SLOWER else ""
        lines.append(f"| {metric} | {summary(old)} | {summary(new)} | {ratio:.2f}{flag} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="NAME=BINARY")
    parser.add_argument("--after", required=True, help="NAME=BINARY")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--filter", default="")
    parser.add_argument("--out", default="target/bench/commits.md")
    args = parser.parse_args()
    before, after = args.before.split("=", 1), args.after.split("=", 1)
    runs = {before[0]: {}, after[0]: {}}
    for rep in range(args.reps):
        for name, binary in (before, after) if rep % 2 == 0 else (after, before):
            print(f"run {rep + 1}/{args.reps}: {name}", file=sys.stderr, flush=True)
            for metric, rate in rates(binary, args.filter).items():
                runs[name].setdefault(metric, []).append(rate)
    report = (
        f"`raylet microbenchmark`, {args.reps} runs of each build, alternating; operations per second, "
        f"medians with (min–max); higher is better.\n\n" + table(before, after, runs)
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
