#!/usr/bin/env python3
"""raylet-serve against Ray Serve 2.60, side by side in one run: for each
application (a no-op deployment with 2 replicas; the digits MLP with 2
replicas and request batching, once with a 5 ms batch wait and once with
none) and each concurrency (1, 16, 64), `oha`
sends POST requests over keep-alive connections for a fixed time, and the
report gives requests/s, p50 and p99 latency and the share of 200 answers.
Both sides batch the digits requests alike (Ray's @serve.batch and
raylet-serve's Batcher: up to 32 within 5 ms, one batch at a time per
replica); what differs is that Ray computes a batch with numpy and raylet
with plain Rust loops over its rows. Both MLPs have the digits model's
shape with the same fixed pseudo-random weights.

Each repetition starts one system's server, waits for its `READY
noop=<port> digits=<port> digits_nowait=<port> [token=<token>]` line, loads every (application, concurrency) in turn, then closes
the server's stdin and ends what it left by pid; the systems take turns,
the order rotated by one each repetition. Both servers load the same MLP
weights from one JSON file that raylet's example writes first.

  bench/compare_serve.py --raylet target/release/examples/serve_bench \\
      --oha target/bench-tools/bin/oha [--reps 3] [--seconds 10] [--concurrency 1,16,64]

Standard library only; writes bench/serve.md and target/bench/serve/*.json.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import ENV, PY, ROOT, WORK, log, machine_info, now_utc, run_line, stop_leftovers

RUNS = WORK / "serve"
WEIGHTS = RUNS / "digits_weights.json"
APPS = {
    "noop": ("/noop", "{}"),
    "digits": ("/digits", json.dumps({"pixels": [0.5 * (i % 17) for i in range(64)]})),
    "digits_nowait": ("/digits_nowait", json.dumps({"pixels": [0.5 * (i % 17) for i in range(64)]})),
}


def server_command(system, args, port):
    if system == "raylet":
        return [args.raylet, "--port", str(port), "--weights", str(WEIGHTS)]
    return [str(PY), str(ROOT / "bench" / "serve_ray.py"), "--port", str(port), "--weights", str(WEIGHTS)]


def start_server(system, args, port):
    """Starts the server in its own session; returns (process, {app: port}, token): its line
    `READY noop=<port> digits=<port> digits_nowait=<port> [token=<token>]`."""
    proc = subprocess.Popen(server_command(system, args, port), env=ENV, cwd=WORK, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=open(RUNS / f"{system}-server.log", "a"), text=True,
                            start_new_session=True)
    for line in proc.stdout:
        if line.startswith("READY "):
            fields = dict(word.split("=", 1) for word in line.split()[1:])
            token = fields.pop("token", None)
            return proc, {app: int(p) for app, p in fields.items()}, token
    stop_server(system, proc)
    raise RuntimeError(f"{system}: the server ended without saying READY (see {RUNS / f'{system}-server.log'})")


def stop_server(system, proc):
    """Closes the server's stdin, waits for it, and ends what it left."""
    try:
        proc.stdin.close()
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    stop_leftovers(f"{system} server", {proc.pid})


def load(args, ports, token, app, concurrency):
    """One oha run; its JSON summary."""
    port = ports[app]
    path, body = APPS[app]
    cmd = [args.oha, "-z", f"{args.seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
           "-d", body, "--no-tui", "--output-format", "json"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run(cmd + [f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    codes = report.get("statusCodeDistribution") or {}
    answered = sum(codes.values())
    return {
        "rps": report["summary"]["requestsPerSec"],
        "p50_ms": report["latencyPercentiles"]["p50"] * 1e3,
        "p99_ms": report["latencyPercentiles"]["p99"] * 1e3,
        "ok_share": codes.get("200", 0) / answered if answered else 0.0,
        "codes": codes,
        "errors": report.get("errorDistribution") or {},
    }


def run_system(system, args, port, rep, results):
    proc, ports, token = start_server(system, args, port)
    try:
        for app in APPS:
            for concurrency in args.concurrency:
                figures = load(args, ports, token, app, concurrency)
                log(f"rep {rep} {system:6} {app:6} c={concurrency:<3} {figures['rps']:9.0f} req/s "
                    f"p50 {figures['p50_ms']:7.2f} ms p99 {figures['p99_ms']:7.2f} ms ok {figures['ok_share']:.3f}")
                results.append({"system": system, "rep": rep, "app": app, "concurrency": concurrency, **figures})
    finally:
        stop_server(system, proc)


def median_of(results, system, app, concurrency, key):
    values = [r[key] for r in results if (r["system"], r["app"], r["concurrency"]) == (system, app, concurrency)]
    return statistics.median(values) if values else None


def report(args, results, started):
    given = sys.argv[1:]
    shown = [a for i, a in enumerate(given) if a not in ("--raylet", "--oha") and given[i - 1] not in ("--raylet", "--oha")]
    info = {"machine": machine_info(), "started": started, "argv": shown}
    lines = [run_line(info, "compare_serve.sh") + f": raylet-serve (the `serve_bench` example) against Ray Serve "
             f"2.60.0 (`ray[serve]==2.60.0` in `target/bench-venv`), loaded by oha ({args.oha_version}) with POST "
             f"requests over keep-alive connections for {args.seconds} s per cell; {args.reps} repetitions, the "
             "systems taking turns. A value is the median over the repetitions.\n",
             "| application | concurrency | raylet req/s | Ray Serve req/s | raylet / Ray | raylet p50 | Ray p50 | "
             "raylet p99 | Ray p99 | Ray p99 / raylet p99 | 200s (raylet, Ray) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for app in APPS:
        for c in args.concurrency:
            get = lambda system, key: median_of(results, system, app, c, key)  # noqa: E731
            ours, theirs = get("raylet", "rps"), get("ray", "rps")
            if ours is None or theirs is None:
                continue
            lines.append(
                f"| {app} | {c} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.1f}× | {get('raylet', 'p50_ms'):.2f} ms "
                f"| {get('ray', 'p50_ms'):.2f} ms | {get('raylet', 'p99_ms'):.2f} ms | {get('ray', 'p99_ms'):.2f} ms "
                f"| {get('ray', 'p99_ms') / get('raylet', 'p99_ms'):.1f}× | {get('raylet', 'ok_share'):.1%}, "
                f"{get('ray', 'ok_share'):.1%} |")
    lines.append("\nBoth sides batch the digits requests alike (Ray's `@serve.batch`, raylet-serve's `Batcher`: up "
                 "to 32 within 5 ms, one batch at a time per replica); Ray computes a batch with numpy, raylet with "
                 "plain Rust loops over its rows. `digits_nowait` is the same model with a wait timeout of 0 on both "
                 "sides (`batch_wait_timeout_s=0`): a batch takes what queued while the replica's previous batch ran, "
                 "so a request waits for no timer; a closed-loop load of c clients then gets c / (timeout + compute) "
                 "requests/s at most with the 5 ms wait, and is bounded by the compute without it.")
    (ROOT / "bench" / "serve.md").write_text("\n".join(lines) + "\n")
    log("wrote bench/serve.md")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raylet", required=True, help="the serve_bench example")
    p.add_argument("--oha", required=True, help="the oha binary")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16, 64])
    p.add_argument("--port", type=int, default=18080)
    args = p.parse_args()
    args.raylet, args.oha = str(Path(args.raylet).resolve()), str(Path(args.oha).resolve())
    args.oha_version = subprocess.run([args.oha, "--version"], capture_output=True, text=True).stdout.strip()
    RUNS.mkdir(parents=True, exist_ok=True)
    subprocess.run([args.raylet, "--write-weights", str(WEIGHTS)], check=True, env=ENV, cwd=WORK)
    started, results = now_utc(), []
    systems = ["raylet", "ray"]
    for rep in range(args.reps):
        for system in systems[rep % 2:] + systems[:rep % 2]:
            run_system(system, args, args.port, rep, results)
    (RUNS / "results.json").write_text(json.dumps(results, indent=1))
    report(args, results, started)


if __name__ == "__main__":
    main()
