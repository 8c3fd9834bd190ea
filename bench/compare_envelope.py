#!/usr/bin/env python3
"""The release-test envelope of Ray 2.60 and raylet side by side: our own
versions of Ray's scalability release tests (release/benchmarks in
ray-project/ray), run on both systems on this machine; writes
bench/envelope.md (a full run) or target/bench/envelope.partial.md (--quick,
--only, --raylet-only, --ray-only), and the raw numbers to
target/bench/envelope-results.json.

Run it through bench/compare_envelope.sh, which checks the Rust binaries and
the venv first. Standard library only: the system python runs it, so that its
own command line names neither system's install.

Workloads (the drivers bench/envelope_ray.py and
target/release/examples/scale_envelope do the same work and print one JSON
line with the workload's wall time, measured inside the driver):
  tasks_1m      N no-op tasks queued behind tasks blocking every CPU, then
                all gathered
  args_10k      one task taking N ObjectRefs (puts of lists of 10,000 ones)
  pgs_1000      N placement groups of one {"CPU": 0.001} bundle: created,
                waited ready, removed
  many_actors   N actors (0 CPUs each) created and each called once
  broadcast_1g  a 1 GiB object put by the driver on the head, then summed by
                one actor on each of N other hosts at once (network
                namespaces made by bench/netns_hosts.sh, each running a node
                with the resource hostK); needs root

Each run starts a fresh cluster (Ray: `ray start --head --num-cpus 2 ...`;
raylet: `raylet start --head --port 0 --num-cpus 2 ...`; for broadcast_1g the
head on the bridge address 10.210.0.1 and one node of 1 CPU in each of N
namespaces, every node with a 2 GiB object store), waits until the cluster's
processes are all up, runs the driver while sampling /proc every 200 ms, then
ends every process the run started. The systems alternate within each
repetition: Ray first in odd repetitions, raylet first in even ones.

What the memory columns measure (sums of VmRSS over a group of processes,
sampled; the peak of the sum):
  head daemons  the cluster's own processes on the head's host, workers
                excluded. Ray: everything `ray start --head` left running
                (gcs_server, raylet, dashboard and its module processes,
                agents, monitors, client server). raylet: the
                `raylet start --head` daemon.
  workers       the processes that run tasks and actors, on every host. Ray:
                `ray::...` processes (and default_worker.py before it renames
                itself) except its two agents. raylet: the driver binary
                re-executed by a node manager.
  node daemons  (broadcast_1g) the daemons of the namespace hosts.
  driver        the driver's peak RSS: its VmHWM, read with each sample, or its
                ru_maxrss at exit where that exceeds this process's own VmHWM
                (below it, ru_maxrss may be the forked copy of this process,
                which Linux counts in the child's maxrss).
Cluster processes are those in the sessions of the start commands (each runs
in its own) and all their descendants; when a run ends, also any process whose
command line names the run's temp dir. The sampler's own CPU time is recorded
with each run (sampler_cpu_s): it shares the 2 cores with the workload.
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import (ROOT, VENV, WORK, add_descendants, leftover_lines, log, machine_info, now_utc, own_ancestors,
                      run_line, snapshot, started_processes, stop_leftovers, summary_s, versions)

RAY = VENV / "bin" / "ray"
RAY_PY = VENV / "bin" / "python"
RAY_DRIVER = ROOT / "bench" / "envelope_ray.py"
RAYLET = ROOT / "target" / "release" / "raylet"
SCALE_ENVELOPE = ROOT / "target" / "release" / "examples" / "scale_envelope"
NETNS = ROOT / "bench" / "netns_hosts.sh"
BIN_SNAPSHOT = WORK / "envelope-bin"
LOGS = WORK / "envelope-logs"
REPORT = ROOT / "bench" / "envelope.md"
PARTIAL_REPORT = WORK / "envelope.partial.md"
RESULTS = WORK / "envelope-results.json"

SYSTEMS = ("ray", "raylet")
BRIDGE_IP = "10.210.0.1"
STORE_BYTES = 2 * 2**30
SAMPLE_S = 0.2
START_TIMEOUT_S = 180
# Ray's two agents are named like workers but are daemons of every node.
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")

BASE_ENV = {k: v for k, v in os.environ.items()
            if not k.startswith(("RAY_", "RAYLET_")) and k not in ("TESTS_TO_RUN", "TESTS_TO_SKIP")}
BASE_ENV["RAY_USAGE_STATS_ENABLED"] = "0"


@dataclass(frozen=True)
class Workload:
    name: str
    full: int
    quick: int
    unit: str
    published: str
    source: str
    what: str
    why: str
    timeout_base: float
    timeout_per_unit: float
    # What the two sides do differently, said in the table's row; its
    # ratio is then not in bold.
    differs: str = ""

    def timeout(self, scale):
        return self.timeout_base + self.timeout_per_unit * scale


PERF = "release/perf_metrics"
WORKLOADS = [
    Workload("tasks_1m", 1_000_000, 1_000, "tasks",
             "184.4 s (1,000,000 tasks queued on one m4.16xlarge, 64 vCPUs)",
             f"`{PERF}/scalability/single_node.json` (`1000000_queued_time`; Ray 2.37.0 by `{PERF}/metadata.json` "
             "at the same commit, 0652555), test `release/benchmarks/single_node/test_single_node.py`",
             "as Ray's `test_many_queued_tasks`: one task per CPU blocks on a gate actor, N no-op tasks (1 CPU "
             "each) are submitted behind them, the gate opens, and each result is got in turn",
             "Ray's scale, which Ray holds here, in about 9 minutes on a quiet machine and with a driver of "
             "over 6 GiB (`--scale tasks_1m=N` shortens a run)", 300, 0.003),
    Workload("args_10k", 10_000, 100, "refs",
             "17.2 s (10,000 arguments, one m4.16xlarge)",
             f"`{PERF}/scalability/single_node.json` (`10000_args_time`, same commit), "
             "test `test_single_node.py::test_many_args`",
             "N puts of a list of 10,000 ones, then one task that takes the N refs and returns the sum of all "
             "the lists; timed from the first put to the sum. Ray: the refs are the task's N positional "
             "arguments, which Ray resolves before the task runs (Ray's test passes the lists by value, which Ray "
             "puts into its object store); raylet: a function's arguments are fixed, so the task takes one `Vec` "
             "of the N refs and gets them itself",
             "Ray's scale", 300, 0.05,
             "Ray resolves N arguments before the task runs; raylet's task gets one `Vec` of N refs itself"),
    Workload("pgs_1000", 1_000, 10, "placement groups",
             "52.8 s (1,000 groups of 3 bundles on 64 nodes, plus 3,000 actors in them)",
             f"`{PERF}/benchmarks/many_pgs.json` (commit 08ff311), "
             "test `release/benchmarks/distributed/test_many_pgs.py`",
             "N placement groups of one `{\"CPU\": 0.001}` bundle created, each waited ready, all removed (Ray's "
             "test uses bundles `{node: 0.02, CPU: 1}`, `{CPU: 1}`, `{node: 0.02}` on 64 × 64 CPUs and starts 3 "
             "actors in each group)",
             "Ray's scale, with bundles that fit 2 CPUs", 300, 0.5),
    Workload("many_actors", 200, 4, "actors",
             "18.2 s (10,000 actors of 0.25 CPU on 64 nodes × 64 CPUs)",
             f"`{PERF}/benchmarks/many_actors.json` (commit 00f8d99), "
             "test `release/benchmarks/distributed/test_many_actors.py`",
             "N actors of no CPU (each its own worker process on both systems) created, then one call on each, "
             "all gathered",
             "what Ray holds here with room to spare: each Ray actor is a Python process of about 124 MiB RSS, "
             "58 MiB of it private, so 200 take 11.4 GiB of this 24 GiB machine and about 350 would fill it",
             300, 1.5),
    Workload("broadcast_1g", 3, 1, "hosts",
             "16.9 s (1 GiB to 50 nodes)",
             f"`{PERF}/scalability/object_store.json` (commit 08ff311), "
             "test `release/benchmarks/object_store/test_object_store.py`",
             "a 1 GiB array of ones (raylet: a u8 tensor) put by the driver on the head; one reader actor of no "
             "CPU on each of the N hosts (resource `hostK`), called once; then, timed, every reader is asked at "
             "once to sum the array's bytes on its host, which pulls the 1 GiB there (Ray: `np.sum`)",
             "N hosts (network namespaces, one node of 1 CPU each, object stores of 2 GiB) instead of 50 nodes",
             300, 60),
]
BY_NAME = {w.name: w for w in WORKLOADS}


# ---------------------------------------------------------------- processes


PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def process_stats():
    """{pid: (ppid, session id, state)} of every process, from /proc/PID/stat
    alone: this runs every sample, so it reads one file per process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = read_bytes(f"/proc/{entry}/stat")
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2:].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def process_details(pid):
    """(cmdline, network namespace inode, RSS KiB, private RSS KiB) of a
    process, None once it is gone. Private is RSS less the pages statm counts
    as shared (file-backed and shared memory: libraries, object stores)."""
    try:
        cmd = read_bytes(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        netns = os.stat(f"/proc/{pid}/ns/net").st_ino
        resident, shared = map(int, read_bytes(f"/proc/{pid}/statm").split()[1:3])
    except (OSError, ValueError):
        return None
    return cmd, netns, resident * PAGE_KIB, (resident - shared) * PAGE_KIB


def mem_available_kib():
    for line in read_bytes("/proc/meminfo").splitlines():
        if line.startswith(b"MemAvailable:"):
            return int(line.split()[1])
    return 0


OWN_CMDLINE = read_bytes("/proc/self/cmdline")


def vm_hwm_kib(pid, child=False):
    """The process's VmHWM; 0 if it is gone, or for a child of this process
    that has not exec'd yet (until then it is a copy of this process)."""
    try:
        if child and read_bytes(f"/proc/{pid}/cmdline") == OWN_CMDLINE:
            return 0
        for line in read_bytes(f"/proc/{pid}/status").splitlines():
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_name(cmd):
    """A short name for a process in the report: the binary, python's script
    or module, or the name a Ray process gave itself."""
    args = cmd.split()
    if not args:
        return "?"
    if args[0].startswith(("ray::", "ray-dashboard-")):
        return args[0]
    name = os.path.basename(args[0])
    if name.startswith("python"):
        for i, arg in enumerate(args[1:-1], 1):
            if arg == "-m":
                return f"python -m {args[i + 1]}"
            if arg == "-c":
                return f"python -c {args[i + 1]}…"
            if arg.endswith(".py"):
                return f"python {os.path.basename(arg)}"
    if len(args) > 2 and args[1] == "start":
        return f"{name} start {args[2]}"
    return name


@dataclass
class Cluster:
    """One system's cluster for one run."""
    system: str
    temp: Path
    env: dict
    driver: list = field(default_factory=list)
    sessions: set = field(default_factory=set)
    node_temps: list = field(default_factory=list)

    def is_worker(self, cmd):
        if self.system == "ray":
            # Ray's raylet names default_worker.py among its own arguments.
            args = cmd.split(maxsplit=2)
            return ((args[0].startswith("ray::") and args[0] not in RAY_AGENTS)
                    or (len(args) > 1 and args[1].endswith("default_worker.py")))
        return not cmd.startswith(str(BIN_SNAPSHOT / "raylet"))

    def pids(self, table, exclude):
        """The cluster's processes in a process_stats() table: those in the
        sessions of its start commands, and their descendants."""
        chosen = {pid for pid, (_, sid, _) in table.items() if sid in self.sessions and pid not in exclude}
        add_descendants(table, chosen, exclude)
        return chosen


class Sampler:
    """Peaks of the summed RSS of the cluster's process groups, and the
    driver's VmHWM, over the samples taken."""

    def __init__(self, cluster, driver_pid):
        self.cluster = cluster
        self.driver_pid = driver_pid
        self.netns = os.stat("/proc/self/ns/net").st_ino
        self.exclude = own_ancestors(process_stats()) | {driver_pid}
        self.peak = {"head_daemons": 0, "node_daemons": 0, "workers": 0}
        self.peak_private = dict.fromkeys(self.peak, 0)
        self.min_available = mem_available_kib()
        self.max_workers = 0
        self.head_at_peak = []
        self.driver_hwm = 0
        self.samples = 0
        self.cpu_s = 0.0

    def sample(self):
        cpu = time.process_time()
        table = process_stats()
        sums, private = dict.fromkeys(self.peak, 0), dict.fromkeys(self.peak, 0)
        head, workers = [], 0
        for pid in self.cluster.pids(table, self.exclude):
            details = process_details(pid) if table[pid][2] not in (b"Z", b"X") else None
            if not details or not details[0]:
                continue
            cmd, netns, rss, own = details
            if self.cluster.is_worker(cmd):
                group = "workers"
                workers += 1
            elif netns == self.netns:
                group = "head_daemons"
                head.append((process_name(cmd), rss))
            else:
                group = "node_daemons"
            sums[group] += rss
            private[group] += own
        if sums["head_daemons"] > self.peak["head_daemons"]:
            self.head_at_peak = sorted(head, key=lambda p: -p[1])
        for key in self.peak:
            self.peak[key] = max(self.peak[key], sums[key])
            self.peak_private[key] = max(self.peak_private[key], private[key])
        self.min_available = min(self.min_available, mem_available_kib())
        self.max_workers = max(self.max_workers, workers)
        self.driver_hwm = max(self.driver_hwm, vm_hwm_kib(self.driver_pid, child=True))
        self.samples += 1
        self.cpu_s += time.process_time() - cpu

    def result(self, driver_maxrss_kib):
        if driver_maxrss_kib > vm_hwm_kib(os.getpid()):
            self.driver_hwm = max(self.driver_hwm, driver_maxrss_kib)
        out = {f"{key}_peak_mib": round(value / 1024, 1) for key, value in self.peak.items()}
        out.update({f"{key}_private_peak_mib": round(value / 1024, 1) for key, value in self.peak_private.items()})
        out.update(driver_peak_mib=round(self.driver_hwm / 1024, 1),
                   workers_max=self.max_workers, min_mem_available_mib=round(self.min_available / 1024),
                   samples=self.samples, sampler_cpu_s=round(self.cpu_s, 2),
                   head_at_peak=[(name, round(rss / 1024, 1)) for name, rss in self.head_at_peak])
        return out


# ---------------------------------------------------------------- clusters


def free_port(ip):
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def start_command(cmd, env, what, cluster):
    """Runs a command that starts daemons, in its own session (recorded in
    the cluster, so that everything it leaves running is found), its output
    to a log file; raises when it fails."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log_file = LOGS / f"{what}.log"
    with open(log_file, "w") as out:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=WORK, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    cluster.sessions.add(proc.pid)
    try:
        code = proc.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = "timed out"
    if code != 0:
        raise RuntimeError(f"{what}: {' '.join(map(str, cmd))[:300]} failed ({code}):\n"
                           f"{log_file.read_text()[-3000:]}")


def host_resources(k):
    return json.dumps({f"host{k}": 1})


def host_ip(k):
    return f"10.210.0.{k + 1}"


def start_ray(cluster, hosts):
    """Ray's head, and a node in each of the first `hosts` namespaces (then
    the head listens on the bridge); fills in the cluster's env and driver."""
    ip = BRIDGE_IP if hosts else "127.0.0.1"
    port = free_port(ip)
    # Ports that Ray's head would otherwise take at fixed numbers, which
    # another Ray on this shared machine may hold (its dashboard then fails).
    fixed = [(flag, free_port("127.0.0.1")) for flag in
             ("--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port")]
    # A fresh token per cluster, given to every Ray process by the
    # environment: Ray 2.60 then needs no ~/.ray/auth_token.
    env = cluster.env
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    address = f"{ip}:{port}"
    temp = cluster.temp
    cluster.driver = [RAY_PY, RAY_DRIVER, "--address", address, "--node-ip", ip]
    store = ["--object-store-memory", STORE_BYTES] if hosts else []
    start_command([RAY, "start", "--head", "--num-cpus", 2, "--port", port, "--node-ip-address", ip,
                   *[a for pair in fixed for a in pair], f"--temp-dir={temp}", *store], env, "ray-head", cluster)
    for k in range(1, hosts + 1):
        node_temp = temp / f"h{k}"
        cluster.node_temps.append(node_temp)
        start_command(["ip", "netns", "exec", f"rlbench-h{k}", RAY, "start", "--address", address,
                       "--node-ip-address", host_ip(k), "--num-cpus", 1, "--resources", host_resources(k),
                       *store, f"--temp-dir={node_temp}"], env, f"ray-h{k}", cluster)


def start_raylet(cluster, hosts):
    """raylet's head, and a node in each of the first `hosts` namespaces (then
    the head listens on the bridge); fills in the cluster's env and driver."""
    raylet = BIN_SNAPSHOT / "raylet"
    env, temp = cluster.env, cluster.temp
    cluster.driver = [BIN_SNAPSHOT / "scale_envelope"]
    store = ["--object-store-memory", STORE_BYTES] if hosts else []
    bind = ["--node-ip", BRIDGE_IP] if hosts else []
    start_command([raylet, "start", "--head", "--port", 0, "--dashboard-port", 0, "--temp-dir", temp,
                   "--num-cpus", 2, *bind, *store], env, "raylet-head", cluster)
    session = temp / "session_latest"
    address = (session / "head_address").read_text().strip()
    env.update(RAYLET_ADDRESS=address, RAYLET_TOKEN=(session / "token").read_text().strip(),
               RAYLET_TEMP_DIR=str(temp))
    for k in range(1, hosts + 1):
        node_temp = temp / f"h{k}"
        cluster.node_temps.append(node_temp)
        start_command(["ip", "netns", "exec", f"rlbench-h{k}", raylet, "start", "--address", address,
                       "--node-ip", host_ip(k), "--num-cpus", 1, "--resources", host_resources(k), *store,
                       "--temp-dir", node_temp], env, f"raylet-h{k}", cluster)


def stop_cluster(cluster):
    """Ends every process of the cluster. raylet: `raylet stop` on each of
    its temp dirs, then whatever is left is ended by pid; returns those
    leftovers. Ray has no stop for one cluster (`ray stop` ends every Ray
    cluster and every process named raylet on the machine), so its processes
    are all ended by pid, SIGTERM first; returns nothing."""
    markers = [str(cluster.temp)]
    if cluster.system == "ray":
        end_processes(started_processes(cluster.sessions, markers))
        return []
    for temp in [cluster.temp, *cluster.node_temps]:
        subprocess.run([str(BIN_SNAPSHOT / "raylet"), "stop", "--temp-dir", str(temp)], env=cluster.env,
                       capture_output=True, timeout=120)
    return stop_leftovers("raylet cluster", session_ids=cluster.sessions, markers=markers, grace=10)


def end_processes(pids, grace=10.0):
    """SIGTERM to each of `pids`, then SIGKILL to those still running after
    `grace` seconds (the same processes: their start times are checked, so a
    pid reused meanwhile is left alone)."""
    started = {pid: start_time(pid) for pid in pids}

    def signal_running(sig):
        for pid, start in started.items():
            if start is not None and start_time(pid) == start:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    signal_running(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(start_time(pid) == start for pid, start in started.items()):
        time.sleep(0.2)
    signal_running(signal.SIGKILL)


def start_time(pid):
    """The process's start time (clock ticks after boot); None once it is gone or a zombie."""
    try:
        stat = read_bytes(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


# ---------------------------------------------------------------- one run


def settle(cluster, quiet_s=3.0, patience_s=60.0):
    """Waits until the cluster's processes are all up: the start commands
    return before Ray's dashboard has started its module processes, for one.
    Settled is the same set of processes for quiet_s; returns the seconds it
    took."""
    t0 = time.monotonic()
    own = own_ancestors(process_stats())
    last, since = None, t0
    while time.monotonic() - t0 < patience_s:
        pids = cluster.pids(process_stats(), own)
        if pids != last:
            last, since = pids, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.25)
    return round(time.monotonic() - t0, 1)


def driver_line(out):
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"workload"' in line:
            return json.loads(line)
    raise RuntimeError(f"the driver printed no result line:\n{out[-2000:]}")


def run_driver(cluster, workload, scale, what):
    """Runs the driver, sampling the cluster until it exits; returns its
    JSON line, what the sampler measured and the process's wall time."""
    cmd = [str(c) for c in cluster.driver] + [workload.name, "--scale", str(scale)]
    out_path, err_path = LOGS / f"{what}.out", LOGS / f"{what}.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=cluster.env, cwd=WORK, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    sampler = Sampler(cluster, proc.pid)
    deadline = time.monotonic() + workload.timeout(scale)
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: the driver timed out after {workload.timeout(scale):.0f} s")
            sampler.sample()
            time.sleep(SAMPLE_S)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        os.wait4(proc.pid, 0)
        proc.returncode = -signal.SIGKILL
        raise
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(cmd)}` exited {proc.returncode}\n"
                           f"stderr:\n{err_path.read_text()[-3000:]}")
    line = driver_line(out_path.read_text())
    return line, sampler.result(usage.ru_maxrss), wall


def measure(system, workload, scale, rep):
    """One run: a fresh cluster, the driver, then nothing left running."""
    hosts = scale if workload.name == "broadcast_1g" else 0
    temp = Path(f"/tmp/{'rbe' if system == 'ray' else 'rle'}{os.getpid()}r{rep}")  # short: Ray's socket paths
    shutil.rmtree(temp, ignore_errors=True)
    what = f"{workload.name}-{system}-{scale}-r{rep}"
    run = {"workload": workload.name, "system": system, "scale": scale, "rep": rep}
    cluster = Cluster(system, temp, dict(BASE_ENV))
    try:
        (start_ray if system == "ray" else start_raylet)(cluster, hosts)
        run["settle_s"] = settle(cluster)
        line, memory, wall = run_driver(cluster, workload, scale, what)
        run.update(seconds=line["seconds"], driver=line, process_wall_s=round(wall, 3), **memory)
        log(f"    {line['seconds']:.3f} s; head {memory['head_daemons_peak_mib']:,.0f} MiB, workers "
            f"{memory['workers_peak_mib']:,.0f} MiB ({memory['workers_max']}), "
            f"driver {memory['driver_peak_mib']:,.0f} MiB")
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        run["error"] = str(e)[-4000:]
        log(f"    FAILED: {str(e)[:600]}")
    finally:
        run["leftovers"] = leftover_lines(stop_cluster(cluster))
        shutil.rmtree(temp, ignore_errors=True)
    return run


# ---------------------------------------------------------------- report


def fmt_mib(v):
    return f"{v:,.0f} MiB" if v >= 100 else f"{v:.1f} MiB"


def fmt_ratio(x):
    return f"{x:,.0f}×" if x >= 100 else f"{x:.2g}×" if x < 10 else f"{x:.1f}×"


def median_of(runs, key, fmt):
    values = [r[key] for r in runs]
    if not values:
        return "—"
    med = statistics.median(values)
    return fmt(med) if len(values) == 1 else f"{fmt(med)} ({fmt(min(values))}–{fmt(max(values))})"


def runs_of(res, workload, system, scale):
    return [r for r in res["runs"] if r["workload"] == workload and r["system"] == system and r["scale"] == scale]


def cell_time(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return "failed" if runs else "not run"
    text = summary_s([r["seconds"] for r in ok])
    return text + (f" ({len(runs) - len(ok)} of {len(runs)} failed)" if len(ok) < len(runs) else "")


def cell(runs, key):
    return median_of([r for r in runs if "error" not in r], key, fmt_mib)


def ratio_cell(ray_runs, raylet_runs, bold=True):
    ray = [r["seconds"] for r in ray_runs if "error" not in r]
    raylet = [r["seconds"] for r in raylet_runs if "error" not in r]
    if not ray or not raylet:
        return "—"
    text = fmt_ratio(statistics.median(raylet) / statistics.median(ray))
    return f"**{text}**" if bold else text


def rows(res):
    """(workload, Ray scale, raylet scale) for each table row: the paired
    rows, then the raylet-only extra rows."""
    out = [(w, res["scales"][w], res["scales"][w]) for w in res["workloads"]]
    out += [(w, None, n) for w, n in res["extra"]]
    return out


def scale_text(workload, n):
    return "—" if n is None else f"{n:,} {workload.unit}"


def write_report(res, path):
    L = []
    w = L.append
    w(run_line(res, "compare_envelope.sh") + ". " + programs(res)
      + " A fresh cluster per run: `ray start --head --num-cpus 2` with `RAY_AUTH_MODE=token` and a fresh "
      "`RAY_AUTH_TOKEN` (raylet's clusters always use a token), `RAY_USAGE_STATS_ENABLED=0`, everything else "
      "default (the dashboard included); `raylet start --head --port 0 --num-cpus 2`. "
      f"{res['reps']} repetition(s), the systems alternating (Ray first in odd ones); medians with (min–max). "
      "Rust builds and other benchmarks may have been running alongside on this shared 2-core machine, so "
      "absolute times are noisy.\n")
    w("Times are the workload's wall time measured inside the driver (cluster start and connection excluded). "
      "Memory is the peak of the summed VmRSS of a group of processes, sampled from `/proc` every 200 ms: "
      "*head* = the cluster's own processes on the head's host, workers excluded (Ray: gcs_server, raylet, "
      "dashboard and its module processes, agents, monitors, client server; raylet: the `raylet start --head` "
      "daemon); *workers* = the processes that run tasks and actors on every host (Ray: `ray::…` workers; "
      "raylet: the driver binary re-executed by a node manager); *driver* = the driver process's peak RSS. "
      "Summing RSS counts a page shared by several processes (Python's libraries in Ray's forked dashboard "
      "modules, for one) once per process.\n")
    w("| workload | scale here: Ray / raylet | Ray's published figure | Ray 2.60 here: time | head RSS | driver RSS "
      "| raylet: time | head RSS | driver RSS | raylet / Ray time |")
    w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, ray_n, raylet_n in rows(res):
        wl = BY_NAME[name]
        ray_runs = runs_of(res, name, "ray", ray_n) if ray_n is not None else []
        raylet_runs = runs_of(res, name, "raylet", raylet_n)
        scales = f"{scale_text(wl, ray_n)} / {scale_text(wl, raylet_n)}"
        ray_cells = (f"{cell_time(ray_runs)} | {cell(ray_runs, 'head_daemons_peak_mib')} | "
                     f"{cell(ray_runs, 'driver_peak_mib')}") if ray_n is not None else "— | — | —"
        label = f"{name} (differs: {wl.differs})" if wl.differs else name
        w(f"| {label} | {scales} | {wl.published if ray_n is not None else '(raylet only)'} | {ray_cells} | "
          f"{cell_time(raylet_runs)} | {cell(raylet_runs, 'head_daemons_peak_mib')} | "
          f"{cell(raylet_runs, 'driver_peak_mib')} | {ratio_cell(ray_runs, raylet_runs, not wl.differs)} |")
    w("")
    write_workers_table(res, w)
    write_workloads(res, w)
    write_raw(res, w)
    path.write_text("\n".join(L))


def programs(res):
    """What ran on each side, as the report's header says it."""
    vers, sha = res["versions"], res["binaries"].get("scale_envelope", {}).get("sha256")
    ray = (f"Ray {vers['ray']} (`ray[default]` from pip in `target/bench-venv`, Python {vers['python']}) runs "
           "`bench/envelope_ray.py`" if "ray" in vers else "Ray was not run")
    raylet = (f"raylet {vers['raylet']} runs `target/release/examples/scale_envelope` (sha256 {sha}…) against "
              "`target/release/raylet start`" if "raylet" in vers else "raylet was not run")
    return f"{ray}; {raylet}."


def write_workers_table(res, w):
    w("Workers and, for the broadcast, the daemons of the other hosts: peak summed RSS, and in parentheses "
      "the peak of the summed private RSS (RSS less the file-backed and shared pages `statm` counts as shared: "
      "mostly heap) and the most worker processes seen at once.\n")
    w("| workload | scale: Ray / raylet | Ray workers | raylet workers | Ray node daemons | raylet node daemons |")
    w("|---|---|---:|---:|---:|---:|")
    for name, ray_n, raylet_n in rows(res):
        wl = BY_NAME[name]
        sides = [runs_of(res, name, "ray", ray_n) if ray_n is not None else [], runs_of(res, name, "raylet", raylet_n)]
        workers = [group_cell(runs, "workers") for runs in sides]
        nodes = [group_cell(runs, "node_daemons") if name == "broadcast_1g" else "—" for runs in sides]
        w(f"| {name} | {scale_text(wl, ray_n)} / {scale_text(wl, raylet_n)} | {' | '.join(workers)} | "
          f"{' | '.join(nodes)} |")
    w("")


def group_cell(runs, group):
    """A group's summed RSS, its private part, and for workers how many there were at most."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return "—"
    count = f"; {max(r['workers_max'] for r in ok)} processes" if group == "workers" else ""
    return f"{cell(ok, f'{group}_peak_mib')} ({cell(ok, f'{group}_private_peak_mib')} private{count})"


def write_workloads(res, w):
    w("### Workloads, and their scale here\n")
    for name in res["workloads"]:
        wl = BY_NAME[name]
        n = res["scales"][name]
        why = "`--quick`" if res["quick"] else ("`--scale`" if name in res["scale_overrides"] else wl.why)
        w(f"- **{name}** ({n:,} {wl.unit} on both sides; Ray's release test: {wl.published}; {why}): {wl.what}. "
          f"Ray's figure: {wl.source}.")
    for name, n in res["extra"]:
        w(f"- **{name}**, raylet only, {n:,} {BY_NAME[name].unit} (`--raylet-extra`): what this machine holds "
          "on raylet beyond the paired scale.")
    for note in res["notes"]:
        w(f"- {note}")
    w("\nRay's published figures come from its release-test results in ray-project/ray "
      "(`release/perf_metrics/…`, run on 64-core machines, and for the distributed tests 64 nodes); they "
      "show Ray's envelope, not a like-for-like timing with this 2-core VM.\n")


def write_raw(res, w):
    w("<details><summary>Every run (raw numbers also in <code>target/bench/envelope-results.json</code>, not "
      "committed), and the head's processes at its peak</summary>\n")
    w("```")
    for r in res["runs"]:
        keep = {k: v for k, v in r.items() if k not in ("head_at_peak", "leftovers")}
        w(json.dumps(keep))
        if r.get("head_at_peak"):
            w("    head at peak: " + ", ".join(f"{n} {m:.0f}" for n, m in r["head_at_peak"]))
    w("```\n")
    w("</details>\n")


# ---------------------------------------------------------------- main


def parse_pairs(items, what):
    pairs = []
    for item in items:
        name, _, n = item.partition("=")
        if name not in BY_NAME or not n.isdigit() or int(n) < 1:
            sys.exit(f"{what} {item!r}: expected WORKLOAD=N with WORKLOAD one of {', '.join(BY_NAME)}")
        pairs.append((name, int(n)))
    return pairs


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions per workload (default 3; 1 with --quick)")
    p.add_argument("--only", action="append", default=[], metavar="W",
                   help="only these workloads (repeatable or comma-separated)")
    p.add_argument("--quick", action="store_true", help="small scales and 1 repetition: a smoke run")
    p.add_argument("--raylet-only", action="store_true", help="skip Ray")
    p.add_argument("--ray-only", action="store_true", help="skip raylet (e.g. to find the scale Ray holds)")
    p.add_argument("--scale", action="append", default=[], metavar="W=N", help="run workload W at N on both sides")
    p.add_argument("--raylet-extra", action="append", default=[], metavar="W=N",
                   help="also run workload W at N on raylet alone (an extra row)")
    p.add_argument("--out", type=Path, help="the report (default bench/envelope.md for a full run, else "
                                            "target/bench/envelope.partial.md)")
    p.add_argument("--report-from", type=Path, metavar="JSON", help="only rewrite the report from saved results")
    args = p.parse_args()
    only = [o.strip() for item in args.only for o in item.split(",") if o.strip()]
    unknown = [o for o in only if o not in BY_NAME]
    if unknown:
        sys.exit(f"unknown workload(s) {unknown}; known: {', '.join(BY_NAME)}")
    if args.raylet_only and args.ray_only:
        sys.exit("--raylet-only and --ray-only exclude each other")
    args.workloads = [w.name for w in WORKLOADS if not only or w.name in only]
    args.scales = dict(parse_pairs(args.scale, "--scale"))
    args.extra = [] if args.ray_only else parse_pairs(args.raylet_extra, "--raylet-extra")
    args.notes = []
    if os.geteuid() != 0 and "broadcast_1g" in args.workloads + [w for w, _ in args.extra]:
        args.notes.append("broadcast_1g was skipped: network namespaces need root.")
        args.workloads = [w for w in args.workloads if w != "broadcast_1g"]
        args.extra = [(w, n) for w, n in args.extra if w != "broadcast_1g"]
    if args.raylet_only:
        args.notes.append("Ray was not run (`--raylet-only`).")
    if args.ray_only:
        args.notes.append("raylet was not run (`--ray-only`).")
    if args.quick:
        args.reps = 1
    return args


def report_path(args):
    if args.out:
        return args.out
    partial = args.quick or args.raylet_only or args.ray_only or len(args.workloads) < len(WORKLOADS)
    return PARTIAL_REPORT if partial else REPORT


def snapshot_binaries():
    """Copies raylet and scale_envelope to target/bench/envelope-bin so that a
    rebuild during the run cannot swap them between runs."""
    BIN_SNAPSHOT.mkdir(parents=True, exist_ok=True)
    meta = {}
    for src in (RAYLET, SCALE_ENVELOPE):
        if not src.exists():
            sys.exit(f"missing {src}; build it with: cargo build --release --workspace --bins --examples")
        _, meta[src.name] = snapshot(src, BIN_SNAPSHOT)
    return meta


def system_versions(args):
    vers = {} if args.raylet_only else versions("ray")
    if not args.ray_only:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        version = subprocess.run([str(BIN_SNAPSHOT / "raylet"), "--version"], capture_output=True,
                                 text=True).stdout.strip()
        vers["raylet"] = f"`{version}` (commit {commit})"
    return vers


def plan(args):
    """[(workload, [(system, scale)...])]: the paired runs of each workload,
    then its raylet-only extras."""
    systems = [s for s in SYSTEMS if not (s == "ray" and args.raylet_only or s == "raylet" and args.ray_only)]
    out = []
    for name in args.workloads:
        wl = BY_NAME[name]
        out.append((wl, args.scales.get(name, wl.quick if args.quick else wl.full), systems))
    out += [(BY_NAME[name], n, ["raylet"]) for name, n in args.extra]
    return out


def run_all(args, res):
    hosts = max([scale for wl, scale, _ in plan(args) if wl.name == "broadcast_1g"], default=0)
    try:
        if hosts:
            subprocess.run(["bash", str(NETNS), "up", str(hosts)], check=True)
        for wl, scale, systems in plan(args):
            for rep in range(1, args.reps + 1):
                order = systems if rep % 2 == 1 else systems[::-1]
                for system in order:
                    log(f"{wl.name} at {scale:,} {wl.unit}: {system}, rep {rep}/{args.reps}")
                    res["runs"].append(measure(system, wl, scale, rep))
                    RESULTS.write_text(json.dumps(res, indent=1))
    finally:
        if hosts:
            subprocess.run(["bash", str(NETNS), "down"], check=False)
        left = stop_leftovers("final check", markers=[f"/tmp/rbe{os.getpid()}r", f"/tmp/rle{os.getpid()}r"], grace=5)
        if left:
            log(f"final check ended {len(left)} leftover process(es)")


def main():
    args = parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    if args.report_from:
        res = json.loads(args.report_from.read_text())
        path = args.out or Path(res["report"])
        write_report(res, path)
        log(f"wrote {path}")
        return
    binaries = {} if args.ray_only else snapshot_binaries()
    res = {"started": now_utc(), "argv": sys.argv[1:], "machine": machine_info(),
           "versions": system_versions(args), "binaries": binaries, "reps": args.reps,
           "quick": args.quick, "workloads": args.workloads, "extra": args.extra, "scale_overrides": args.scales,
           "scales": {wl.name: scale for wl, scale, _ in plan(args)[:len(args.workloads)]},
           "report": str(report_path(args)), "notes": args.notes, "runs": []}
    log(f"versions {res['versions']}; binaries {res['binaries']}")
    try:
        run_all(args, res)
    finally:
        res["finished"] = now_utc()
        RESULTS.write_text(json.dumps(res, indent=1))
    write_report(res, Path(res["report"]))
    log(f"wrote {res['report']} and {RESULTS}")


if __name__ == "__main__":
    main()
