"""Helpers shared by the benchmark drivers in bench/ (compare_data.py and
compare_tune.py; compare_ray.py uses the paths, the process table and log):
the paths under target/, running a measured subprocess in its own session and
ending by pid whatever it left behind, the machine description, and the
formatting of medians, ranges and ratios in the reports.

Standard library only: the drivers run it with the system python or the
python of target/bench-venv alike.
"""

import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "target" / "bench"
VENV = ROOT / "target" / "bench-venv"
PY = VENV / "bin" / "python" if (VENV / "bin" / "python").exists() else Path(sys.executable)

# Ray must not try to report usage (there is no network here).
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
for var in ("RAY_ADDRESS",):
    ENV.pop(var, None)

# The prefix of the JSON result line the python subprocesses print.
MARK = "@@RESULT@@ "


def log(*args):
    print(f"[{time.strftime('%H:%M:%S')}]", *args, file=sys.stderr, flush=True)


def now_utc():
    """The current UTC time as the results files record it."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- processes


def _kib(path, key):
    """The KiB figure on the line of `path` that starts with `key`, 0 if none."""
    value = 0
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                value = int(line.split()[1])
    return value


def proc_table(memory=False):
    """{pid: (ppid, session id, cmdline)} for every process readable in /proc;
    with memory, (ppid, session id, cmdline, RSS KiB, PSS KiB) (PSS 0 where
    smaps_rollup cannot be read)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            ppid, sid = int(fields[1]), int(fields[3])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            row = (ppid, sid, cmdline)
            if memory:
                rss = _kib(f"/proc/{pid}/status", "VmRSS:")
                try:
                    pss = _kib(f"/proc/{pid}/smaps_rollup", "Pss:")
                except OSError:
                    pss = 0
                row += (rss, pss)
        except (OSError, ValueError):
            continue
        table[pid] = row
    return table


def own_ancestors(table):
    pids, pid = set(), os.getpid()
    while pid in table and pid not in pids:
        pids.add(pid)
        pid = table[pid][0]
    return pids


def add_descendants(table, chosen, exclude):
    """Adds to the set `chosen` every descendant (in a proc_table) of its
    pids, but none in `exclude`."""
    grew = True
    while grew:
        grew = False
        for pid, row in table.items():
            if row[0] in chosen and pid not in chosen and pid not in exclude:
                chosen.add(pid)
                grew = True


def started_processes(session_ids=(), markers=()):
    """Processes in one of session_ids (each subprocess here starts its own
    session), or whose command line contains a marker, plus all their
    descendants; this driver and its ancestors excluded."""
    table = proc_table()
    exclude = own_ancestors(table)
    chosen = {pid for pid, (_, sid, cmd) in table.items()
              if pid not in exclude and (sid in session_ids or (cmd and any(m in cmd for m in markers)))}
    add_descendants(table, chosen, exclude)
    return {pid: table[pid][2] for pid in sorted(chosen)}


def stop_leftovers(what, session_ids=(), markers=(), grace=15.0):
    """Waits up to `grace` seconds for what a subprocess started to exit,
    then ends what is left by pid (SIGTERM, then SIGKILL). Returns the
    leftovers it had to end, [(pid, cmdline)]."""
    deadline = time.monotonic() + grace
    left = started_processes(session_ids, markers)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = started_processes(session_ids, markers)
    if not left:
        return []
    log(f"{what}: {len(left)} process(es) still running after {grace:.0f} s; ending them by pid:")
    for pid, cmd in left.items():
        log(f"    {pid} {cmd[:120]}")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(3)
        if not started_processes(session_ids, markers):
            break
    still = started_processes(session_ids, markers)
    if still:
        raise RuntimeError(f"{what}: could not stop {sorted(still)}")
    return sorted(left.items())


def leftover_lines(left):
    """The leftovers stop_leftovers ended, as the results files list them."""
    return [f"{pid} {cmd[:100]}" for pid, cmd in left]


def run_measured(cmd, timeout, what, marker=None):
    """Runs cmd in its own session, then ends only what this run left: its
    session and the processes whose command line holds `marker` (a Ray run's
    temp dir), with their descendants, never other work that uses the venv.
    Returns (wall seconds, stdout, stderr, leftovers)."""
    markers = [str(marker)] if marker else []
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], env=ENV, cwd=WORK, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        stop_leftovers(what, {proc.pid}, markers, grace=0)
        raise RuntimeError(f"{what}: timed out after {timeout} s")
    wall = time.perf_counter() - t0
    leftovers = stop_leftovers(what, {proc.pid}, markers)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(map(str, cmd))[:200]} exited {proc.returncode}\n"
                           f"stdout:\n{out[-3000:]}\nstderr:\n{err[-5000:]}")
    return wall, out, err, leftovers


def finish_run(res, results, temp_prefix):
    """After the last measurement, even a failed one: stamps res as finished,
    writes it to `results`, and ends only processes left by this driver's Ray
    runs (their temp dirs start with temp_prefix + this pid + "r")."""
    res["finished"] = now_utc()
    results.write_text(json.dumps(res, indent=1))
    left = stop_leftovers("final check", markers=[f"{temp_prefix}{os.getpid()}r"], grace=5)
    if left:
        log(f"final check ended {len(left)} leftover process(es)")


def parse_args(parser, report, write_report):
    """Adds --report-from (the last option) to a driver's parser and parses
    its command line; makes target/bench. With --report-from JSON, rewrites
    the report from those saved raw numbers (write_report(results)) and exits."""
    parser.add_argument("--report-from", metavar="JSON", help=f"rewrite bench/{report.name} from saved raw numbers")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    if args.report_from:
        write_report(json.loads(Path(args.report_from).read_text()))
        log(f"wrote {report}")
        sys.exit(0)
    return args


# ---------------------------------------------------------------- inputs


def snapshot(src, dst_dir):
    """Copies the binary src into dst_dir so that a rebuild during the run
    cannot swap it between repetitions; returns (the copy, {mtime, sha256})."""
    dst = dst_dir / src.name
    shutil.copy2(src, dst)
    meta = {
        "mtime": datetime.datetime.fromtimestamp(src.stat().st_mtime, datetime.timezone.utc)
        .isoformat(timespec="seconds"),
        "sha256": hashlib.sha256(dst.read_bytes()).hexdigest()[:16],
    }
    return dst, meta


def versions(*modules):
    """{module: __version__ for each, "python": version} as the venv's python reports them."""
    code = (f"import {', '.join(modules)}, sys; " + "".join(f"print({m}.__version__); " for m in modules)
            + "print(sys.version.split()[0])")
    out = subprocess.run([str(PY), "-c", code], env=ENV, capture_output=True, text=True, check=True,
                         timeout=300).stdout.split()
    return dict(zip(modules + ("python",), out))


def machine_info():
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": mem, "kernel": platform.release(),
            "python": platform.python_version()}


# ---------------------------------------------------------------- report


def run_line(res, script):
    """The start of a report: the command, when, and on what machine, up to
    the closing parenthesis of the machine's description."""
    info = res["machine"]
    started = datetime.datetime.fromisoformat(res["started"])
    cmd = f"bash bench/{script}" + (" " + " ".join(res["argv"]) if res["argv"] else "")
    return (f"Run with `{cmd}` on {started:%Y-%m-%d} ({started:%H:%M} UTC) on a {info['cores']}-core VM "
            f"({info['cpu']}" + (f", {info['memory_gib']:.1f} GiB memory" if info["memory_gib"] else "") + ")")


def with_range(value, values, fmt, unit_chars=0):
    """fmt(value), followed by (min–max) of values when there are several; the
    min without its last unit_chars characters, so that the unit is said once."""
    if len(values) == 1:
        return fmt(value)
    low = fmt(min(values))
    return f"{fmt(value)} ({low[:len(low) - unit_chars]}–{fmt(max(values))})"


def fmt_s(v):
    if v >= 100:
        return f"{v:,.1f} s"
    if v >= 10:
        return f"{v:.2f} s"
    return f"{v:.3f} s"


def summary_s(values):
    """The median of seconds, with their min–max."""
    return with_range(statistics.median(values), values, fmt_s, unit_chars=2)


def fmt_x(x):
    return f"{x:,.0f}×" if x >= 100 else f"{x:.1f}×"


def ratio_summary(num, den):
    """The ratio of the medians, with the min–max of the pairwise ratios."""
    per = [a / b for a, b in zip(num, den)]
    return with_range(statistics.median(num) / statistics.median(den), per, fmt_x, unit_chars=1)
