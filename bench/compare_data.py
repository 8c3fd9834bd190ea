#!/usr/bin/env python3
"""Side-by-side benchmark of raylet-data against Ray Data 2.60: files per
second through a binary-file read and a trivial per-batch model in a pool of
2 actors; writes bench/data.md and target/bench/data-results.json.

Run it through bench/compare_data.sh, which sets up target/bench-venv
(ray[data] 2.60.0) and runs this file with that venv's python. This driver
uses only the standard library; Ray is imported only in the subprocesses it
starts (with the same python).

The inputs: 10,000 files of 1 KiB (deterministic bytes), made once per run by
`data_throughput --make-only` in target/bench/data-files, the same directory
for both systems. The work, per file: its path, its length and the sum of its
bytes. Ray Data: a fresh python process per repetition running
`ray.init(num_cpus=2)`, then `ray.data.read_binary_files(dir, include_paths=True)
.map_batches(Trivial, concurrency=2, ...)` (Trivial a callable class: an actor
pool of 2) consumed by `take_all()` (or `write_json(<fresh dir>)`), then
`ray.shutdown()`, in two variants:
  - batch64: `batch_size=64, num_cpus=0.5`. With an int batch size Ray does not
    fuse the read into the actors (the read may change the row count), so the
    read runs in tasks of 1 CPU; with the actors' default of 1 CPU each, the
    2 actors hold both CPUs and the read tasks never run (the pipeline hangs),
    hence half a CPU per actor, which leaves one for the reads;
  - blocks: Ray's default batch size (None: each block one batch), under which
    Ray fuses the read into the actor pool (1 CPU per actor), as raylet runs
    every block whole in an actor; Ray's fastest form here.
raylet: target/release/examples/data_throughput (embedded 2-CPU cluster;
`Dataset::read_binary(FileSet::dir(dir)).files_per_block(64)
.map_batches_with(Trivial, 64, ActorPoolStrategy::fixed(2))`, so each actor call
is one batch of 64 files, consumed by `take_all()` or `write_jsonl(<fresh dir>)`).
All time the run (from building the dataset to having every row) apart from
the cluster start, and all check that every file appears exactly once in the
output (a failed check fails the run). The three alternate within each
repetition: Ray first in odd repetitions (1, 3, ...), raylet first in even
ones. Values are medians over the repetitions with their min-max; a ratio is
raylet's files/s over Ray's (how many times faster raylet is), with the
min-max of the per-repetition ratios.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import (MARK, PY, ROOT, WORK, finish_run, fmt_s, fmt_x, leftover_lines, log, machine_info, now_utc,
                      parse_args, ratio_summary, run_line, run_measured, snapshot, versions, with_range)

EXAMPLE = ROOT / "target" / "release" / "examples" / "data_throughput"
BIN_SNAPSHOT = WORK / "data-bin"
FILES_DIR = WORK / "data-files"
REPORT = ROOT / "bench" / "data.md"
RESULTS = WORK / "data-results.json"

FILES = 10_000
SIZE = 1024
BATCH_SIZE = 64
ACTORS = 2
SINKS = ("take_all", "jsonl")
RAY_VARIANTS = ("batch64", "blocks")
TARGET = 10.0

# The Ray Data side: the same trivial work per file as raylet's Trivial model.
RAY_DATA = r'''
import time
t_start = time.perf_counter()
import json, os, sys
import numpy as np
import ray

data_dir, temp_dir, files, batch_size, actors, sink, out_dir, variant = sys.argv[1:9]
files, batch_size, actors = int(files), int(batch_size), int(actors)

class Trivial:
    def __call__(self, batch):
        blobs = batch["bytes"]
        return {"path": batch["path"],
                "size": np.array([len(b) for b in blobs], dtype=np.int64),
                "sum": np.array([sum(b) for b in blobs], dtype=np.int64)}

t_import = time.perf_counter()
ray.init(num_cpus=2, _temp_dir=temp_dir)
ray.data.DataContext.get_current().enable_progress_bars = False
t_init = time.perf_counter()
# batch64: an int batch size keeps the read out of the actors, in tasks of
# 1 CPU; half a CPU per actor leaves one for them (with 1 CPU per actor, the
# actors hold both CPUs and the reads never run). blocks: the default batch
# size (None), under which Ray fuses the read into the actors.
options = dict(batch_size=batch_size, num_cpus=0.5) if variant == "batch64" else {}
ds = ray.data.read_binary_files(data_dir, include_paths=True).map_batches(
    Trivial, concurrency=actors, **options)
if sink == "take_all":
    rows = ds.take_all()
else:
    ds.write_json(out_dir)
t_run = time.perf_counter()
if sink != "take_all":
    rows = []
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
ray.shutdown()
t_end = time.perf_counter()
expected = {os.path.join(data_dir, n): os.path.getsize(os.path.join(data_dir, n)) for n in os.listdir(data_dir)}
seen = {}
for row in rows:
    seen[row["path"]] = seen.get(row["path"], 0) + 1
    if expected.get(row["path"]) != row["size"]:
        sys.exit(f"unexpected row {row}")
repeated = sum(1 for n in seen.values() if n > 1)
if len(rows) != len(expected) or len(seen) != len(expected) or repeated or len(rows) != files:
    sys.exit(f"{len(rows)} rows for {len(expected)} files: {len(seen)} distinct, {repeated} repeated")
seconds = t_run - t_init
print("@@RESULT@@ " + json.dumps({
    "files": len(rows), "sink": sink, "variant": variant, "import_s": round(t_import - t_start, 4), "init_s": round(t_init - t_import, 4),
    "seconds": round(seconds, 4), "files_per_s": round(len(rows) / seconds, 1),
    "shutdown_s": round(t_end - t_run, 4), "ray": ray.__version__,
}), flush=True)
'''


# ---------------------------------------------------------------- measurements


def ray_data(rep, sink, variant):
    temp_dir = Path(f"/tmp/rd{os.getpid()}r{rep}")  # short: Ray's socket paths must fit 107 bytes
    out_dir = Path(tempfile.mkdtemp(prefix=f"data-ray-r{rep}-", dir=WORK)) / "out"
    try:
        wall, out, err, left = run_measured(
            [PY, "-c", RAY_DATA, FILES_DIR, temp_dir, FILES, BATCH_SIZE, ACTORS, sink, out_dir, variant],
            timeout=600, what=f"Ray Data rep {rep} ({sink}, {variant})")
        line = next((l for l in reversed(out.splitlines()) if l.startswith(MARK)), None)
        if line is None:
            raise RuntimeError(f"Ray Data rep {rep}: no result line in output:\n{out[-3000:]}\n{err[-3000:]}")
        res = json.loads(line[len(MARK):])
        res["process_wall_s"] = round(wall, 4)
        res["leftover_processes"] = leftover_lines(left)
        res["stderr_tail"] = err[-1500:]
        return res
    finally:
        shutil.rmtree(out_dir.parent, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def key_values(out):
    """The `key value` lines data_throughput prints, numbers parsed."""
    res = {}
    for line in out.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value:
            try:
                res[key] = int(value) if value.isdigit() else float(value)
            except ValueError:
                res[key] = value
    return res


def raylet_data(rep, sink, binary):
    wall, out, _, left = run_measured(
        [binary, "--dir", FILES_DIR, "--files", FILES, "--batch-size", BATCH_SIZE, "--files-per-block", BATCH_SIZE,
         "--actors", ACTORS, "--sink", sink], timeout=600, what=f"raylet data_throughput rep {rep} ({sink})")
    res = key_values(out)
    if res.get("files") != FILES or "files_per_s" not in res:
        raise RuntimeError(f"raylet rep {rep}: {out[-2000:]}")
    res["process_wall_s"] = round(wall, 4)
    res["leftover_processes"] = leftover_lines(left)
    return res


# ---------------------------------------------------------------- report


def fmt_rate(v):
    return f"{v:,.0f}"


def summary_rate(values):
    """The median of rates, with their min–max."""
    return with_range(statistics.median(values), values, fmt_rate)


SINK_TEXT = {
    "take_all": "`take_all()` (every row collected in the driver)",
    "jsonl": "JSON lines written to a fresh directory (Ray: `write_json(dir)`; raylet: `write_jsonl(dir)`, "
             "which also syncs each block's file and records it in a manifest)",
}
SIDE_TEXT = {
    "ray": "Ray `batch_size=64`",
    "ray_blocks": "Ray default batches",
    "raylet": "raylet",
}


def write_report(res):
    L = []
    w = L.append
    vers = res["versions"]
    w(run_line(res, "compare_data.sh")
      + f": raylet-data (the `data_throughput` example of `target/release`) against Ray Data "
      f"{vers.get('ray', '?')} (`ray[data]==2.60.0` from pip in `target/bench-venv`, Python {vers.get('python', '?')}, "
      f"pyarrow {vers.get('pyarrow', '?')}). A Rust build may have been running alongside on this shared machine, "
      "so the absolute timings are noisy; the systems were measured side by side, alternating, so the "
      "ratios are the figures to read.\n")
    w(f"### Files per second: {res['files']:,} files of {res['size']:,} bytes, a trivial model in "
      f"{res['actors']} actors\n")
    w(f"The same {res['files']:,} files (deterministic bytes, made once by `data_throughput --make-only` in "
      "`target/bench/data-files`) for all. Per file, the model returns its path, its length and the sum of its "
      "bytes. Ray Data: a fresh python process per run with `ray.init(num_cpus=2)`, then "
      "`ray.data.read_binary_files(dir, include_paths=True).map_batches(Trivial, concurrency=2, ...)` "
      "(`Trivial` a callable class, so a pool of 2 actors; default batch format, progress bars off), then "
      "`ray.shutdown()`; `RAY_USAGE_STATS_ENABLED=0`. Two Ray variants: **`batch_size=64`** (with `num_cpus=0.5`: "
      "with an int batch size Ray keeps the read out of the actors, in tasks of 1 CPU, and with the actors' "
      "default of 1 CPU each the two actors hold both CPUs and the reads never run; the pipeline hung for 10 "
      "minutes here), and **default batches** (`batch_size=None`, each block one batch; Ray then fuses the read "
      "into the actor pool, `ActorPoolMapOperator[ReadBinary->MapBatches(Trivial)]`, 1 CPU per actor; Ray's "
      f"fastest form here). raylet: `data_throughput --dir DIR --files {res['files']} --batch-size "
      f"{res['batch_size']} --files-per-block {res['batch_size']} --actors {res['actors']} --sink S` (an "
      "embedded 2-CPU cluster in the process; `Dataset::read_binary(FileSet::dir(dir))"
      f".files_per_block({res['batch_size']}).map_batches_with(Trivial, {res['batch_size']}, "
      "ActorPoolStrategy::fixed(2))`, each block read and processed whole in an actor, one batch per call; "
      "progress bar off). The run is timed from building the dataset to having every row, apart from the "
      "cluster start; each run then checks that every file appears exactly once (a failed check fails the "
      f"benchmark). {res['reps_n']} repetition{'' if res['reps_n'] == 1 else 's'}, Ray first in odd ones, raylet first in even ones; median "
      "(min–max), and the ratio of the medians with the min–max of the per-repetition ratios.\n")
    w("| consumed by | Ray Data 2.60, `batch_size=64` | Ray Data 2.60, default batches | raylet-data | "
      "raylet / Ray `batch_size=64` | raylet / Ray default batches |")
    w("|---|---:|---:|---:|---:|---:|")
    verdicts = []
    for sink in res["sinks"]:
        reps = [r for r in res["reps"] if r["sink"] == sink]
        if not reps:
            continue
        rate = {side: [r[side]["files_per_s"] for r in reps] for side in SIDE_TEXT}
        w(f"| {SINK_TEXT[sink]} | {summary_rate(rate['ray'])} files/s | {summary_rate(rate['ray_blocks'])} files/s | "
          f"{summary_rate(rate['raylet'])} files/s | {ratio_summary(rate['raylet'], rate['ray'])} | "
          f"{ratio_summary(rate['raylet'], rate['ray_blocks'])} |")
        for side in ("ray", "ray_blocks"):
            x = statistics.median(rate["raylet"]) / statistics.median(rate[side])
            verdicts.append(f"`{sink}` against {SIDE_TEXT[side]}: {fmt_x(x)} — "
                            f"{'met' if x >= TARGET else '**not met**'}")
    w("")
    w(f"Target (the issue): raylet-data ≥ {TARGET:.0f}× Ray Data's files/s. " + "; ".join(verdicts) + ".\n")
    w("| rep | consumed by | order | Ray `batch_size=64` | Ray default batches | raylet | ratios | "
      "Ray init | raylet init |")
    w("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in res["reps"]:
        a, c, b = r["ray"], r["ray_blocks"], r["raylet"]
        w(f"| {r['rep']} | `{r['sink']}` | {', '.join(SIDE_TEXT[s] for s in r['order'])} | "
          f"{fmt_rate(a['files_per_s'])} | {fmt_rate(c['files_per_s'])} | {fmt_rate(b['files_per_s'])} | "
          f"{fmt_x(b['files_per_s'] / a['files_per_s'])}, {fmt_x(b['files_per_s'] / c['files_per_s'])} | "
          f"{fmt_s(statistics.median([a['init_s'], c['init_s']]))} | {fmt_s(b['init_s'])} |")
    w("")
    reps = res["reps"]
    if reps:
        rays = [r[side] for r in reps for side in ("ray", "ray_blocks")]
        w("Cluster start, not in the run times above, median over the runs: Ray `ray.init(num_cpus=2)` "
          f"{fmt_s(statistics.median(x['init_s'] for x in rays))} (and `import ray` "
          f"{fmt_s(statistics.median(x['import_s'] for x in rays))} before it), raylet "
          f"`raylet::init_with(Config::default().num_cpus(2.0))` "
          f"{fmt_s(statistics.median(r['raylet']['init_s'] for r in reps))}. Run times, median: "
          + "; ".join(f"`{sink}`: " + ", ".join(
              f"{SIDE_TEXT[side]} {fmt_s(statistics.median(r[side]['seconds'] for r in reps if r['sink'] == sink))}"
              for side in SIDE_TEXT) for sink in res["sinks"] if any(r["sink"] == sink for r in reps)) + ".\n")
    w("<details><summary>Per-run results (also in <code>target/bench/data-results.json</code>, "
      "not committed)</summary>\n")
    w("```")
    for r in reps:
        for side in r["order"]:
            d = {k: v for k, v in r[side].items() if k not in ("stderr_tail", "leftover_processes")}
            w(f"rep {r['rep']} {r['sink']:8} {side:10} {json.dumps(d)}")
    w("```\n")
    w("</details>\n")
    REPORT.write_text("\n".join(L))


# ---------------------------------------------------------------- main


def snapshot_binary():
    """Copies the example to target/bench/data-bin so that a rebuild during
    the run cannot swap it between repetitions."""
    if not EXAMPLE.exists():
        sys.exit(f"missing {EXAMPLE}; build it with: cargo build --release -p raylet-data --examples")
    BIN_SNAPSHOT.mkdir(parents=True, exist_ok=True)
    return snapshot(EXAMPLE, BIN_SNAPSHOT)


def make_files(binary):
    """The inputs, made afresh in target/bench/data-files by the example itself."""
    shutil.rmtree(FILES_DIR, ignore_errors=True)
    run_measured([binary, "--dir", FILES_DIR, "--files", FILES, "--size", SIZE, "--make-only"], timeout=600,
                 what="making the input files")
    made = len(os.listdir(FILES_DIR))
    if made != FILES:
        raise RuntimeError(f"{FILES_DIR} holds {made} files, not {FILES}")


def main():
    global FILES
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--sink", choices=SINKS + ("both",), default="both",
                   help="how all consume the rows: take_all, jsonl or both (default both)")
    p.add_argument("--files", type=int, default=FILES, help=f"input files (default {FILES})")
    args = parse_args(p, REPORT, write_report)

    FILES = args.files
    sinks = list(SINKS) if args.sink == "both" else [args.sink]
    res = {
        "started": now_utc(),
        "argv": sys.argv[1:], "machine": machine_info(), "versions": versions("ray", "pyarrow"),
        "files": FILES, "size": SIZE, "batch_size": BATCH_SIZE, "actors": ACTORS, "sinks": sinks,
        "reps_n": args.reps, "reps": [],
    }
    binary, res["binary"] = snapshot_binary()
    log(f"versions {res['versions']}; binary {res['binary']}")
    try:
        make_files(binary)
        log(f"made {FILES} files of {SIZE} bytes in {FILES_DIR}")
        for rep in range(1, args.reps + 1):
            order = ["ray", "ray_blocks", "raylet"]
            if rep % 2 == 0:
                order.reverse()
            for sink in sinks:
                row = {"rep": rep, "sink": sink, "order": order}
                for side in order:
                    log(f"rep {rep}/{args.reps} ({sink}): {SIDE_TEXT[side]}")
                    if side == "raylet":
                        row[side] = raylet_data(rep, sink, binary)
                    else:
                        row[side] = ray_data(rep, sink, "batch64" if side == "ray" else "blocks")
                    log(f"    {row[side]['files_per_s']:,.0f} files/s ({row[side]['seconds']:.3f} s; "
                        f"init {row[side]['init_s']:.3f} s)")
                row["ratio"] = row["raylet"]["files_per_s"] / row["ray"]["files_per_s"]
                row["ratio_blocks"] = row["raylet"]["files_per_s"] / row["ray_blocks"]["files_per_s"]
                log(f"    raylet / Ray: {row['ratio']:.1f}x (batch_size=64), {row['ratio_blocks']:.1f}x (default batches)")
                res["reps"].append(row)
                RESULTS.write_text(json.dumps(res, indent=1))
    finally:
        finish_run(res, RESULTS, "/tmp/rd")
    write_report(res)
    log(f"wrote {REPORT} and {RESULTS}")


if __name__ == "__main__":
    main()
