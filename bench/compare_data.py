#!/usr/bin/env python3
"""Side-by-side benchmark of raylet-data against Ray Data 2.60: files per
second through a binary-file read and a trivial per-batch model in a pool of
2 actors, and the peak memory of the driver and of the workers; writes
bench/data.md and target/bench/data-results.json.

Run it through bench/compare_data.sh, which sets up target/bench-venv
(ray[data] 2.60.0) and runs this file with that venv's python. This driver
uses only the standard library; Ray is imported only in the subprocesses it
starts (with the same python).

Two workloads, each its own set of inputs (deterministic bytes, made by
`data_throughput --make-only` and the same directory for both systems):
  - small: 10,000 files of 1 KiB in target/bench/data-files (made afresh);
  - large: 100,000 files of 100 KiB (10.2 GB) in target/bench/data-files-large
    (made once, and reused while it holds exactly those files), which makes
    the runs long enough for the ratio to measure throughput rather than the
    pipelines' start.
Before every run the harness reads every input file, so that each run starts
with all of them in the page cache (the large set fits in this machine's
memory), whatever the run before it evicted.

The work, per file: its path, its length and the sum of its bytes. Ray Data:
a fresh python process per run with `ray.init(num_cpus=2)`, then
`ray.data.read_binary_files(dir, include_paths=True).map_batches(Trivial,
concurrency=2, ...)` (Trivial a callable class: an actor pool of 2, summing
each file's bytes with numpy) consumed by `take_all()` (or
`write_json(<fresh dir>)`), then `ray.shutdown()`, in two variants:
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
output (a failed check fails the run). While a run goes on, the harness
samples /proc every 0.1 s: the driver's VmHWM, and the summed VmRSS of its
workers (every other process of the run: Ray's cluster processes and `ray::`
workers; raylet's worker processes, re-executed from the driver binary).
The three alternate within each repetition: Ray first in odd repetitions
(1, 3, ...), raylet first in even ones. Values are medians over the
repetitions with their min-max; a ratio is raylet's files/s over Ray's (how
many times faster raylet is), or Ray's memory over raylet's (how many times
less raylet holds), with the min-max of the per-repetition ratios.

With --only parquet|images|shuffle (a comma-separated list runs several), it
runs instead the Parquet, images and shuffle benchmarks of issue 33, which
live in bench/compare_data_wave2.py (see its docstring; raylet's side is the
`data_bench` example, whose contract is written there in one place) and
write bench/data_<mode>.md and target/bench/data-<mode>-results.json.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from benchlib import (MARK, PY, ROOT, WORK, add_descendants, fmt_s, fmt_x, leftover_lines, log, finish_run, machine_info,
                      now_utc, parse_args, proc_table, ratio_summary, run_line, run_measured, snapshot, versions,
                      with_range)

EXAMPLE = ROOT / "target" / "release" / "examples" / "data_throughput"
BIN_SNAPSHOT = WORK / "data-bin"
REPORT = ROOT / "bench" / "data.md"
RESULTS = WORK / "data-results.json"

# name: (default files, default bytes per file, directory, made afresh for each run of this script)
WORKLOADS = {
    "small": (10_000, 1024, WORK / "data-files", True),
    "large": (100_000, 100 * 1024, WORK / "data-files-large", False),
}
# Why a set is as large as it is, in the report (for its default size).
WHY = {
    "large": "This set is 100× the small one in bytes and 10× in files; it was chosen over the other way to be "
             "100× larger, 1,000,000 files of 1 KiB, because its runs are long (Ray's tens of seconds, raylet's "
             "seconds), so that the pipelines' start is a small part of them, and because they move data (read, "
             "hand to the actors, sum) as well as pay per-file costs, which the small set already shows; a million "
             "1 KiB files would measure per-file costs only, at about 4 minutes per Ray run here (its small-set "
             "rate).",
}
BATCH_SIZE = 64
ACTORS = 2
SINKS = ("take_all", "jsonl")
TARGET = 10.0
# How often the memory of a run's processes is sampled, in seconds, and the
# fewest samples of a run for a report to give a set's peak memory.
SAMPLE_S = 0.1
MIN_SAMPLES = 10
# The longest one run may take, in seconds.
RUN_TIMEOUT = 1800

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
                "sum": np.array([np.frombuffer(b, dtype=np.uint8).sum() for b in blobs], dtype=np.int64)}

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


# ---------------------------------------------------------------- processes


# ---------------------------------------------------------------- memory


def status_kib(pid, keys):
    """{key: KiB} for the `key:` lines of /proc/pid/status (0 where absent)."""
    values = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in values:
                    values[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return values


class MemoryPeaks:
    """Around the run_measured call that runs `cmd` (`with MemoryPeaks(cmd) as
    peaks:`), samples /proc every SAMPLE_S seconds in a thread: the driver
    (the child this harness started, in a session of its own, once it runs
    `cmd`: before its exec it is a copy of this harness) and its workers
    (every other process of that session or descended from the driver).
    Keeps the driver's
    VmHWM and the peaks of the workers' summed VmRSS and summed RssAnon
    (their private memory: shared pages, such as an object store's, count
    in the RSS of every process that maps them), in KiB."""

    def __init__(self, cmd):
        self._cmdline = " ".join(map(str, cmd[:2]))

    def __enter__(self):
        self.peaks = {"driver_hwm_kib": 0, "workers_rss_kib": 0, "workers_anon_kib": 0, "workers_most": 0,
                      "samples": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample_until_stopped(self):
        while True:
            self._sample()
            if self._stop.wait(SAMPLE_S):
                return

    def _sample(self):
        table = proc_table()
        driver = next((pid for pid, (ppid, sid, cmdline) in table.items()
                       if ppid == os.getpid() and sid == pid and cmdline.startswith(self._cmdline)), None)
        if driver is None:
            return
        run = {pid for pid, row in table.items() if row[1] == driver} | {driver}
        add_descendants(table, run, exclude={os.getpid()})
        workers = [status_kib(pid, ("VmRSS", "RssAnon")) for pid in run - {driver}]
        p = self.peaks
        p["driver_hwm_kib"] = max(p["driver_hwm_kib"], status_kib(driver, ("VmHWM",))["VmHWM"])
        p["workers_rss_kib"] = max(p["workers_rss_kib"], sum(w["VmRSS"] for w in workers))
        p["workers_anon_kib"] = max(p["workers_anon_kib"], sum(w["RssAnon"] for w in workers))
        p["workers_most"] = max(p["workers_most"], len(workers))
        p["samples"] += 1


# ---------------------------------------------------------------- measurements


def warm_cache(directory):
    """Reads every file in `directory`, so that the run after it finds them
    all in the page cache."""
    buf = bytearray(1 << 20)
    for entry in os.scandir(directory):
        with open(entry.path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def ray_data(wl, rep, sink, variant):
    what = f"Ray Data {wl['name']} rep {rep} ({sink}, {variant})"
    temp_dir = Path(f"/tmp/rd{os.getpid()}r{rep}")  # short: Ray's socket paths must fit 107 bytes
    out_dir = Path(tempfile.mkdtemp(prefix=f"data-ray-r{rep}-", dir=WORK)) / "out"
    cmd = [PY, "-c", RAY_DATA, wl["dir"], temp_dir, wl["files"], BATCH_SIZE, ACTORS, sink, out_dir, variant]
    try:
        with MemoryPeaks(cmd) as memory:
            wall, out, err, left = run_measured(cmd, timeout=RUN_TIMEOUT, what=what, marker=temp_dir)
        line = next((l for l in reversed(out.splitlines()) if l.startswith(MARK)), None)
        if line is None:
            raise RuntimeError(f"{what}: no result line in output:\n{out[-3000:]}\n{err[-3000:]}")
        res = json.loads(line[len(MARK):])
        res.update(memory.peaks, process_wall_s=round(wall, 4), leftover_processes=leftover_lines(left),
                   stderr_tail=err[-1500:])
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


def raylet_data(wl, rep, sink, binary):
    what = f"raylet data_throughput {wl['name']} rep {rep} ({sink})"
    cmd = [binary, "--dir", wl["dir"], "--files", wl["files"], "--batch-size", BATCH_SIZE, "--files-per-block",
           BATCH_SIZE, "--actors", ACTORS, "--sink", sink]
    with MemoryPeaks(cmd) as memory:
        wall, out, _, left = run_measured(cmd, timeout=RUN_TIMEOUT, what=what)
    res = key_values(out)
    if res.get("files") != wl["files"] or "files_per_s" not in res:
        raise RuntimeError(f"{what}: {out[-2000:]}")
    res.update(memory.peaks, process_wall_s=round(wall, 4), leftover_processes=leftover_lines(left))
    return res


def run_side(wl, rep, sink, side, binary):
    """One run of one side, on a warm page cache."""
    warm_cache(wl["dir"])
    if side == "raylet":
        return raylet_data(wl, rep, sink, binary)
    return ray_data(wl, rep, sink, "batch64" if side == "ray" else "blocks")


def measure(wl, reps, sinks, binary, save):
    """The workload's repetitions, each running every side on every sink,
    alternating the order; calls save() after each row."""
    for rep in range(1, reps + 1):
        order = list(SIDE_TEXT)
        if rep % 2 == 0:
            order.reverse()
        for sink in sinks:
            row = {"rep": rep, "sink": sink, "order": order}
            for side in order:
                log(f"{wl['name']} rep {rep}/{reps} ({sink}): {SIDE_TEXT[side]}")
                row[side] = run_side(wl, rep, sink, side, binary)
                log(f"    {row[side]['files_per_s']:,.0f} files/s ({row[side]['seconds']:.3f} s; init "
                    f"{row[side]['init_s']:.3f} s); driver peak {fmt_mib(row[side]['driver_hwm_kib'])}, workers' "
                    f"peak {fmt_mib(row[side]['workers_rss_kib'])}")
            row["ratio"] = row["raylet"]["files_per_s"] / row["ray"]["files_per_s"]
            row["ratio_blocks"] = row["raylet"]["files_per_s"] / row["ray_blocks"]["files_per_s"]
            log(f"    raylet / Ray: {row['ratio']:.1f}x (batch_size=64), {row['ratio_blocks']:.1f}x (default batches)")
            wl["reps"].append(row)
            save()


# ---------------------------------------------------------------- report


def fmt_rate(v):
    return f"{v:,.0f}"


def summary_rate(values):
    """The median of rates, with their min–max."""
    return with_range(statistics.median(values), values, fmt_rate)


def fmt_mib(kib):
    return f"{kib / 1024:,.0f} MiB"


def summary_mib(values):
    """The median of KiB figures in MiB, with their min–max."""
    return with_range(statistics.median(values), values, fmt_mib, unit_chars=4)


def fmt_bytes(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n < 1e7 else f"{n / 1e6:.0f} MB"


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
MEMORY_TEXT = {
    "driver_hwm_kib": "driver (its VmHWM)",
    "workers_rss_kib": "workers, summed RSS",
    "workers_anon_kib": "workers, summed private (RssAnon)",
}


def write_setup(w, res):
    """What every run does, whatever its inputs."""
    largest = fmt_bytes(max(wl["files"] * wl["size"] for wl in res["workloads"]))
    w("For every set of inputs below: the same files (deterministic bytes, made by `data_throughput --make-only`) "
      "for all. Per file, the model returns its path, its length and the sum of its bytes. Ray Data: a fresh "
      "python process per run with `ray.init(num_cpus=2)`, then `ray.data.read_binary_files(dir, "
      "include_paths=True).map_batches(Trivial, concurrency=2, ...)` (`Trivial` a callable class, so a pool of 2 "
      "actors, summing each file's bytes with `np.frombuffer(b, np.uint8).sum()`; default batch format, progress "
      "bars off), then `ray.shutdown()`; `RAY_USAGE_STATS_ENABLED=0`. Two Ray variants: **`batch_size=64`** "
      "(with `num_cpus=0.5`: with an int batch size Ray keeps the read out of the actors, in tasks of 1 CPU, and "
      "with the actors' default of 1 CPU each the two actors hold both CPUs and the reads never run; the pipeline "
      "hung for 10 minutes here), and **default batches** (`batch_size=None`, each block one batch; Ray then "
      "fuses the read into the actor pool, `ActorPoolMapOperator[ReadBinary->MapBatches(Trivial)]`, 1 CPU per "
      "actor; Ray's fastest form here). raylet: `data_throughput --dir DIR --files N --batch-size "
      f"{res['batch_size']} --files-per-block {res['batch_size']} --actors {res['actors']} --sink S` (an "
      "embedded 2-CPU cluster in the process; `Dataset::read_binary(FileSet::dir(dir))"
      f".files_per_block({res['batch_size']}).map_batches_with(Trivial, {res['batch_size']}, "
      "ActorPoolStrategy::fixed(2))`, each block read and processed whole in an actor, one batch per call, the sum "
      "a Rust iterator; progress bar off). The run is timed from building the dataset to having every row, apart "
      "from the cluster start; each run then checks that every file appears exactly once (a failed check fails "
      "the benchmark). **Page cache:** warm. Before every run the harness reads every input file, so that each "
      f"run starts with all of them cached (the largest set, {largest}, fits in the machine's memory), "
      "whatever the run before it evicted; a run reads the disk only where memory use evicts its inputs. "
      "**Memory:** "
      f"while a run goes on, the harness samples `/proc` every {SAMPLE_S} s: the driver's peak RSS (its `VmHWM`) "
      "and the sum of the RSS of its workers, every other process of the run (its session and the driver's "
      "descendants: Ray's GCS, raylet, dashboard and agents and its `ray::` workers; raylet's worker processes, "
      "which the embedded cluster re-executes from the driver binary), whose peak is given; shared pages, such "
      "as an object store's, count once in the RSS of each process that maps them, so the summed private "
      f"memory (`RssAnon`) is given too. {res['reps_n']} repetition{'' if res['reps_n'] == 1 else 's'} per set, "
      "the three runs of each alternating (Ray `batch_size=64`, Ray default batches, raylet in odd ones, the "
      "reverse in even ones); median (min–max), and the ratio of the medians with the min–max of the "
      "per-repetition ratios.\n")


def write_rates(w, wl, sinks):
    w("| consumed by | Ray Data 2.60, `batch_size=64` | Ray Data 2.60, default batches | raylet-data | "
      "raylet / Ray `batch_size=64` | raylet / Ray default batches |")
    w("|---|---:|---:|---:|---:|---:|")
    verdicts = []
    for sink in sinks:
        reps = [r for r in wl["reps"] if r["sink"] == sink]
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
    w("In bytes of input per second, medians: " + "; ".join(byte_rates(wl, sinks)) + ".\n")


def byte_rates(wl, sinks):
    """Per sink, each side's median files/s as bytes/s."""
    parts = []
    for sink in sinks:
        reps = [r for r in wl["reps"] if r["sink"] == sink]
        if reps:
            median = {side: statistics.median(r[side]["files_per_s"] for r in reps) for side in SIDE_TEXT}
            parts.append(f"`{sink}`: " + ", ".join(f"{SIDE_TEXT[side]} {fmt_bytes(wl['size'] * rate)}/s"
                                                   for side, rate in median.items()))
    return parts


def write_memory(w, wl, sinks):
    w("| consumed by | peak memory | Ray Data 2.60, `batch_size=64` | Ray Data 2.60, default batches | raylet-data | "
      "Ray `batch_size=64` / raylet (raylet holds × less) | Ray default batches / raylet |")
    w("|---|---|---:|---:|---:|---:|---:|")
    for sink in sinks:
        reps = [r for r in wl["reps"] if r["sink"] == sink]
        if not reps:
            continue
        for key, text in MEMORY_TEXT.items():
            kib = {side: [r[side][key] for r in reps] for side in SIDE_TEXT}
            w(f"| `{sink}` | {text} | {summary_mib(kib['ray'])} | {summary_mib(kib['ray_blocks'])} | "
              f"{summary_mib(kib['raylet'])} | {ratio_summary(kib['ray'], kib['raylet'])} | "
              f"{ratio_summary(kib['ray_blocks'], kib['raylet'])} |")
    w("")


def write_per_rep(w, wl, sinks):
    w("| rep | consumed by | order | Ray `batch_size=64` | Ray default batches | raylet | ratios | "
      "Ray init | raylet init |")
    w("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in wl["reps"]:
        a, c, b = r["ray"], r["ray_blocks"], r["raylet"]
        w(f"| {r['rep']} | `{r['sink']}` | {', '.join(SIDE_TEXT[s] for s in r['order'])} | "
          f"{fmt_rate(a['files_per_s'])} | {fmt_rate(c['files_per_s'])} | {fmt_rate(b['files_per_s'])} | "
          f"{fmt_x(b['files_per_s'] / a['files_per_s'])}, {fmt_x(b['files_per_s'] / c['files_per_s'])} | "
          f"{fmt_s(statistics.median([a['init_s'], c['init_s']]))} | {fmt_s(b['init_s'])} |")
    w("")
    reps = wl["reps"]
    rays = [r[side] for r in reps for side in ("ray", "ray_blocks")]
    w("Cluster start, not in the run times above, median over the runs: Ray `ray.init(num_cpus=2)` "
      f"{fmt_s(statistics.median(x['init_s'] for x in rays))} (and `import ray` "
      f"{fmt_s(statistics.median(x['import_s'] for x in rays))} before it), raylet "
      f"`raylet::init_with(Config::default().num_cpus(2.0))` "
      f"{fmt_s(statistics.median(r['raylet']['init_s'] for r in reps))}. Run times, median: "
      + "; ".join(f"`{sink}`: " + ", ".join(
          f"{SIDE_TEXT[side]} {fmt_s(statistics.median(r[side]['seconds'] for r in reps if r['sink'] == sink))}"
          for side in SIDE_TEXT) for sink in sinks if any(r["sink"] == sink for r in reps)) + ".\n")


def is_default(wl):
    """Whether the set has its default number and size of files."""
    return (wl["files"], wl["size"]) == WORKLOADS[wl["name"]][:2]


def write_workload(w, wl, sinks):
    total = wl["files"] * wl["size"]
    w(f"### Files per second: {wl['files']:,} files of {wl['size']:,} bytes ({fmt_bytes(total)}), a trivial model "
      f"in {ACTORS} actors\n")
    made = "made afresh for the run" if WORKLOADS[wl["name"]][3] else "made once and reused"
    w(f"The inputs: {wl['files']:,} files of {wl['size']:,} bytes in `{Path(wl['dir']).relative_to(ROOT)}` "
      f"({made}); raylet's command: `data_throughput --dir {Path(wl['dir']).relative_to(ROOT)} --files "
      f"{wl['files']} --batch-size {BATCH_SIZE} --files-per-block {BATCH_SIZE} --actors {ACTORS} --sink S`."
      + (f" {WHY[wl['name']]}" if wl["name"] in WHY and is_default(wl) else "") + "\n")
    if not wl["reps"]:
        return
    write_rates(w, wl, sinks)
    fewest = min(r[side]["samples"] for r in wl["reps"] for side in SIDE_TEXT)
    if fewest >= MIN_SAMPLES:
        write_memory(w, wl, sinks)
    else:
        w(f"Peak memory: not given for this set, whose shortest run was sampled only {fewest} time"
          f"{'' if fewest == 1 else 's'} (at least {MIN_SAMPLES} are needed); the samples are in the raw numbers.\n")
    write_per_rep(w, wl, sinks)


def write_report(res):
    if "mode" in res:  # --report-from the results of an --only mode
        import compare_data_wave2
        compare_data_wave2.write_report(res)
        log(f"wrote {compare_data_wave2.report_path(res)}")
        sys.exit(0)
    L = []
    w = L.append
    vers = res["versions"]
    w(run_line(res, "compare_data.sh")
      + f": raylet-data (the `data_throughput` example of `target/release`) against Ray Data "
      f"{vers.get('ray', '?')} (`ray[data]==2.60.0` from pip in `target/bench-venv`, Python {vers.get('python', '?')}, "
      f"pyarrow {vers.get('pyarrow', '?')}). A Rust build may have been running alongside on this shared machine, "
      "so the absolute timings are noisy; the systems were measured side by side, alternating, so the "
      "ratios are the figures to read.\n")
    write_setup(w, res)
    for wl in res["workloads"]:
        write_workload(w, wl, res["sinks"])
    w("<details><summary>Per-run results (also in <code>target/bench/data-results.json</code>, "
      "not committed)</summary>\n")
    w("```")
    for wl in res["workloads"]:
        for r in wl["reps"]:
            for side in r["order"]:
                d = {k: v for k, v in r[side].items() if k not in ("stderr_tail", "leftover_processes")}
                w(f"{wl['name']:5} rep {r['rep']} {r['sink']:8} {side:10} {json.dumps(d)}")
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


def holds_inputs(directory, files, size):
    """Whether `directory` holds exactly `files` files of `size` bytes."""
    try:
        sizes = [e.stat().st_size for e in os.scandir(directory)]
    except OSError:
        return False
    return len(sizes) == files and all(s == size for s in sizes)


def make_files(wl, afresh, binary):
    """The workload's inputs, made by the example itself: afresh, or only
    when its directory does not hold exactly them already."""
    directory, files, size = Path(wl["dir"]), wl["files"], wl["size"]
    if not afresh and holds_inputs(directory, files, size):
        log(f"reusing the {files} files of {size} bytes in {directory}")
        return
    shutil.rmtree(directory, ignore_errors=True)
    log(f"making {files} files of {size} bytes in {directory}")
    run_measured([binary, "--dir", directory, "--files", files, "--size", size, "--make-only"], timeout=RUN_TIMEOUT,
            what="making the input files")
    if not holds_inputs(directory, files, size):
        raise RuntimeError(f"{directory} does not hold {files} files of {size} bytes")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions per set of inputs (default 3)")
    p.add_argument("--sink", choices=SINKS + ("both",), default="both",
                   help="how all consume the rows: take_all, jsonl or both (default both)")
    p.add_argument("--files", type=int, default=WORKLOADS["small"][0],
                   help=f"input files of the small set (default {WORKLOADS['small'][0]})")
    p.add_argument("--large-files", type=int, default=WORKLOADS["large"][0],
                   help=f"input files of the large set (default {WORKLOADS['large'][0]})")
    p.add_argument("--large-size", type=int, default=WORKLOADS["large"][1],
                   help=f"bytes per file of the large set (default {WORKLOADS['large'][1]})")
    p.add_argument("--skip-small", action="store_true", help="only the large set")
    p.add_argument("--skip-large", action="store_true", help="only the small set")
    wave2 = p.add_argument_group("the Parquet, images and shuffle benchmarks (bench/compare_data_wave2.py)")
    wave2.add_argument("--only", metavar="MODES",
                       help="parquet, images or shuffle, or several comma-separated: run those instead of the "
                            "binary-file sets")
    wave2.add_argument("--ray-only", action="store_true",
                       help="with --only: measure Ray alone (no raylet example needed; report in target/bench)")
    wave2.add_argument("--rows", type=int, default=10_000_000,
                       help="rows of the parquet data set (parquet, shuffle; default 10,000,000)")
    wave2.add_argument("--parquet-files", type=int, default=10, help="files of the parquet data set (default 10)")
    wave2.add_argument("--images", type=int, default=20_000, help="images of the images data set (default 20,000)")
    wave2.add_argument("--seed", type=int, default=0,
                       help="seed of the data sets, of the shuffle and of the CNN's weights (default 0)")
    wave2.add_argument("--digits", metavar="CSV",
                       help="the 8x8 digits (default target/bench/digits.csv, exported by the raylet example)")
    wave2.add_argument("--checkpoint", metavar="FILE",
                       help="raylet's CNN checkpoint (default target/bench/data-cnn-s<seed>.ckpt, made by the "
                            "raylet example)")
    wave2.add_argument("--ray-backend", choices=("auto", "torch", "numpy"), default="auto",
                       help="the Ray side's CNN: torch when importable (auto, the default), or numpy")
    args = parse_args(p, REPORT, write_report)
    if args.only:
        import compare_data_wave2
        compare_data_wave2.main(args)
        return
    if args.ray_only:
        sys.exit("--ray-only goes with --only")

    counts = {"small": (args.files, WORKLOADS["small"][1]), "large": (args.large_files, args.large_size)}
    skipped = {"small": args.skip_small, "large": args.skip_large}
    res = {
        "started": now_utc(),
        "argv": sys.argv[1:], "machine": machine_info(), "versions": versions("ray", "pyarrow"),
        "batch_size": BATCH_SIZE, "actors": ACTORS, "sinks": list(SINKS) if args.sink == "both" else [args.sink],
        "reps_n": args.reps,
        "workloads": [{"name": name, "files": counts[name][0], "size": counts[name][1], "dir": str(WORKLOADS[name][2]),
                       "reps": []} for name in WORKLOADS if not skipped[name]],
    }
    binary, res["binary"] = snapshot_binary()
    log(f"versions {res['versions']}; binary {res['binary']}")
    try:
        for wl in res["workloads"]:
            make_files(wl, WORKLOADS[wl["name"]][3], binary)
            measure(wl, args.reps, res["sinks"], binary, lambda: RESULTS.write_text(json.dumps(res, indent=1)))
    finally:
        finish_run(res, RESULTS, "/tmp/rd")
    write_report(res)
    log(f"wrote {REPORT} and {RESULTS}")


if __name__ == "__main__":
    main()
