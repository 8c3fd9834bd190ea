#!/usr/bin/env python3
"""Side-by-side benchmark of raylet against Ray; writes BENCHMARKS.md.

Run it through bench/compare_ray.sh, which installs Ray into
target/bench-venv, builds raylet and bench/physlimits.c first. Only the
standard library is used here, so the system python runs it (and its
command line names neither system's install path, which the process
accounting below relies on).

Every measurement is repeated --reps times and the two systems alternate
within each repetition (Ray first in odd repetitions, raylet first in even
ones), so that noise on this shared machine hits both alike. Reported
values are medians over the repetitions with their min-max; a ratio is the
raylet median over the Ray median, with the min-max of the per-repetition
ratios (each repetition's raylet value over the Ray value measured next to
it).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from benchlib import ROOT, VENV, WORK, add_descendants, log, proc_table

RAY = VENV / "bin" / "ray"
RAY_PY = VENV / "bin" / "python"
RAYLET = ROOT / "target" / "release" / "raylet"
QUICKSTART = ROOT / "target" / "release" / "examples" / "quickstart"
PHYSLIMITS = ROOT / "target" / "bench" / "physlimits"
FIRST_TASK_PY = ROOT / "bench" / "ray_first_task.py"
OBJECT_METRICS_PY = ROOT / "bench" / "ray_object_metrics.py"
GENERATOR_METRICS_PY = ROOT / "bench" / "ray_generator_metrics.py"

# Ray must not try to report usage (there is no network here); this changes
# nothing else about how it runs. RAY_AUTH_MODE=token pins Ray 2.60's token
# authentication on for every Ray process here: left unset, `ray.init()`
# turns it on (and writes ~/.ray/auth_token) while `ray start` turns it on
# only once that file exists, and `ray status` then fails with
# InvalidAuthToken. raylet authenticates with a cluster token too, so both
# sides do the same work.
RAY_ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
for var in ("RAY_ADDRESS", "RAYLET_ADDRESS", "TESTS_TO_RUN", "TESTS_TO_SKIP"):
    RAY_ENV.pop(var, None)
RAYLET_ENV = dict(RAY_ENV)

class Row(NamedTuple):
    """A microbenchmark row: the metric's name as Ray prints it, each side's
    workload in words, the name raylet prints when its work differs (and
    says so), the Ray script that measures it (`perf`: Ray's own ray_perf;
    `objects`: bench/ray_object_metrics.py; `generators`:
    bench/ray_generator_metrics.py) and, for rows that move bytes,
    the raylet-printed memcpy of the same bytes."""
    name: str
    ray_work: str
    raylet_work: str
    raylet_name: str = ""
    ray_script: str = "perf"
    memcpy: str = ""

    @property
    def same_work(self) -> bool:
        """Whether both sides do the same work; a row that does not says so
        in raylet's name for it or in its workload, and loses its bold."""
        return not self.raylet_name and NOT_SAME_WORK not in self.raylet_work


NOT_SAME_WORK = "**not the same work**"


IN_PROCESS = "(in-process, owner's memory)"
# The Ray side is ray/_private/ray_perf.py of Ray 2.60.0,
# bench/ray_object_metrics.py or bench/ray_generator_metrics.py; the raylet
# side cli/src/microbenchmark/.
METRICS = [Row(*row) for row in [
    (
        "single client get calls (Plasma Store)",
        "`ray.get(value)`, `value = ray.put(0)`: a call into plasma, another process; 1 op per call",
        "`value.get()`, `value = cluster.put(&0u64)`: **not the same work**, a read of the driver's own "
        "memory (values under 100 KiB stay with their owner); see *put and get in another process* for "
        "bytes that cross a process; 1 op per call",
        f"single client get calls {IN_PROCESS}",
    ),
    (
        "single client put calls (Plasma Store)",
        "`ray.put(0)`: a write into plasma, another process; 1 op per call",
        "`cluster.put(&0u64)`: **not the same work**, an insert into the driver's own memory; 1 op per call",
        f"single client put calls {IN_PROCESS}",
    ),
    (
        "single client put gigabytes",
        "`ray.put(np.zeros(100*1024*1024, dtype=np.int64))` (800 MiB numpy array into the plasma "
        "shared-memory store); counted as 0.8 GB per call",
        "`cluster.put(&ByteBuf(vec![0u8; 800 MiB]))`: the 800 MiB byte buffer is serialized straight into "
        "a memfd of the node's shared-memory store; counted as 0.8 GB per call",
    ),
    (
        "single client put gigabytes from written memory",
        "`ray.put(np.ones(100*1024*1024, dtype=np.int64))` (`bench/ray_object_metrics.py`): the array's "
        "800 MiB were written, so the put reads memory; counted as 0.8 GB per call",
        "`cluster.put(&ByteBuf(vec![1u8; 800 MiB]))`, a buffer of written bytes; counted as 0.8 GB per call",
        "",
        "objects",
    ),
    (
        "multi client put gigabytes",
        "10 `do_put` tasks each `ray.put(np.zeros(10*1024*1024, dtype=np.int64))` 10 times (80 MiB "
        "arrays made just before each put); counted as 8 GB per round",
        "10 `put_zeroed_buffers` tasks each `cluster.put(&ByteBuf(vec![0u8; 80 MiB]))` 10 times (each "
        "buffer made just before its put); counted as 8 GB per round",
    ),
    (
        "single client tasks and get batch",
        "`ray.get([small_value.remote() for _ in range(1000)])`, `small_value` returns `b\"ok\"`; "
        "1 op per batch of 1000",
        "1000 × `small_value::remote()` then `cluster.get_all(&refs)`, `small_value` returns "
        "`ByteBuf(b\"ok\")`; 1 op per batch of 1000",
    ),
    (
        "single client get object containing 10k refs",
        "`ray.get(ref)` of a task's return value, a list of 10,000 `ray.put(1)` refs; 1 op per get",
        "`ref.get()` of a task's return value, a `Vec` of 10,000 `cluster.put(&1u64)` refs; 1 op per get",
    ),
    (
        "single client wait 1k refs",
        "submit 1000 `small_value` tasks, then `ray.wait(not_ready)` (num_returns=1) until none "
        "is left; 1 op per 1000 tasks",
        "submit 1000 `small_value` tasks, then `cluster.wait(&not_ready, 1, None)` until none "
        "is left; 1 op per 1000 tasks",
    ),
    (
        "single client tasks sync",
        "`ray.get(small_value.remote())`; 1 op per task",
        "`small_value::remote(&cluster)?.get()`; 1 op per task",
    ),
    (
        "single client tasks async",
        "`ray.get([small_value.remote() for _ in range(1000)])`; 1000 ops per batch",
        "1000 × `small_value::remote()` then `cluster.get_all`; 1000 ops per batch",
    ),
    (
        "multi client tasks async",
        "4 actors (`num_cpus=0`) each run `small_value_batch(10000)`: submit 10,000 `small_value` "
        "tasks and `ray.get` them; 40,000 ops per round",
        "4 `Echo` actors (`num_cpus(0.0)`) each run `small_value_batch(10000)`: submit 10,000 "
        "`small_value` tasks and `get_all` them; 40,000 ops per round",
    ),
    (
        "1:1 actor calls sync",
        "`ray.get(a.small_value.remote())` on an `Actor` (`num_cpus=0`); 1 op per call",
        "`a.small_value().get()` on an `Echo` actor (`num_cpus(0.0)`); 1 op per call",
    ),
    (
        "1:1 actor calls async",
        "1000 `a.small_value.remote()` then `ray.get`; 1000 ops per round",
        "1000 `a.small_value()` then `get_all`; 1000 ops per round",
    ),
    (
        "1:1 actor calls concurrent",
        "as async, on an `Actor` with `max_concurrency=16` (a thread pool)",
        "as async, on an `Echo` with `max_concurrency(16)` (sync methods on 16 threads)",
    ),
    (
        "1:n actor calls async",
        "a `Client` actor calls `small_value` 5000 times on each of `cpu_count // 2` actors and gets "
        "them; 5000 × actors ops per round",
        "a `Caller` actor does the same through untyped `ActorHandle`s; 5000 × actors ops per round",
    ),
    (
        "n:n actor calls async",
        "4 `work` tasks each call `small_value` 5000 times round-robin over `cpu_count // 2` actors; "
        "20,000 ops per round",
        "4 `call_round_robin` tasks do the same; 20,000 ops per round",
    ),
    (
        "n:n actor calls with arg async",
        "`cpu_count // 2` `Client` actors each `ray.put(0)` and pass it to 1000 `small_value_arg` "
        "calls of their own actor; 1000 × clients ops per round",
        "`Caller` actors do the same with `cluster.put(&0u64)` passed as an `ObjectRef` argument; "
        "**not the same work**: raylet sends a value under 100 KiB inside each call, Ray each worker "
        "fetches it from plasma by its ref",
    ),
    (
        "n:n actor calls with 1 MiB arg async",
        "as *n:n actor calls with arg async*, with `ray.put(np.ones(1 << 20, dtype=np.uint8))` in place of "
        "`ray.put(0)` (`bench/ray_object_metrics.py`): each call's worker reads the 1 MiB from plasma "
        "(zero-copy numpy)",
        "as *n:n actor calls with arg async*, with `cluster.put(&SharedBytes::from(vec![1u8; 1 MiB]))`: "
        "above the inline limit, so each call's worker maps it from the node's shared-memory store and "
        "reads it as `SharedBytes`, a view of the mapping (zero-copy)",
        "",
        "objects",
    ),
    (
        "1:1 async-actor calls sync",
        "`ray.get(a.small_value.remote())` on an `AsyncActor` (async def); 1 op per call",
        "`a.small_value().get()` on an `AsyncEcho` actor (async fn); 1 op per call",
    ),
    (
        "1:1 async-actor calls async",
        "1000 calls on an `AsyncActor`, then `ray.get`; 1000 ops per round",
        "1000 calls on an `AsyncEcho`, then `get_all`; 1000 ops per round",
    ),
    (
        "1:1 async-actor calls with args async",
        "1000 `small_value_with_arg.remote(i)`; 1000 ops per round",
        "1000 `small_value_with_arg(i)`; 1000 ops per round",
    ),
    (
        "1:n async-actor calls async",
        "a `Client` calls 5000 times each of `cpu_count // 2` `AsyncActor`s; 5000 × actors ops per round",
        "a `Caller` does the same on `AsyncEcho` actors",
    ),
    (
        "n:n async-actor calls async",
        "4 tasks each call 5000 times round-robin over `cpu_count // 2` `AsyncActor`s; 20,000 ops per round",
        "4 `call_round_robin` tasks do the same on `AsyncEcho` actors",
    ),
    (
        "placement group create/removal",
        "on a cluster started with `resources={\"custom\": 100}`: 100 `placement_group([{\"custom\": 0.001}])`, "
        "then `pg.wait()` on each, then `remove_placement_group` on each; 100 ops per round",
        "on an embedded node with `custom: 100`: 100 `cluster.placement_group(vec![Bundle::new().resource(\"custom\", "
        "0.001)], Pack)`, then `ready()` on each, then `remove()` on each; 100 ops per round",
    ),
    (
        "generator items (1 KiB)",
        "one task `items_of.remote(1024, 1000)` (`num_returns=\"streaming\"`, `bench/ray_generator_metrics.py`) "
        "yields 1000 items of 1 KiB (`bytes`, returned inline); the driver iterates the `ObjectRefGenerator` "
        "and `ray.get`s each item as its ref arrives; backpressure at Ray's default (none); 1000 ops per task",
        "one task `items_of::remote(&cluster, 1024, 1000)` (`#[raylet::remote(streaming)]`) yields 1000 "
        "items of 1 KiB (`ByteBuf`, sent inline); the driver iterates the `ObjectRefStream` and `get`s each "
        "item as its ref arrives; backpressure at raylet's default (64 items ahead, where Ray has none); "
        "1000 ops per task",
        "",
        "generators",
    ),
    (
        "generator items (1 MiB)",
        "as the 1 KiB row with `items_of.remote(1 << 20, 100)`: 100 items of 1 MiB, each put in plasma by "
        "the worker and read from it by the driver's `ray.get`; 100 ops per task",
        "as the 1 KiB row with `items_of::remote(&cluster, 1 << 20, 100)`: 100 items of 1 MiB, each through "
        "the node's shared-memory store; 100 ops per task",
        "",
        "generators",
    ),
]]

# Bytes that cross a process on both sides: a put in the driver, a get in
# an actor's worker process on the same node, beside a memcpy of the bytes.
CROSS_PROCESS = [Row(*row) for row in [
    (
        "single client put and get in another process, small objects",
        "1000 × `ray.put(i)`, then one call of an actor (`num_cpus=0`) that is handed the refs in a list "
        "and `ray.get`s them; 1000 ops per round",
        "1000 × `cluster.put(&i)`, then one call of an actor (`num_cpus(0.0)`) that is handed the refs in "
        "a `Vec` and `get_all`s them; the driver, their owner, sends their values along with the call "
        "(up to 1 MiB a call), so the gets are answered in the actor's process; 1000 ops per round",
        "",
        "objects",
    ),
    (
        "single client get in another process, one by one, small objects",
        "10,000 × `ray.put(i)` once; then per round one call of the same actor, handed those refs in a list, "
        "that `ray.get`s them one at a time; 10,000 ops per round",
        "10,000 × `cluster.put(&i)` once; then per round one call of the same actor, handed those refs in a "
        "`Vec`, that `get`s them one at a time; the driver sends their values along with the call (about 0.12 MiB "
        "of its 1 MiB budget), so the gets are answered in the actor's process; 10,000 ops per round",
        "",
        "objects",
    ),
    (
        "single client get in another process, one by one, small objects not sent along",
        "10,000 × `ray.put(i)` and `listed = ray.put(those refs)` once; then per round one call of the same "
        "actor, handed `[listed]`, that `ray.get`s the list and then each value one at a time (from plasma); "
        "10,000 ops per round",
        "10,000 × `cluster.put(&i)` and `listed = cluster.put(&those refs)` once; then per round one call of "
        "the same actor, handed `vec![listed]`, that `get`s the list and then each value one at a time; no "
        "value is sent along, so each get asks the driver, their owner; 10,000 ops per round",
        "",
        "objects",
    ),
] + [
    (
        f"single client put and get in another process, {size}",
        f"`ray.put` of a {size} `np.ones` array (plasma), then an actor call that `ray.get`s it from a "
        "list and returns its length (a zero-copy numpy view); 1 op per object",
        f"`cluster.put` of {size} of ones as `SharedBytes` (the node's shared-memory store), then an actor "
        "call that `get`s it (maps it; the `SharedBytes` are a view of the mapping, zero-copy) and returns "
        "its length; "
        "1 op per object",
        "",
        "objects",
        f"memcpy {size}",
    )
    for size in ("100 KiB", "1 MiB", "10 MiB")
]]

LIFECYCLE_ROWS = ["start", "idle-rss", "idle-pss", "status", "stop", "first-task"]
PHYSICAL_ROWS = ["memcpy", "tcp", "transfer"]
TRANSFER_METRIC = "node-to-node transfer gigabytes"


def run(cmd, env=None, timeout=600, check=True):
    """Runs cmd; returns (wall seconds, completed process)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, timeout=timeout, capture_output=True, text=True, cwd=WORK
    )
    wall = time.perf_counter() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    return wall, proc


# ---------------------------------------------------------------- processes


def system_processes(markers, root_pids=()):
    """Processes whose command line contains one of `markers`, or whose pid
    is in root_pids, plus all their descendants; this helper and its parent
    excluded. Returns [(pid, cmdline, rss KiB, pss KiB)]."""
    table = proc_table(memory=True)
    exclude = {os.getpid(), os.getppid()}
    chosen = {
        pid
        for pid, (_, _, cmdline, _, _) in table.items()
        if pid not in exclude and cmdline and any(m in cmdline for m in markers)
    }
    chosen |= {pid for pid in root_pids if pid in table}
    add_descendants(table, chosen, exclude)
    return [(pid, *table[pid][2:]) for pid in sorted(chosen)]


def short_name(cmdline):
    args = cmdline.split()
    if not args:
        return "?"
    first = args[0]
    if first.startswith("ray::") or first.startswith("ray-dashboard-"):
        return first
    name = os.path.basename(first)
    if name.startswith("python"):
        for i, arg in enumerate(args[1:], 1):
            if arg == "-m" and i + 1 < len(args):
                return f"python -m {args[i + 1]}"
            if arg.endswith(".py"):
                return f"python {os.path.basename(arg)}"
            if arg == "-c":
                return "python -c (" + " ".join(args[i + 1 : i + 4])[:40] + "...)"
    if name == "raylet" and len(args) > 1 and not args[1].startswith("-"):
        return "raylet " + " ".join(a for a in args[1:3])
    return name


def ray_processes(temp_dir):
    # Everything of this Ray install (target/bench-venv, used by nothing
    # else) or of this session's temp dir, and their children (the workers
    # and agents that rename themselves to ray::...).
    return system_processes([str(VENV) + "/", str(temp_dir)])


def raylet_processes(temp_dir):
    pids = []
    for pid_file in (Path(temp_dir) / "session_latest" / "processes").glob("*.json"):
        try:
            pids.append(int(json.loads(pid_file.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            pass
    # Not the binary's path: other raylet processes (tests) may run from it.
    return system_processes([str(temp_dir)], pids)


def ray_stop_force():
    if RAY.exists():
        run([RAY, "stop", "--force"], env=RAY_ENV, timeout=120, check=False)


def ensure_no_ray():
    if ray_processes("/nonexistent-ray-temp-dir"):
        log("leftover Ray processes: ray stop --force")
        ray_stop_force()


# ---------------------------------------------------------------- measurements

LINE_RE = r"^{} per second ([0-9.eE+-]+|nan) \+- ([0-9.eE+-]+|nan)\s*$"


def parse_rate(name, text):
    m = re.search(LINE_RE.format(re.escape(name)), text, re.M)
    if not m:
        raise RuntimeError(f"no line for {name!r} in output:\n{text[-3000:]}")
    return float(m.group(1))


# `ray microbenchmark` is `from ray._private.ray_perf import main; main()`.
# Its last section, the Ray Client benchmarks (`client: ...`, none of which
# any filter here selects), still starts a Ray Client server and a second
# cluster whatever TESTS_TO_RUN says; on this machine that start times out
# after about two minutes and fails the run. So this calls the same main()
# with that section replaced by a no-op; every benchmark it runs, and how it
# times it, is unchanged.
RAY_MICROBENCHMARK = (
    "import ray._private.ray_perf as perf\n"
    "perf.client_microbenchmark_main = lambda results=None: results\n"
    "perf.main()\n"
)


def ray_metric(row):
    ensure_no_ray()
    env = dict(RAY_ENV, TESTS_TO_RUN=row.name)
    script = {
        "perf": ["-c", RAY_MICROBENCHMARK],
        "objects": [OBJECT_METRICS_PY],
        "generators": [GENERATOR_METRICS_PY],
    }[row.ray_script]
    _, proc = run([RAY_PY, *script], env=env, timeout=1200)
    try:
        return parse_rate(row.name, proc.stdout)
    finally:
        ensure_no_ray()


def raylet_metric(name, quick):
    cmd = [RAYLET, "microbenchmark", "--filter", name] + (["--quick"] if quick else [])
    _, proc = run(cmd, env=RAYLET_ENV, timeout=600)
    return parse_rate(name, proc.stdout)


def measure_row(row, res, args, ray_on):
    """Both sides of one microbenchmark row, alternating, and raylet's
    memcpy of the same bytes where the row moves bytes."""
    r = res["metrics"].setdefault(row.name, {"ray": [], "raylet": [], "memcpy": []})
    for rep in range(args.reps):
        for side in sides(rep, ray_on):
            log(f"{row.name} [{side} rep {rep + 1}/{args.reps}]")
            value = ray_metric(row) if side == "ray" else raylet_metric(row.raylet_name or row.name, args.quick)
            log(f"  -> {value:,.2f} per second")
            r[side].append(value)
        if row.memcpy:
            r["memcpy"].append(raylet_metric(row.memcpy, args.quick))
        if not ray_on:
            r["ray"].append(None)


def rss_snapshot(procs):
    return {
        "rss_mib": sum(p[2] for p in procs) / 1024,
        "pss_mib": sum(p[3] for p in procs) / 1024,
        "count": len(procs),
        "processes": [
            {"pid": p[0], "name": short_name(p[1]), "rss_mib": p[2] / 1024, "pss_mib": p[3] / 1024}
            for p in procs
        ],
    }


def status_latency(cmd, env, calls=3):
    times = []
    for _ in range(calls):
        wall, _ = run(cmd, env=env, timeout=120)
        times.append(wall)
    return statistics.median(times)


def ray_lifecycle(rep, idle_s):
    ensure_no_ray()
    temp_dir = Path(f"/tmp/rb{os.getpid()}r{rep}")  # short: Ray's socket paths must fit 107 bytes
    shutil.rmtree(temp_dir, ignore_errors=True)
    try:
        start, _ = run([RAY, "start", "--head", f"--temp-dir={temp_dir}"], env=RAY_ENV, timeout=300)
        time.sleep(idle_s)
        rss = rss_snapshot(ray_processes(temp_dir))
        status = status_latency([RAY, "status"], RAY_ENV)
        stop, _ = run([RAY, "stop"], env=RAY_ENV, timeout=300)
    finally:
        ray_stop_force()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {"start": start, "rss": rss, "status": status, "stop": stop}


def raylet_lifecycle(rep, idle_s):
    temp_dir = Path(f"/tmp/rl{os.getpid()}r{rep}")
    shutil.rmtree(temp_dir, ignore_errors=True)
    stopped = False
    try:
        start, _ = run(
            [RAYLET, "start", "--head", "--port", "0", "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300
        )
        time.sleep(idle_s)
        rss = rss_snapshot(raylet_processes(temp_dir))
        status = status_latency([RAYLET, "status", "--temp-dir", temp_dir], RAYLET_ENV)
        stop, _ = run([RAYLET, "stop", "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300)
        stopped = True
    finally:
        if not stopped:
            run([RAYLET, "stop", "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300, check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {"start": start, "rss": rss, "status": status, "stop": stop}


def timed_line(cmd, env, pattern, timeout=300):
    """Runs cmd; returns (seconds from spawn until a stdout line matches
    pattern, the match, all stdout). Waits for the process to exit."""
    env = dict(env, BENCH_T0=repr(time.time()))
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=WORK)
    seen, match, lines = None, None, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if match is None:
                match = re.search(pattern, line)
                if match:
                    seen = time.perf_counter() - t0
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if match is None or proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode} without {pattern!r}:\n{''.join(lines)[-3000:]}")
    return seen, match, "".join(lines)


def ray_first_task():
    ensure_no_ray()
    try:
        wall, m, out = timed_line([RAY_PY, FIRST_TASK_PY], RAY_ENV,
                                  r"first task result ([0-9.]+) ms after start")
    finally:
        ensure_no_ray()
    detail = re.search(r"import ray ([0-9.]+) ms, ray.init\(\) ([0-9.]+) ms", out)
    return {
        "printed_ms": float(m.group(1)),
        "wall_ms": wall * 1000,
        "import_ms": float(detail.group(1)) if detail else None,
        "init_ms": float(detail.group(2)) if detail else None,
    }


def raylet_first_task():
    wall, m, out = timed_line([QUICKSTART], RAYLET_ENV, r"first task result ([0-9.]+) ms after start")
    ready = re.search(r"cluster ready in ([0-9.]+) ms", out)
    return {
        "printed_ms": float(m.group(1)),
        "wall_ms": wall * 1000,
        "init_ms": float(ready.group(1)) if ready else None,
    }


def raylet_transfer(rep, quick):
    """GB/s of pulling 1 GiB between the stores of two node managers that
    `raylet start` runs, as `raylet microbenchmark` measures it."""
    temp_dir = Path(f"/tmp/rl{os.getpid()}t{rep}")
    shutil.rmtree(temp_dir, ignore_errors=True)
    try:
        run([RAYLET, "start", "--head", "--port", "0", "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300)
        head = (temp_dir / "session_latest" / "head_address").read_text().strip()
        run([RAYLET, "start", "--address", head, "--resources", '{"microbenchmark_peer": 1}',
             "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300)
        env = dict(RAYLET_ENV, RAYLET_ADDRESS=head, RAYLET_TEMP_DIR=str(temp_dir))
        cmd = [RAYLET, "microbenchmark", "--filter", TRANSFER_METRIC] + (["--quick"] if quick else [])
        _, proc = run(cmd, env=env, timeout=600)
        return {"transfer_GBps": parse_rate(TRANSFER_METRIC, proc.stdout)}
    finally:
        run([RAYLET, "stop", "--temp-dir", temp_dir], env=RAYLET_ENV, timeout=300, check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)


def physical(kind):
    _, proc = run([PHYSLIMITS, kind], timeout=60)
    return {k: float(v) for k, v in (line.split() for line in proc.stdout.splitlines() if line.strip())}


# ---------------------------------------------------------------- report


def fmt(v, unit=""):
    if v is None:
        return "—"
    if float(v).is_integer() and abs(v) < 100:
        s = f"{int(v)}"
    elif abs(v) >= 100:
        s = f"{v:,.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    elif abs(v) >= 1:
        s = f"{v:.2f}"
    else:
        s = f"{v:.3f}"
    return s + unit


def summary(values, unit=""):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med, unit)
    return f"{fmt(med, unit)} ({fmt(min(values))}–{fmt(max(values))})"


def fmt_ratio(x):
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:,.1f}"
    if x >= 0.1:
        return f"{x:.2f}"
    return f"{x:.2g}"


def ratio(ray_values, raylet_values, bold=True):
    """The ratio of the medians with the per-repetition range; in bold
    unless the two sides do different work."""
    pairs = [(a, b) for a, b in zip(ray_values, raylet_values) if a and b is not None]
    if not pairs:
        return "—"
    med = statistics.median(b for _, b in pairs) / statistics.median(a for a, _ in pairs)
    per_rep = [b / a for a, b in pairs]
    text = f"**{fmt_ratio(med)}×**" if bold else f"{fmt_ratio(med)}×"
    if len(per_rep) > 1:
        text += f" ({fmt_ratio(min(per_rep))}–{fmt_ratio(max(per_rep))})"
    return text


def write_cross_process(w, res):
    """The table of rows whose bytes cross a process on both sides, each
    beside a memcpy of the same bytes measured in the same run."""
    rows = [row for row in CROSS_PROCESS if row.name in res["metrics"]]
    if not rows:
        return
    w("### Put and get in another process\n")
    w("The bytes cross a process on both sides, as they do in Ray: the driver puts, and an actor in "
      "another worker process of the same node gets. Operations per second, **higher is better**. "
      "*memcpy* is `raylet microbenchmark`'s `memcpy <size>` row, a copy of the same number of written "
      "bytes into a buffer of that size, measured in the same run as a floor of what moving them "
      "costs; the last two columns say how far each side is from it.\n")
    w("| Metric | Ray 2.60 | raylet | raylet / Ray | memcpy of the bytes | Ray / memcpy | raylet / memcpy "
      "| Workload: Ray | Workload: raylet |")
    w("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        r = res["metrics"][row.name]
        copies = r.get("memcpy") or []
        w(f"| {row.name} | {summary(r['ray'])} | {summary(r['raylet'])} | {ratio(r['ray'], r['raylet'])} "
          f"| {summary(copies)} | {share_of(r['ray'], copies)} | {share_of(r['raylet'], copies)} "
          f"| {row.ray_work} | {row.raylet_work} |")
    w("")


def write_memcpy_share(w, metric, puts, phys):
    """A line that sets each side's put bandwidth against memcpy's."""
    mem = statistics.median(p["memcpy_mean_GBps"] for p in phys["memcpy"])
    parts = []
    for side, title in (("ray", "Ray"), ("raylet", "raylet")):
        vals = [v for v in puts[side] if v is not None]
        if vals:
            parts.append(f"{title}'s {statistics.median(vals):.2f} GB/s is {100 * statistics.median(vals) / mem:.0f}%")
    if parts:
        w(f"For scale, *{metric}* against one memcpy of the same bytes ({mem:.1f} GB/s): "
          f"{'; '.join(parts)} of it.\n")


def share_of(values, floors):
    """The median of `values` over the median of `floors`, or a dash."""
    values = [v for v in values if v is not None]
    if not values or not floors:
        return "—"
    return f"{fmt_ratio(statistics.median(values) / statistics.median(floors))}×"


def git(*args):
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gib": mem_kib / 1024 / 1024,
        "cpu": model,
        "kernel": platform.release(),
        "shm_gib": shutil.disk_usage("/dev/shm").total / 2**30 if os.path.exists("/dev/shm") else 0,
    }


def versions(ray_wanted):
    out = {}
    if ray_wanted:
        _, proc = run([RAY_PY, "-c", "import ray, sys; print(ray.__version__, ray.__commit__); print(sys.version.split()[0])"],
                      timeout=120, check=False)
        lines = proc.stdout.split("\n")
        out["ray"] = lines[0].strip() if proc.returncode == 0 else f"unavailable ({proc.stderr.strip()[-200:]})"
        out["python"] = lines[1].strip() if proc.returncode == 0 and len(lines) > 1 else ""
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    out["raylet"] = commit + (" (working tree has uncommitted changes)" if dirty else "")
    out["raylet_version"] = run([RAYLET, "--version"], timeout=30, check=False)[1].stdout.strip()
    out["rustc"] = subprocess.run(["rustc", "-V"], capture_output=True, text=True).stdout.strip()
    return out


def inline_section(w, file_name, heading, intro):
    """Writes a section whose table a raylet-train example wrote to bench/FILE_NAME, if it did."""
    table = Path(__file__).resolve().parent / file_name
    if table.exists():
        w(heading)
        w(intro)
        w(table.read_text())


def write_sections(w):
    """The sections that the other bench/ scripts wrote to bench/*.md, then
    how to reproduce the whole file."""
    inline_section(w, "envelope.md", "## Ray's release-test envelope\n",
                   "Ray's published scalability programs (release/benchmarks in Ray's repository), written for both "
                   "systems and scaled where this machine cannot hold the original; time and peak memory of the "
                   "head, the driver and the workers. Written by `bench/compare_envelope.sh`.\n")
    inline_section(w, "allreduce.md", "## Allreduce (raylet-train collective group)\n",
                   "Sum allreduce of f32 on 2 and 4 ranks, each a separate process on one host, over TCP on "
                   "loopback (as between hosts) against torch.distributed's Gloo backend and Open MPI over TCP, "
                   "and over shared memory (raylet's default for ranks on one host) against Open MPI's shared "
                   "memory (mpi4py); busbw = algbw × 2(n−1)/n as nccl-tests defines it. Written by "
                   "`bench/compare_allreduce.sh`.\n")
    inline_section(w, "train_digits.md", "## Data-parallel training (raylet-train on the digits)\n",
                   "The digits MLP trained by `raylet_train::Trainer` on the embedded cluster with 1 and 2 worker "
                   "actors (same global batch; gradients averaged over the collective group at every step). "
                   "The small model computes too little per step to gain from a second worker on this "
                   "2-core machine; the wider one does. Written by "
                   "`cargo run --release -p raylet-train --example digits_throughput -- --reps 3 "
                   "--write bench/train_digits.md`; no Ray counterpart is run.\n")
    inline_section(w, "sharding.md", "### Sharded data parallelism (ZeRO stages, `raylet_train::sharding`)\n",
                   "Samples per second and memory per rank of each `ShardingStrategy` on a 52 M-parameter model. "
                   "Stage 3 shards parameters and optimizer state (1/n of each per rank); stages 1 and 2 shard the "
                   "optimizer state only (stage 2's gradients are sharded within a step, not kept between steps). "
                   "The peak still holds the whole model once with every stage: raylet gathers the model as one "
                   "unit for the forward and backward passes (burn's autodiff gives no per-layer hook to gather "
                   "and free in, as FSDP does). No DeepSpeed or FSDP counterpart is run (no torch CUDA stack "
                   "here). Written by `cargo run --release -p raylet-train --example sharding_bench -- --steps 6 "
                   "--write bench/sharding.md`.\n")
    inline_section(w, "lm.md", "## A language model end to end (raylet-lm against PyTorch on Ray)\n",
                   "The GPT workload of `raylet-lm` (the README's \"Language models\" section) beside the same "
                   "model, data and optimizer in PyTorch under Ray Train and Ray Data; written by "
                   "`bench/compare_lm.sh`.\n")
    inline_section(w, "tune.md", "## Tune (raylet-tune)\n",
                   "raylet-tune against Ray Tune 2.60 (trial overhead) and Optuna's TPE (search quality), "
                   "and ASHA against FIFO on the digits; written by `bench/compare_tune.sh`.\n")
    inline_section(w, "data.md", "## Data (raylet-data)\n",
                   "raylet-data against Ray Data 2.60: files per second through a binary-file read and a trivial "
                   "per-batch model in a pool of 2 actors; written by `bench/compare_data.sh`.\n")
    write_data_at_scale(w)
    inline_section(w, "serve.md", "## Serve (raylet-serve)\n",
                   "raylet-serve against Ray Serve 2.60: requests/s and latency of a no-op application and an MLP "
                   "of the digits model's shape, each with 2 replicas, under oha at fixed concurrencies; written by "
                   "`bench/compare_serve.sh`. Both sides batch the MLP's requests alike (Ray's `@serve.batch`, "
                   "raylet-serve's `Batcher`), once with a 5 ms batch wait and once with none; what differs is that "
                   "Ray computes a batch with numpy and raylet-serve with plain Rust. Both read the same weights; "
                   "both proxies on 127.0.0.1, one node.\n")
    inline_section(w, "llm_serve.md", "## Serving a language model (raylet-llm against Ray Serve)\n",
                   "A GPT served OpenAI-compatibly (`POST /v1/completions`, streamed): raylet's `llm_serve` with "
                   "continuous batching against the same weights in PyTorch served by Ray Serve 2.60 with "
                   "`@serve.batch` (static batching, its documented way to batch a model without vLLM), under a "
                   "closed-loop load of fixed prompts with varied output lengths at concurrencies 1, 16 and 64; "
                   "output tokens/s, time to first token and inter-token latency. Written by "
                   "`bench/compare_llm_serve.sh`.\n")
    inline_section(w, "gpu.md", "## What ran on a GPU\n",
                   "`bench/gpu_check.sh` runs `examples/gpu_check.rs` on a lent GPU machine (`build` here, `device` "
                   "there, then `record` here appends its dated table to bench/gpu.md). Figures on a GPU are not "
                   "comparable with the CPU rows of this file.\n\n")
    w("## Reproducing\n")
    w("```sh\nbench/run_all.sh                  # every table: the sections' scripts, then this file\n"
      "bench/compare_ray.sh              # the microbenchmark, lifecycle and physical tables (about 60 min),\n"
      "                                  # then BENCHMARKS.md with the sections' bench/*.md inlined\n"
      "bench/compare_ray.sh --reps 5     # more repetitions\n"
      "bench/compare_ray.sh --only 'tasks sync' --only start   # a subset (written to target/bench/)\n"
      "bench/compare_ray.sh --quick --raylet-only              # CI smoke run, no Ray\n```\n")
    w("The raw numbers behind this file are in `target/bench/results.json` (not committed); "
      "`python3 bench/compare_ray.py --report-from target/bench/results.json` rewrites this file from them.\n")

# What the gigabyte-scale Data runs showed, above their reports (kept here
# so that a refresh of BENCHMARKS.md keeps it).
DATA_AT_SCALE = (
    "Three pipelines at Ray's published scales, side by side with Ray Data 2.60 in one run each, written by "
    "`bash bench/compare_data.sh --only parquet|shuffle --reps 3` and `--only images --reps 2` (reports in "
    "`bench/data_parquet.md`, `bench/data_images.md`, `bench/data_shuffle.md`). The goal issue 33 set, at "
    "least 10x Ray Data's throughput on Parquet and images with a lower peak RSS: **not met on Parquet (3.8x) "
    "and on images against Ray's default batches (8.0x; 16.4x against `batch_size=64`); met on memory "
    "everywhere** (the driver 10x less, the workers 6.9x less on Parquet and 50x less on images). Why Parquet "
    "stops near 4x: in `perf` of raylet's run, Snappy compression of the output and decompression of the "
    "input take 42% of all CPU time (the `snap` crate; both sides read and write Snappy), and the rest is "
    "Parquet decoding and encoding, statistics and the page faults of 64 MiB blocks; the run keeps both cores "
    "busy (7% idle). Writing Float64 columns without the dictionary arrow-rs tried on each cut raylet's time "
    "from 2.2 to 1.7 s. The images run is bound by the CNN's convolutions on burn's `flex` backend (1 actor: "
    "2.1 s, 2 actors: 1.1 s), where Ray's torch computes the same network faster and spends its time "
    "elsewhere. Ray's side of the images row runs torch 2.15 (the CUDA build, on the CPU: no CPU-only wheel "
    "installs here) with seeded random weights, raylet's burn the trained checkpoint: the same network and "
    "work per image.\n")


def write_data_at_scale(w):
    """The gigabyte-scale Data reports that bench/compare_data.sh --only wrote, under one heading."""
    here = Path(__file__).resolve().parent
    reports = [here / name for name in ("data_parquet.md", "data_images.md", "data_shuffle.md")]
    if not any(report.exists() for report in reports):
        return
    w("### At gigabyte scale: Parquet, images and shuffle\n")
    w(DATA_AT_SCALE)
    for report in reports:
        if report.exists():
            w(report.read_text().replace("\n### ", "\n#### "))


# The headings that write_sections writes; a refresh keeps the report above
# the first of them.
SECTION_HEADINGS = ["## Ray's release-test envelope", "## Allreduce", "## Data-parallel training", "## Tune",
                    "## Data (", "## Reproducing"]


def refresh_sections(path):
    """Rewrites the inlined sections of an existing report, keeping its
    measured tables above them as they are."""
    text = Path(path).read_text()
    cut = min((text.index("\n" + h) + 1 for h in SECTION_HEADINGS if "\n" + h in text), default=len(text))
    lines = [text[:cut].rstrip("\n") + "\n"]
    write_sections(lines.append)
    Path(path).write_text("\n".join(lines))


def write_report(path, args, res, info, vers, started, finished):
    ray_on = not args.raylet_only
    L = []
    w = L.append
    w("# Benchmarks: raylet vs Ray 2.60\n")
    w(f"Generated by `bench/compare_ray.sh{(' ' + ' '.join(args.passthrough)) if args.passthrough else ''}` "
      f"on {started:%Y-%m-%d} ({started:%H:%M}–{finished:%H:%M} UTC). Re-run it to refresh this file; "
      "`bench/compare_ray.sh --help` lists the options.\n")
    w("## Setup\n")
    w(f"- **Machine:** {info['cores']} cores ({info['cpu']}), {info['memory_gib']:.1f} GiB memory, "
      f"/dev/shm {info['shm_gib']:.1f} GiB, Linux {info['kernel']}. A shared, noisy VM: other work "
      "(builds, tests) may run during the benchmark, which is why the two systems are measured "
      "alternately, metric by metric, and the ratios matter more than the absolute numbers.")
    if ray_on:
        w(f"- **Ray:** {vers.get('ray')} (`ray[default,tune,train]==2.60.0` from PyPI in `target/bench-venv`, "
          f"Python {vers.get('python')}); `RAY_USAGE_STATS_ENABLED=0` and `RAY_AUTH_MODE=token` "
          "(token authentication, as raylet's cluster token; left unset, Ray 2.60 turns it on in "
          "`ray.init()` but in `ray start` only once `~/.ray/auth_token` exists, and `ray status` then fails), "
          "everything else default (so `ray start --head` also starts the dashboard, as it does "
          "with `ray[default]`).")
    else:
        w(f"- **Ray:** not run ({args.ray_note or '--raylet-only'}).")
    w(f"- **raylet:** commit {vers['raylet']} (`{vers['raylet_version']}`), "
      f"`cargo build --release` ({vers['rustc']}).")
    w(f"- **Repetitions:** {args.reps} per row{' (--quick: raylet trials shortened)' if args.quick else ''}; "
      "values are the median over repetitions with (min–max); the ratio is the raylet median over the Ray "
      "median, with (min–max) of the per-repetition ratios, each repetition pairing the two runs made "
      "back to back.\n")
    if args.ray_note and not args.raylet_only:
        w(f"> Ray could not be used: {args.ray_note}\n")

    if res["metrics"]:
        w("## Microbenchmarks (`ray microbenchmark` vs `raylet microbenchmark`)\n")
        w("Operations per second, **higher is better**; a ratio above 1 means raylet is faster. Ray side: "
          "Ray's `ray microbenchmark` code (`ray._private.ray_perf.main()`) with `TESTS_TO_RUN='<metric>'`, "
          "its Ray Client section (`client: …` rows) replaced by a no-op because on this machine its "
          "client server fails to start after a two-minute timeout and fails the whole run "
          "(a fresh `ray.init()` local cluster per run; Ray's own timing: a 10 s sleep, 1 s warm-up, "
          "4 trials of 2 s, the mean printed). raylet side: "
          f"`raylet microbenchmark --filter '<metric>'{' --quick' if args.quick else ''}` (a fresh embedded "
          "cluster per run, the same timing). Each run is one process doing only that metric; "
          "the value is the `per second MEAN` it prints.\n")
        w("| Metric | Ray 2.60 | raylet | raylet / Ray | Workload: Ray | Workload: raylet |")
        w("|---|---:|---:|---:|---|---|")
        for row in METRICS:
            if row.name not in res["metrics"]:
                continue
            r = res["metrics"][row.name]
            label = f"{row.name}; raylet: *{row.raylet_name}*" if row.raylet_name else row.name
            ratio_text = ratio(r['ray'], r['raylet'], bold=row.same_work)
            w(f"| {label} | {summary(r['ray'])} | {summary(r['raylet'])} | {ratio_text} "
              f"| {row.ray_work} | {row.raylet_work} |")
        w("")
        write_cross_process(w, res)
        if "single client put gigabytes" in res["metrics"] or "multi client put gigabytes" in res["metrics"]:
            w("Note on *put gigabytes*: both sides copy the bytes into shared memory. Ray copies into "
              "plasma's arena, whose pages every client keeps mapped; raylet writes each object into its "
              "own memfd, and a freed object's memfd is handed back to the process that wrote it, which "
              "still maps it, so a put of a reused size is one copy with no page faults. Both sides' "
              "sources are zero-filled buffers that were never written (`np.zeros`, which numpy advises "
              "to huge pages; raylet allocates its buffers the same way): reading them reads the "
              "kernel's zero page, not memory, so these rows can pass the memcpy bandwidth below. "
              "*single client put gigabytes from written memory* is the same put from a buffer of "
              "written bytes, on both sides, to compare with memcpy.\n")
        if ray_on:
            w("Reading these numbers: both sides run their default local cluster on the same 2 cores. "
              "Ray's driver is Python over its C++ core worker, and its default head also runs the "
              "dashboard, its agents and monitors (the process list under *Lifecycle*), which share those "
              "cores; raylet's driver is the Rust program itself, and its head is one process. Expect Ray's "
              "absolute figures to be lower here than on a machine with spare cores: the ratios describe "
              "this machine, not a general speed-up. The get/put-call rows compare Python calls through "
              "Ray's core worker to its plasma object store with Rust calls into the owner's in-process "
              "store of raylet (values under 100 KiB stay with their owner), so the two sides do different "
              "work per call: raylet names those rows *in-process* and their ratios are not in bold; the "
              "table *Put and get in another process* has the same work on both sides. Likewise *n:n "
              "actor calls with arg async*: raylet sends the small put inside each call where Ray's workers "
              "fetch it from plasma, so its ratio is not in bold either; *n:n actor calls with 1 MiB arg "
              "async* moves the argument through shared memory on both sides.\n")

    lc = res["lifecycle"]
    if lc:
        w("## Lifecycle\n")
        w("**Lower is better**; a ratio below 1 means raylet is cheaper/faster.\n")
        w("| Row | Ray 2.60 | raylet | raylet / Ray | How it is measured: Ray | How it is measured: raylet |")
        w("|---|---:|---:|---:|---|---|")

        def col(side, key, sub=None):
            out = []
            for rep in lc.get(side, []):
                v = rep.get(key)
                if sub and v is not None:
                    v = v.get(sub)
                out.append(v)
            return out

        rows = []
        if "start" in lc.get("rows", []):
            rows += [
                ("`start --head` until ready", col("ray_cycle", "start"), col("raylet_cycle", "start"), 1000, " ms",
                 "wall time of `ray start --head --temp-dir=/tmp/rb…` (returns once the head's processes are up)",
                 "wall time of `raylet start --head --port 0 --temp-dir /tmp/rl…` (returns once the daemon is ready)"),
                ("idle head RSS, all processes", col("ray_cycle", "rss", "rss_mib"),
                 col("raylet_cycle", "rss", "rss_mib"), 1, " MiB",
                 f"sum of VmRSS after {args.idle:g} s idle over every process whose command line contains the "
                 "Ray install (`target/bench-venv/`) or the session's temp dir, plus all their descendants "
                 "(workers and agents that rename themselves `ray::…`)",
                 f"sum of VmRSS after {args.idle:g} s idle over the pids in `<temp-dir>/session_latest/processes/*.json`, "
                 "every process whose command line contains the temp dir, plus all their descendants"),
                ("idle head PSS, all processes", col("ray_cycle", "rss", "pss_mib"),
                 col("raylet_cycle", "rss", "pss_mib"), 1, " MiB",
                 "as above, summing `Pss` from `/proc/PID/smaps_rollup` (shared pages counted once)",
                 "as above, summing `Pss`"),
                ("head processes", col("ray_cycle", "rss", "count"), col("raylet_cycle", "rss", "count"), 1, "",
                 "number of processes found as above", "number of processes found as above"),
                ("`status` latency", col("ray_cycle", "status"), col("raylet_cycle", "status"), 1000, " ms",
                 "wall time of `ray status` against the idle head (median of 3 calls per repetition)",
                 "wall time of `raylet status --temp-dir …` (median of 3 calls per repetition)"),
                ("`stop` latency", col("ray_cycle", "stop"), col("raylet_cycle", "stop"), 1000, " ms",
                 "wall time of `ray stop` (graceful; `ray stop --force` follows as cleanup, untimed)",
                 "wall time of `raylet stop --temp-dir …`"),
            ]
        if "first-task" in lc.get("rows", []):
            rows += [
                ("init + first task result", col("ray_first", "printed_ms"), col("raylet_first", "printed_ms"), 1, " ms",
                 "`bench/ray_first_task.py`: from just before the Python process is spawned (time passed in "
                 "`BENCH_T0`) through `import ray`, `ray.init()` (starts a local cluster) and "
                 "`ray.get(f.remote())`; the time it prints",
                 "`target/release/examples/quickstart`: the `first task result N ms after start` it prints "
                 "(from the start of `main` through `raylet::init()`, which starts an embedded cluster, and "
                 "the first remote task's result)"),
                ("init + first task, seen from outside", col("ray_first", "wall_ms"), col("raylet_first", "wall_ms"),
                 1, " ms", "from spawning the process until its `first task result` line is read",
                 "from spawning the process until its `first task result` line is read"),
            ]
        for label, ray_v, raylet_v, scale, unit, how_ray, how_raylet in rows:
            ray_s = [v * scale if v is not None else None for v in ray_v]
            raylet_s = [v * scale if v is not None else None for v in raylet_v]
            w(f"| {label} | {summary(ray_s, unit)} | {summary(raylet_s, unit)} | {ratio(ray_s, raylet_s)} "
              f"| {how_ray} | {how_raylet} |")
        w("")
        firsts = lc.get("ray_first") or []
        if firsts and firsts[0].get("import_ms") is not None:
            imp = statistics.median(f["import_ms"] for f in firsts)
            init = statistics.median(f["init_ms"] for f in firsts)
            w(f"Ray's init + first task splits into `python` start + `import ray` (median {imp:,.0f} ms "
              f"from spawn), `ray.init()` (median {init:,.0f} ms) and the first task.")
        rfirsts = lc.get("raylet_first") or []
        if rfirsts and rfirsts[0].get("init_ms") is not None:
            w(f"raylet's `raylet::init()` takes median {statistics.median(f['init_ms'] for f in rfirsts):,.1f} ms "
              "of its total (the quickstart's `cluster ready in N ms` line).")
        w("")
        for side, title in (("ray_cycle", "Ray"), ("raylet_cycle", "raylet")):
            reps = [r for r in lc.get(side) or [] if r.get("rss")]
            if not reps:
                continue
            last = reps[-1]["rss"]
            plural = "process" if last["count"] == 1 else "processes"
            w(f"<details><summary>{title}: idle head processes (last repetition, {last['count']} {plural}, "
              f"{last['rss_mib']:,.0f} MiB RSS, {last['pss_mib']:,.0f} MiB PSS)</summary>\n")
            w("| pid | process | RSS MiB | PSS MiB |")
            w("|---:|---|---:|---:|")
            for p in sorted(last["processes"], key=lambda p: -p["rss_mib"]):
                w(f"| {p['pid']} | `{p['name']}` | {p['rss_mib']:.1f} | {p['pss_mib']:.1f} |")
            w("\n</details>\n")

    phys = res["physical"]
    if phys:
        w("## Physical limits of this machine\n")
        w("Measured by the same script with `bench/physlimits.c` (`gcc -O2`), as reference points for "
          "the data-moving rows.\n")
        w("| Limit | Value | How |")
        w("|---|---:|---|")
        if "memcpy" in phys:
            w(f"| single-thread memcpy, best pass | {summary([p['memcpy_best_GBps'] for p in phys['memcpy']], ' GB/s')} "
              "| `physlimits memcpy`: `memcpy` of a pre-faulted 256 MiB buffer, repeated for 2 s; fastest pass |")
            w(f"| single-thread memcpy, mean | {summary([p['memcpy_mean_GBps'] for p in phys['memcpy']], ' GB/s')} "
              "| the same run: bytes copied over elapsed time |")
        if "tcp" in phys:
            w(f"| loopback TCP, one stream | {summary([p['tcp_GBps'] for p in phys['tcp']], ' GB/s')}; "
              f"{fmt(statistics.median(p['tcp_Gbitps'] for p in phys['tcp']), ' Gbit/s')} "
              "| `physlimits tcp`: a forked child writes 1 MiB blocks to 127.0.0.1 for 3 s; the reader's rate |")
        if "transfer" in phys:
            rates = [p["transfer_GBps"] for p in phys["transfer"]]
            share = ""
            if "tcp" in phys:
                tcp = statistics.median(p["tcp_GBps"] for p in phys["tcp"])
                share = f" ({100 * statistics.median(rates) / tcp:.0f}% of loopback TCP)"
            w(f"| raylet node-to-node transfer | {summary(rates, ' GB/s')}{share} "
              "| `raylet start --head`, a second `raylet start` with the `microbenchmark_peer` resource, then "
              f"`raylet microbenchmark --filter '{TRANSFER_METRIC}'`: a task on the second node maps a fresh "
              "1 GiB tensor put on the first, which its store pulls over plain TCP, splicing the memfds at both "
              "ends (one kernel copy; gRPC chunks under TLS); timed inside the task |")
        w("")
        for metric in ("single client put gigabytes", "single client put gigabytes from written memory"):
            puts = res["metrics"].get(metric)
            if puts and "memcpy" in phys:
                write_memcpy_share(w, metric, puts, phys)
    write_sections(w)
    Path(path).write_text("\n".join(L))


# ---------------------------------------------------------------- main


def sides(rep, ray_on):
    """The systems to measure in repetition `rep`, alternating which goes
    first so that drifting noise hits both alike; Ray only when it runs."""
    order = ["ray", "raylet"] if rep % 2 == 0 else ["raylet", "ray"]
    return [side for side in order if side != "ray" or ray_on]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions per row (default 3)")
    p.add_argument("--only", action="append", default=[], metavar="ROW",
                   help="run only rows whose name contains ROW (case-insensitive; repeatable or comma-separated). "
                        "Rows: the metric names, " + ", ".join(LIFECYCLE_ROWS + PHYSICAL_ROWS))
    p.add_argument("--quick", action="store_true", help="1 repetition, `raylet microbenchmark --quick`, 2 s idle")
    p.add_argument("--raylet-only", action="store_true", help="skip Ray entirely")
    p.add_argument("--out", help="report path (default BENCHMARKS.md for a full run, "
                                 "target/bench/BENCHMARKS.partial.md with --only/--quick/--raylet-only; "
                                 "the raw numbers go to target/bench/results.json, or results.partial.json)")
    p.add_argument("--ray-note", default="", help=argparse.SUPPRESS)
    p.add_argument("--idle", type=float, default=5.0, help="seconds of idle before the RSS snapshot (default 5)")
    p.add_argument("--report-from", metavar="JSON",
                   help="measure nothing: rewrite the report (--out, default BENCHMARKS.md) from a results.json")
    p.add_argument("--refresh-sections", action="store_true",
                   help="measure nothing: rewrite only the sections that bench/*.md hold in the report "
                        "(--out, default BENCHMARKS.md), keeping the tables above them")
    args = p.parse_args()
    if args.refresh_sections:
        out = Path(args.out) if args.out else ROOT / "BENCHMARKS.md"
        refresh_sections(out)
        log(f"rewrote the sections of {out}")
        return
    if args.report_from:
        data = json.loads(Path(args.report_from).read_text())
        saved = argparse.Namespace(**data["args"])
        out = Path(args.out) if args.out else ROOT / "BENCHMARKS.md"
        write_report(out, saved, data["results"], data["machine"], data["versions"],
                     datetime.datetime.fromisoformat(data["started"]),
                     datetime.datetime.fromisoformat(data["finished"]))
        log(f"wrote {out}")
        return
    args.passthrough = []
    skip = False
    for a in sys.argv[1:]:
        if skip or a == "--ray-note" or a.startswith("--ray-note="):
            skip = a == "--ray-note"
            continue
        args.passthrough.append(a)
    if args.quick:
        args.reps = 1
        args.idle = min(args.idle, 2.0)
    if args.ray_note:
        args.raylet_only = True
    only = [o.strip().lower() for item in args.only for o in item.split(",") if o.strip()]
    partial = bool(only) or args.quick or args.raylet_only
    out = Path(args.out) if args.out else (WORK / "BENCHMARKS.partial.md" if partial else ROOT / "BENCHMARKS.md")

    def wanted(row):
        return not only or any(o in row.lower() for o in only)

    ray_on = not args.raylet_only
    WORK.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    res = {"metrics": {}, "lifecycle": {}, "physical": {}}
    info = machine_info()
    vers = versions(ray_on)

    def save(finished=None):
        (WORK / ("results.partial.json" if partial else "results.json")).write_text(json.dumps(
            {"args": vars(args), "machine": info, "versions": vers, "results": res,
             "started": started.isoformat(), "finished": (finished or started).isoformat()},
            indent=1, default=str))

    try:
        # Microbenchmarks, metric by metric, the two systems alternating.
        for row in METRICS + CROSS_PROCESS:
            if wanted(row.name):
                measure_row(row, res, args, ray_on)
                save()

        # Lifecycle.
        lc = res["lifecycle"]
        lc["rows"] = []
        if any(wanted(row) for row in ["start", "idle-rss", "idle-pss", "status", "stop"]):
            lc["rows"].append("start")
            for rep in range(args.reps):
                for side in sides(rep, ray_on):
                    log(f"lifecycle [{side} rep {rep + 1}/{args.reps}]")
                    cycle = ray_lifecycle(rep, args.idle) if side == "ray" else raylet_lifecycle(rep, args.idle)
                    log(f"  -> start {cycle['start']*1000:.0f} ms, {cycle['rss']['count']} processes, "
                        f"RSS {cycle['rss']['rss_mib']:.0f} MiB, PSS {cycle['rss']['pss_mib']:.0f} MiB, "
                        f"status {cycle['status']*1000:.0f} ms, stop {cycle['stop']*1000:.0f} ms")
                    lc.setdefault(f"{side}_cycle", []).append(cycle)
                if not ray_on:
                    lc.setdefault("ray_cycle", []).append({})
                save()
        if wanted("first-task"):
            lc["rows"].append("first-task")
            for rep in range(args.reps):
                for side in sides(rep, ray_on):
                    log(f"init + first task [{side} rep {rep + 1}/{args.reps}]")
                    first = ray_first_task() if side == "ray" else raylet_first_task()
                    log(f"  -> {first}")
                    lc.setdefault(f"{side}_first", []).append(first)
                if not ray_on:
                    lc.setdefault("ray_first", []).append({})
                save()

        # Physical limits.
        for kind in PHYSICAL_ROWS:
            if wanted(kind):
                for rep in range(args.reps):
                    log(f"physical limit {kind} [rep {rep + 1}/{args.reps}]")
                    value = raylet_transfer(rep, args.quick) if kind == "transfer" else physical(kind)
                    log(f"  -> {value}")
                    res["physical"].setdefault(kind, []).append(value)
                save()
    finally:
        if ray_on:
            ensure_no_ray()
        save()

    finished = datetime.datetime.now(datetime.timezone.utc)
    save(finished)
    write_report(out, args, res, info, vers, started, finished)
    log(f"wrote {out}")
    print(out.read_text())


if __name__ == "__main__":
    main()
