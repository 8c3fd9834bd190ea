"""The Parquet, images and shuffle benchmarks of raylet-data against Ray Data
2.60 (issue 33): `bench/compare_data.sh --only parquet|images|shuffle` (a
comma-separated list runs several), which runs bench/compare_data.py, which
hands those modes to main() here. Standard library only, like
compare_data.py; numpy, pyarrow, Ray and torch are imported only in the
subprocesses (bench/make_data.py, bench/ray_data_wave2.py).

  parquet  10,000,000 rows of 8 float64 columns c0..c7 (640 MB in memory) in
           10 parquet files: read -> map_batches(out = c0 * 2 + c1, the other
           columns kept) -> write parquet; rows/s and peak memory.
  images   20,000 PNGs, 32x32 grayscale (the 8x8 digits upscaled, seeded
           noise), in class folders: read -> a small CNN in 2 actors;
           images/s and peak memory. Ray in two forms, as the binary-file
           benchmark: batch_size=64 (num_cpus=0.5) and default batches.
  shuffle  random_shuffle of the parquet mode's 10,000,000 rows, consumed
           fully in the driver; seconds and peak memory.

The inputs are made once by bench/make_data.py under target/bench (a
directory per size and seed, with its manifest, a JSON file beside it) and
reused while the manifest matches. Every value of the parquet data is a
multiple of 2^-16, so every sum the checks use is exact in float64 whatever
the order: both sides' sums must equal the manifest's bit for bit.

Each repetition runs every side once, alternating the order (Ray first in odd
repetitions), each in a fresh process on a warm page cache (the harness reads
every input file first), its driver's peak RSS and its workers' summed RSS
sampled from /proc every 0.1 s (compare_data.MemoryPeaks). Each run's result
is checked (rows, the sums, for parquet the written files themselves, read
back with pyarrow); a failed check fails the benchmark.

The raylet side is target/release/examples/data_bench: everything this
harness assumes about it is in the block "the raylet side's contract" below.
Without it a mode says so and exits 1, unless --ray-only (Ray measured alone,
the report written to target/bench/data-<mode>-ray-only.md instead of
bench/data_<mode>.md).
"""

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import (ENV, PY, ROOT, WORK, finish_run, fmt_s, fmt_x, leftover_lines, log, machine_info, now_utc,
                      ratio_summary, run_line, run_measured, snapshot, versions, with_range)
from compare_data import (MEMORY_TEXT, MIN_SAMPLES, RUN_TIMEOUT, SAMPLE_S, MemoryPeaks, fmt_bytes, fmt_rate,
                          summary_mib, summary_rate)

MODES = ("parquet", "images", "shuffle")
RAY_SCRIPT = ROOT / "bench" / "ray_data_wave2.py"
MAKE_DATA = ROOT / "bench" / "make_data.py"
BIN_SNAPSHOT = WORK / "data-bin"

DEFAULT_ROWS = 10_000_000
DEFAULT_PARQUET_FILES = 10
ROW_GROUP = 1_000_000
DEFAULT_IMAGES = 20_000
ACTORS = 2
BATCH_SIZE = 64
COLUMNS = [f"c{i}" for i in range(8)]

# ================================================================ the raylet side's contract
# Everything this harness assumes about the raylet side, in one place. The
# example is run with the arguments below (paths absolute, numbers as
# decimal strings, working directory target/bench) and must print, as the
# last line of its stdout that starts with "{", one JSON object with
#   "rows":    int, the rows it produced (parquet: rows written to --output;
#              images: images classified; shuffle: rows consumed),
#   "seconds": float, the pipeline's time, apart from the cluster start,
# plus the check fields of CHECKS[mode]; it may add others (e.g. "init_s",
# the cluster start in seconds, which the report shows when present), and
# must exit 0. The sums are f64 sums (exact here: see bench/make_data.py).
RAYLET_EXAMPLE = "data_bench"
RAYLET_BUILD = "cargo build --release -p raylet-data --examples"
# DATA_BENCH_BIN=PATH runs that program instead of target/release/examples/data_bench.
RAYLET_BIN_ENV = "DATA_BENCH_BIN"


def raylet_command(mode, binary, p):
    """The command of one raylet run; p: input (dir), output (a dir that does
    not exist yet), checkpoint (file), actors, seed."""
    return {
        "parquet": [binary, "parquet", "--input", p["input"], "--output", p["output"]],
        "images": [binary, "images", "--input", p["input"], "--checkpoint", p["checkpoint"], "--actors", p["actors"]],
        "shuffle": [binary, "shuffle", "--input", p["input"], "--seed", p["seed"]],
    }[mode]


# Run once, before the images mode, when their output file does not exist:
# the 8x8 digits as CSV (one digit a line: 64 pixel values 0..16, then the
# label), which bench/make_data.py turns into the images, and the CNN's
# weights that `images --checkpoint` loads (conv 1->8 3x3, relu, maxpool 2,
# conv 8->16 3x3, relu, maxpool 2, flatten, linear 576->10, no padding, as
# the Ray side's).
def raylet_digits_command(binary, output):
    return [binary, "digits", "--output", output]


def raylet_checkpoint_command(binary, output, seed):
    return [binary, "checkpoint", "--output", output, "--seed", seed]


# The check fields each mode's JSON must have, beyond rows and seconds:
#   parquet: sum_out, the sum of column `out` over the rows written (the
#            harness also reads the files in --output back: exactly the
#            columns c0..c7 and out, float64, rows, sum_out and sum_c0);
#   images:  label_sum, the sum of the images' labels (each image's label is
#            the name of its folder), and pred_hist, 10 ints: how many
#            images the CNN put in each class (summing to rows);
#   shuffle: sum_c0, the sum of column c0 over the rows consumed.
CHECKS = {"parquet": ("sum_out",), "images": ("label_sum", "pred_hist"), "shuffle": ("sum_c0",)}
# ================================================================ end of the contract

SIDES = {
    "parquet": ("ray", "raylet"),
    "images": ("ray", "ray_blocks", "raylet"),
    "shuffle": ("ray", "raylet"),
}
SIDE_TEXT = {
    "parquet": {"ray": "Ray Data 2.60", "raylet": "raylet-data"},
    "images": {"ray": "Ray Data 2.60, `batch_size=64`", "ray_blocks": "Ray Data 2.60, default batches",
               "raylet": "raylet-data"},
    "shuffle": {"ray": "Ray Data 2.60", "raylet": "raylet-data"},
}
SHORT_TEXT = {
    "parquet": {"ray": "Ray", "raylet": "raylet"},
    "images": {"ray": "Ray `batch_size=64`", "ray_blocks": "Ray default batches", "raylet": "raylet"},
    "shuffle": {"ray": "Ray", "raylet": "raylet"},
}
UNIT = {"parquet": "rows/s", "images": "images/s", "shuffle": "rows/s"}


# ---------------------------------------------------------------- inputs


def manifest_of(directory):
    path = Path(directory).parent / (Path(directory).name + ".json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def make_data(kind, directory, wanted, cmd_args):
    """The data set in `directory`, made by bench/make_data.py unless its
    manifest already has every (key, value) of `wanted` and its files are
    there; returns the manifest."""
    meta = manifest_of(directory)
    if meta and all(meta.get(k) == v for k, v in wanted.items()) and inputs_present(kind, directory, meta):
        log(f"reusing {directory} ({meta.get('make_s', '?')} s to make)")
        return meta
    log(f"making {directory} with bench/make_data.py {kind}")
    run_measured([PY, MAKE_DATA, kind, "--dir", directory, *cmd_args], timeout=RUN_TIMEOUT,
                 what=f"making {directory}")
    meta = manifest_of(directory)
    if not meta or any(meta.get(k) != v for k, v in wanted.items()):
        raise RuntimeError(f"bench/make_data.py left no matching manifest beside {directory}")
    log(f"made {directory} in {meta['make_s']} s ({fmt_bytes(meta['bytes_on_disk'])} on disk)")
    return meta


def inputs_present(kind, directory, meta):
    directory = Path(directory)
    if kind == "parquet":
        return all((directory / f["name"]).is_file() and (directory / f["name"]).stat().st_size == f["bytes"]
                   for f in meta["file_list"])
    return sum(1 for _ in directory.glob("*/img_*.png")) == meta["count"]


def warm_tree(directory):
    """Reads every file under `directory`, so that the run after it finds
    them all in the page cache."""
    buf = bytearray(1 << 20)
    for dirpath, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


# ---------------------------------------------------------------- runs


def last_json(out):
    """The last line of `out` that is a JSON object (a leading result marker
    allowed), or None."""
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("@@RESULT@@ "):
            line = line[len("@@RESULT@@ "):]
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def check_result(mode, res, data):
    """The problems of one run's result against the data set's manifest."""
    problems = []
    want_rows = data["count"] if mode == "images" else data["rows"]
    if res.get("rows") != want_rows:
        problems.append(f"rows {res.get('rows')!r}, expected {want_rows}")
    seconds = res.get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
        problems.append(f"seconds {seconds!r}, expected a positive number")
    missing = [k for k in CHECKS[mode] if k not in res]
    if missing:
        problems.append(f"missing check fields {missing} (the contract: {', '.join(CHECKS[mode])})")
    if mode == "parquet" and "sum_out" in res and res["sum_out"] != data["sum_out"]:
        problems.append(f"sum_out {res['sum_out']!r}, expected {data['sum_out']!r} (exact)")
    if mode == "shuffle" and "sum_c0" in res and res["sum_c0"] != data["sums"]["c0"]:
        problems.append(f"sum_c0 {res['sum_c0']!r}, expected {data['sums']['c0']!r} (exact)")
    if mode == "images":
        if "label_sum" in res and res["label_sum"] != data["label_sum"]:
            problems.append(f"label_sum {res['label_sum']!r}, expected {data['label_sum']}")
        hist = res.get("pred_hist")
        if "pred_hist" in res and not (isinstance(hist, list) and len(hist) == 10
                                       and all(isinstance(n, int) and n >= 0 for n in hist)
                                       and sum(hist) == res.get("rows")):
            problems.append(f"pred_hist {hist!r}: expected 10 counts summing to rows")
    return problems


def verify_parquet_output(directory, data):
    """Reads the parquet files a run wrote back (bench/ray_data_wave2.py
    verify-parquet, untimed); returns (summary, problems)."""
    proc = subprocess.run([str(PY), str(RAY_SCRIPT), "verify-parquet", "--dir", str(directory)], env=ENV,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    got = last_json(proc.stdout) if proc.returncode == 0 else None
    if got is None:
        return None, [f"could not read the output back: {proc.stderr[-1500:]}"]
    problems = []
    if sorted(got["columns"]) != sorted(COLUMNS + ["out"]):
        problems.append(f"written columns {got['columns']}, expected {COLUMNS + ['out']}")
    if got["rows"] != data["rows"]:
        problems.append(f"{got['rows']} rows written, expected {data['rows']}")
    if got["sum_out"] != data["sum_out"]:
        problems.append(f"written sum_out {got['sum_out']!r}, expected {data['sum_out']!r}")
    if got["sum_c0"] != data["sums"]["c0"]:
        problems.append(f"written sum_c0 {got['sum_c0']!r}, expected {data['sums']['c0']!r}")
    return got, problems


def ray_command(mode, side, p, temp_dir):
    cmd = [PY, RAY_SCRIPT, mode, "--input", p["input"]]
    if mode == "parquet":
        cmd += ["--output", p["output"]]
    elif mode == "images":
        cmd += ["--actors", p["actors"], "--batch-size", BATCH_SIZE if side == "ray" else 0,
                "--backend", p["backend"], "--seed", p["seed"]]
    else:
        cmd += ["--seed", p["seed"]]
    return cmd + ["--temp-dir", temp_dir]


def run_side(ctx, mode, side, rep):
    """One run of one side, on a warm page cache; its checked result."""
    data = ctx["data"][mode]
    warm_tree(data["dir"])
    p = {"input": data["dir"], "output": WORK / f"data-{mode}-out-{side}-r{rep}", "checkpoint": ctx.get("checkpoint"),
         "actors": ACTORS, "seed": ctx["seed"], "backend": ctx["backend"]}
    shutil.rmtree(p["output"], ignore_errors=True)
    temp_dir = Path(f"/tmp/rd{os.getpid()}r{rep}")  # short: Ray's socket paths must fit 107 bytes
    if side == "raylet":
        cmd, marker = raylet_command(mode, ctx["binary"], p), None
    else:
        cmd, marker = ray_command(mode, side, p, temp_dir), temp_dir
    what = f"{mode} rep {rep} {SHORT_TEXT[mode][side]}"
    try:
        with MemoryPeaks(cmd) as memory:
            wall, out, err, left = run_measured(cmd, timeout=RUN_TIMEOUT, what=what, marker=marker)
        res = last_json(out)
        if res is None:
            raise RuntimeError(f"{what}: no JSON line on stdout:\n{out[-3000:]}\n{err[-3000:]}")
        problems = check_result(mode, res, data)
        if mode == "parquet" and not problems:
            res["written"], problems = verify_parquet_output(p["output"], data)
        if problems:
            raise RuntimeError(f"{what}: check failed: " + "; ".join(problems) + f"\nresult: {json.dumps(res)}")
        res.update(memory.peaks, process_wall_s=round(wall, 4), leftover_processes=leftover_lines(left),
                   stderr_tail=err[-1500:])
        return res
    finally:
        shutil.rmtree(p["output"], ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def rate(res):
    return res["rows"] / res["seconds"]


def measure(ctx, res, save):
    mode = res["mode"]
    for rep in range(1, res["reps_n"] + 1):
        order = list(res["sides"])
        if rep % 2 == 0:
            order.reverse()
        row = {"rep": rep, "order": order}
        for side in order:
            log(f"{mode} rep {rep}/{res['reps_n']}: {SIDE_TEXT[mode][side]}")
            r = row[side] = run_side(ctx, mode, side, rep)
            log(f"    {rate(r):,.0f} {UNIT[mode]} ({r['seconds']:.3f} s"
                + (f"; init {r['init_s']:.3f} s" if "init_s" in r else "") + f"); driver peak "
                f"{r['driver_hwm_kib'] / 1024:,.0f} MiB, workers' peak {r['workers_rss_kib'] / 1024:,.0f} MiB"
                + (f"; backend {r['backend']}" if "backend" in r else ""))
        res["reps"].append(row)
        save()


# ---------------------------------------------------------------- report


def describe_data(res):
    d = res["data"]
    if res["mode"] == "images":
        return (f"{d['count']:,} PNG images, 32×32 8-bit grayscale ({fmt_bytes(d['bytes_on_disk'])} on disk), "
                f"in class folders `<label>/img_NNNNN.png` of `{rel(d['dir'])}`, made once by `bench/make_data.py "
                f"images --count {d['count']} --seed {d['seed']} --digits {rel(d['digits_file'])}` from "
                f"{d['digits']:,} 8×8 digits (each image a digit drawn at random, upscaled 4×, plus gaussian noise "
                f"of σ {d['noise']:g})")
    return (f"{d['rows']:,} rows of 8 float64 columns `c0`..`c7` ({fmt_bytes(d['bytes_in_memory'])} in memory, "
            f"{fmt_bytes(d['bytes_on_disk'])} on disk) in {d['files']} parquet files of `{rel(d['dir'])}` (row "
            f"groups of at most {d['row_group']:,} rows, {d['compression']}), made once by `bench/make_data.py "
            f"parquet --rows {d['rows']} --files {d['files']} --seed {d['seed']}`: standard normal draws rounded "
            "to multiples of 2^-16, so that every sum checked is exact whatever the order")


def rel(path):
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


def pipeline_text(res):
    mode, sides = res["mode"], res["sides"]
    p = {"input": "DIR", "output": "OUT", "checkpoint": "CKPT", "actors": ACTORS, "seed": res["seed"]}
    raylet_cmd = " ".join(map(str, raylet_command(mode, RAYLET_EXAMPLE, p)))
    if mode == "parquet":
        ray = ("`ray.data.read_parquet(DIR).map_batches(add_out, batch_format=\"pyarrow\").write_parquet(OUT)`, "
               "`add_out` appending `out = c0 * 2 + c1` (pyarrow compute) to each block, the other columns kept "
               "(Ray fuses the read, the map and the write into one operator of tasks); timed to "
               "`write_parquet`'s return")
        checks = ("the rows written and the sum of `out`; the harness also reads the written files back: "
                  "columns `c0`..`c7` and `out`, rows, exact sums of `out` and `c0`")
    elif mode == "images":
        ray = ("`ray.data.read_images(DIR, mode=\"L\", include_paths=True).map_batches(Classifier, concurrency=2, "
               "...)`, `Classifier` a callable class holding a small CNN (conv 1→8 3×3, relu, maxpool 2, conv "
               "8→16 3×3, relu, maxpool 2, flatten, linear 576→10; random seeded weights, as only the throughput "
               f"is compared; backend: {backends(res)}, one thread per actor), the label parsed from each "
               "image's folder, consumed by `iter_batches` in the driver. Two Ray variants, as in the "
               "binary-file benchmark: **`batch_size=64`** (with `num_cpus=0.5`: with an int batch size Ray keeps "
               "the read in tasks of 1 CPU, which 2 actors of 1 CPU each would starve) and **default batches** "
               "(each block one batch; Ray fuses the read into the 2 actors, 1 CPU each)")
        checks = ("the images classified, the sum of their labels, and a histogram of the 10 predicted classes "
                  "that sums to the images")
    else:
        ray = (f"`ray.data.read_parquet(DIR).random_shuffle(seed={res['seed']})`, consumed fully by "
               "`iter_batches(batch_size=None, batch_format=\"pyarrow\")` in the driver, counting the rows "
               f"and summing `c0` (Ray's shuffle strategy: {shuffle_strategy(res)})")
        checks = "the rows consumed and the exact sum of `c0`"
    text = (f"Ray Data: a fresh python process per run (`bench/ray_data_wave2.py {mode}`) with "
            f"`ray.init(num_cpus=2)`, then {ray}, then `ray.shutdown()`; progress bars off, "
            "`RAY_USAGE_STATS_ENABLED=0`. ")
    if "raylet" in sides:
        text += f"raylet: `{raylet_cmd}` (the `{RAYLET_EXAMPLE}` example). "
    else:
        text += (f"**Ray alone** (`--ray-only`): raylet's `{RAYLET_EXAMPLE}` example was not run, so there is no "
                 "ratio. ")
    text += (f"Each run is timed apart from the cluster start, then checked: {checks}. A failed check fails the "
             "benchmark. **Page cache:** warm (the harness reads every input file before each run). **Memory:** "
             f"`/proc` sampled every {SAMPLE_S} s: the driver's peak RSS (`VmHWM`) and the peak of the summed RSS "
             "(and private `RssAnon`) of its workers, every other process of the run (Ray's GCS, raylet, "
             "dashboard and agents and `ray::` workers; raylet's worker processes). "
             f"{res['reps_n']} repetition{'' if res['reps_n'] == 1 else 's'}"
             + (", the runs of each alternating (in the order of the columns below in odd ones, the reverse in even "
                "ones)" if len(sides) > 1 else "") + "; median (min–max)"
             + (", and the ratio of the medians with the min–max of the per-repetition ratios." if "raylet" in sides
                else "."))
    return text


def backends(res):
    found = sorted({r[s]["backend"] for r in res["reps"] for s in r if isinstance(r[s], dict) and "backend" in r[s]})
    return ", ".join(f"`{b}`" for b in found) or "?"


def shuffle_strategy(res):
    found = sorted({r["ray"].get("shuffle_strategy", "?") for r in res["reps"] if "ray" in r})
    return ", ".join(f"`{s}`" for s in found) or "?"


def title(res):
    d, mode = res["data"], res["mode"]
    if mode == "parquet":
        return (f"### Parquet: {d['rows']:,} rows of 8 float64 columns ({fmt_bytes(d['bytes_in_memory'])}), "
                "read → `out = c0 * 2 + c1` → written")
    if mode == "images":
        return f"### Images: {d['count']:,} PNGs of 32×32 grayscale through a small CNN in {ACTORS} actors"
    return (f"### Shuffle: `random_shuffle` of {d['rows']:,} rows ({fmt_bytes(d['bytes_in_memory'])}), "
            "consumed fully")


def table_head(w, res, first, ratio_title):
    """Writes a table's head: `first`, a column per side, and a ratio column
    per Ray side (titled by `ratio_title`) when raylet ran; returns the Ray
    sides and whether raylet ran."""
    mode, sides = res["mode"], res["sides"]
    ray_sides = [s for s in sides if s != "raylet"]
    has_raylet = "raylet" in sides
    head = f"| {first} | " + " | ".join(SIDE_TEXT[mode][s] for s in sides)
    rule = "|---|" + "---:|" * len(sides)
    if has_raylet:
        head += " | " + " | ".join(ratio_title(s) for s in ray_sides)
        rule += "---:|" * len(ray_sides)
    w(head + " |")
    w(rule)
    return ray_sides, has_raylet


def write_rates(w, res):
    mode, sides, reps = res["mode"], res["sides"], res["reps"]
    ray_sides, has_raylet = table_head(w, res, "measure", lambda s: f"raylet / {SHORT_TEXT[mode][s]}")
    rates = {s: [rate(r[s]) for r in reps] for s in sides}
    secs = {s: [r[s]["seconds"] for r in reps] for s in sides}
    rows = [(UNIT[mode], lambda s: f"{summary_rate(rates[s])} {UNIT[mode]}",
             lambda s: ratio_summary(rates["raylet"], rates[s])),
            ("run time (apart from the cluster start)", lambda s: summary_seconds(secs[s]),
             lambda s: ratio_summary(secs[s], secs["raylet"]))]
    if mode == "shuffle":
        rows.reverse()
    for text, cell, ratio in rows:
        line = f"| {text} | " + " | ".join(cell(s) for s in sides)
        if has_raylet:
            line += " | " + " | ".join(ratio(s) for s in ray_sides)
        w(line + " |")
    w("")
    if has_raylet:
        w("Ratios: how many times faster raylet is (its rate over Ray's; Ray's time over raylet's).\n")


def summary_seconds(values):
    return with_range(statistics.median(values), values, fmt_s, unit_chars=2)


def write_memory(w, res):
    mode, sides, reps = res["mode"], res["sides"], res["reps"]
    ray_sides, has_raylet = table_head(
        w, res, "peak memory", lambda s: f"{SHORT_TEXT[mode][s]} / raylet (raylet holds × less)")
    for key, text in MEMORY_TEXT.items():
        kib = {s: [r[s][key] for r in reps] for s in sides}
        line = f"| {text} | " + " | ".join(summary_mib(kib[s]) for s in sides)
        if has_raylet:
            line += " | " + " | ".join(ratio_summary(kib[s], kib["raylet"]) if min(kib["raylet"]) > 0 else "–"
                                       for s in ray_sides)
        w(line + " |")
    w("")


def write_per_rep(w, res):
    mode, sides, reps = res["mode"], res["sides"], res["reps"]
    ray_sides = [s for s in sides if s != "raylet"]
    has_raylet = "raylet" in sides
    head = "| rep | order | " + " | ".join(f"{SHORT_TEXT[mode][s]}, {UNIT[mode]}" for s in sides)
    rule = "|---:|---|" + "---:|" * len(sides)
    if has_raylet:
        head += " | ratios"
        rule += "---:|"
    head += " | Ray init"
    rule += "---:|"
    if has_raylet:
        head += " | raylet init"
        rule += "---:|"
    w(head + " |")
    w(rule)
    for r in reps:
        line = (f"| {r['rep']} | {', '.join(SHORT_TEXT[mode][s] for s in r['order'])} | "
                + " | ".join(fmt_rate(rate(r[s])) for s in sides))
        if has_raylet:
            line += " | " + ", ".join(fmt_x(rate(r["raylet"]) / rate(r[s])) for s in ray_sides)
        line += f" | {fmt_s(statistics.median(r[s]['init_s'] for s in ray_sides))}"
        if has_raylet:
            line += f" | {fmt_s(r['raylet']['init_s']) if 'init_s' in r['raylet'] else '–'}"
        w(line + " |")
    w("")
    rays = [r[s] for r in reps for s in ray_sides]
    w("Cluster start, not in the run times above, median over the runs: Ray `ray.init(num_cpus=2)` "
      f"{fmt_s(statistics.median(x['init_s'] for x in rays))} (and `import ray` "
      f"{fmt_s(statistics.median(x['import_s'] for x in rays))} before it)"
      + (f", raylet {fmt_s(statistics.median(r['raylet']['init_s'] for r in reps))}"
         if has_raylet and all("init_s" in r["raylet"] for r in reps) else "") + ".\n")


def write_report(res, path=None):
    """Writes the mode's report (bench/data_<mode>.md, or with --ray-only
    target/bench/data-<mode>-ray-only.md) and returns its text."""
    L = []
    w = L.append
    vers = res["versions"]
    ray = (f"Ray Data {vers.get('ray', '?')} (`ray[data]==2.60.0` from pip in `target/bench-venv`, Python "
           f"{vers.get('python', '?')}, pyarrow {vers.get('pyarrow', '?')})")
    if "raylet" in res["sides"]:
        w(run_line(res, "compare_data.sh") + f": raylet-data (the `{RAYLET_EXAMPLE}` example of `target/release`) "
          f"against {ray}. A Rust build may have been running alongside on this shared machine, so the absolute "
          "timings are noisy; the systems were measured side by side, alternating, so the ratios are the figures "
          "to read.\n")
    else:
        w(run_line(res, "compare_data.sh") + f": {ray} alone, raylet's side not run (`--ray-only`). A Rust build "
          "may have been running alongside on this shared machine, so the timings are noisy.\n")
    w(title(res) + "\n")
    w(f"The inputs: {describe_data(res)}. " + pipeline_text(res) + "\n")
    if res["reps"]:
        write_rates(w, res)
        fewest = min(r[s]["samples"] for r in res["reps"] for s in res["sides"])
        if fewest >= MIN_SAMPLES:
            write_memory(w, res)
        else:
            w(f"Peak memory: not given, the shortest run was sampled only {fewest} time"
              f"{'' if fewest == 1 else 's'} (at least {MIN_SAMPLES} are needed); the samples are in the raw "
              "numbers.\n")
        write_per_rep(w, res)
    w(f"<details><summary>Per-run results (also in <code>{rel(results_path(res))}</code>, not committed)"
      "</summary>\n")
    w("```")
    for r in res["reps"]:
        for side in r["order"]:
            d = {k: v for k, v in r[side].items() if k not in ("stderr_tail", "leftover_processes")}
            w(f"{res['mode']} rep {r['rep']} {side:10} {json.dumps(d)}")
    w("```\n")
    w("</details>\n")
    text = "\n".join(L)
    (path or report_path(res)).write_text(text)
    return text


def report_path(res):
    if "raylet" in res["sides"]:
        return ROOT / "bench" / f"data_{res['mode']}.md"
    return WORK / f"data-{res['mode']}-ray-only.md"


def results_path(res):
    return WORK / f"data-{res['mode']}-results{'' if 'raylet' in res['sides'] else '-ray-only'}.json"


# ---------------------------------------------------------------- main


def modes_of(only):
    modes = [m.strip() for m in only.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        sys.exit(f"--only takes one or more of {', '.join(MODES)}, comma-separated; not {only!r}")
    return modes


def raylet_binary(ray_only):
    """The snapshot of the raylet example (a rebuild during the run cannot
    swap it), or None with --ray-only; exits 1 naming the build command when
    it is missing."""
    if ray_only:
        return None, None
    example = Path(os.environ.get(RAYLET_BIN_ENV) or ROOT / "target" / "release" / "examples" / RAYLET_EXAMPLE)
    if not example.exists():
        sys.exit(f"missing {example}: the raylet side of --only parquet|images|shuffle is not built, so there is "
                 f"nothing to compare against and no figure is written; build it with:\n    {RAYLET_BUILD}\n"
                 "(or pass --ray-only to measure the Ray side alone)")
    BIN_SNAPSHOT.mkdir(parents=True, exist_ok=True)
    return snapshot(example, BIN_SNAPSHOT)


def prepare_images(args, binary, seed):
    """The digits CSV and the checkpoint (raylet's, made by the example when
    absent) and the images data set."""
    digits = Path(args.digits).resolve() if args.digits else WORK / "digits.csv"
    if not digits.exists():
        if binary is None:
            sys.exit(f"missing {digits}: with --ray-only pass --digits FILE (CSV: 64 pixel values 0..16, then the "
                     "label, per line), or build the raylet example, which exports it")
        log(f"exporting the digits to {digits} with {RAYLET_EXAMPLE}")
        run_measured(raylet_digits_command(binary, digits), timeout=RUN_TIMEOUT, what="exporting the digits")
    checkpoint = None
    if binary is not None:
        checkpoint = Path(args.checkpoint).resolve() if args.checkpoint else WORK / f"data-cnn-s{seed}.ckpt"
        if not checkpoint.exists():
            log(f"making the CNN checkpoint {checkpoint} with {RAYLET_EXAMPLE}")
            run_measured(raylet_checkpoint_command(binary, checkpoint, seed), timeout=RUN_TIMEOUT,
                         what="making the checkpoint")
    sha = hashlib.sha256(digits.read_bytes()).hexdigest()
    data = make_data("images", WORK / f"data-images-{args.images}-s{seed}",
                     {"count": args.images, "seed": seed, "digits_sha256": sha},
                     ["--count", args.images, "--seed", seed, "--digits", digits])
    return data, checkpoint


def main(args):
    modes = modes_of(args.only)
    if args.reps < 1:
        sys.exit("--reps must be >= 1")
    binary, binary_meta = raylet_binary(args.ray_only)
    seed = args.seed
    ctx = {"binary": binary, "seed": seed, "backend": args.ray_backend, "data": {}}
    if "parquet" in modes or "shuffle" in modes:
        pq = make_data("parquet", WORK / f"data-parquet-{args.rows}r{args.parquet_files}f-s{seed}",
                       {"rows": args.rows, "files": args.parquet_files, "seed": seed, "row_group": ROW_GROUP},
                       ["--rows", args.rows, "--files", args.parquet_files, "--seed", seed,
                        "--row-group", ROW_GROUP])
        ctx["data"]["parquet"] = ctx["data"]["shuffle"] = pq
    if "images" in modes:
        ctx["data"]["images"], ctx["checkpoint"] = prepare_images(args, binary, seed)
    vers = versions("ray", "pyarrow", "numpy")
    texts = []
    for mode in modes:
        sides = [s for s in SIDES[mode] if s != "raylet" or binary is not None]
        res = {"started": now_utc(), "argv": sys.argv[1:], "machine": machine_info(), "versions": vers,
               "mode": mode, "sides": sides, "reps_n": args.reps, "seed": seed, "binary": binary_meta,
               "contract": " ".join(map(str, raylet_command(mode, RAYLET_EXAMPLE, {
                   "input": "DIR", "output": "OUT", "checkpoint": "CKPT", "actors": ACTORS, "seed": seed}))),
               "data": {k: v for k, v in ctx["data"][mode].items() if k != "file_list"}, "reps": []}
        log(f"{mode}: {', '.join(SIDE_TEXT[mode][s] for s in sides)}; {args.reps} repetition(s)")
        try:
            measure(ctx, res, lambda: results_path(res).write_text(json.dumps(res, indent=1)))
        finally:
            finish_run(res, results_path(res), "/tmp/rd")
        texts.append(write_report(res))
        log(f"wrote {report_path(res)} and {results_path(res)}")
    for text in texts:
        # The tables, for the terminal (the whole section is in the report file).
        print("\n".join(line for line in text.splitlines() if line.startswith(("|", "###"))) + "\n")
