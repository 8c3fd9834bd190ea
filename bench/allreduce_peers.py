#!/usr/bin/env python3
"""The peers of raylet's allreduce benchmark (train/examples/allreduce_bench.rs):
the same sum allreduce of f32, measured the same way, with torch.distributed's
Gloo backend on CPU and with Open MPI through mpi4py.

For each rank count (--ranks, default 2,4) and each size from 1 KiB up to
--max-mib MiB in steps of x4, every rank fills a buffer with its rank and
allreduces it in place: one warm-up call, then timed calls until 0.6 s have
passed (or 10,000 calls). Before each call rank 0 broadcasts whether another
one follows, as raylet's side does, so every rank starts each call together;
a barrier precedes each size. Rank 0 reports the median time of its calls
(the upper one of an even count, as raylet's side takes it) as one JSON line:

  {"system": "torch-gloo", "ranks": 2, "bytes": 1024, "median_s": 1.9e-05,
   "reps": 1234, "version": "torch 2.15.0+cu132 (Gloo)", "transport": "..."}

Ranks are separate processes on 127.0.0.1:
  gloo     torch.distributed.init_process_group("gloo",
           init_method="tcp://127.0.0.1:PORT"), GLOO_SOCKET_IFNAME=lo;
           one process per rank started by this script.
  mpi      mpirun with the ob1 point-to-point layer over the self and tcp
           transports only, TCP bound to lo: no shared memory (vader) and no
           UCX, so that it moves bytes as raylet's TCP ring does.
  mpi-shm  the same, but with vader (shared memory) allowed as well: Open
           MPI's usual single-node setting, not comparable to TCP.

Usage:
  allreduce_peers.py [--systems S,...] [--ranks 2,4] [--max-mib 256] [--out FILE]

with each S one of gloo, mpi, mpi-shm (default: gloo,mpi).

The lines go to stdout and, with --out, are appended to FILE. The driver part
needs only the standard library; the rank processes import torch or mpi4py
and numpy (bench/compare_allreduce.sh installs them in target/allreduce-venv).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

BUDGET_S = 0.6
MAX_CALLS = 10_000
SYSTEMS = {"gloo": "torch-gloo", "mpi": "mpi4py-openmpi", "mpi-shm": "mpi4py-openmpi-shm"}
# Open MPI's transports: pml ob1 so that UCX (which would pick shared memory
# by itself) is not used, then the byte-transfer layers each row allows.
MPI_TRANSPORTS = {
    "mpi": ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"],
    "mpi-shm": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"],
}
MPI_LOOPBACK = ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
TRANSPORT_TEXT = {
    "gloo": "Gloo TCP pairs over lo",
    "mpi": "pml ob1, btl self,tcp over lo (no shared memory)",
    "mpi-shm": "pml ob1, btl self,vader,tcp (shared memory allowed)",
}
TIMEOUT_S = 1800


def log(*args):
    print(f"[{time.strftime('%H:%M:%S')}]", *args, file=sys.stderr, flush=True)


def sizes(max_mib):
    """1 KiB, 4 KiB, ... up to max_mib MiB, in bytes."""
    out, size = [], 1 << 10
    while size <= max_mib << 20:
        out.append(size)
        size *= 4
    return out


# ---------------------------------------------------------------- rank side


def median_call(allreduce, go_on, buf):
    """One warm-up allreduce of buf, then timed ones while rank 0 says to go
    on; (the median seconds per call, the number of calls)."""
    allreduce(buf)
    times = []
    started = time.perf_counter()
    while go_on(time.perf_counter() - started < BUDGET_S and len(times) < MAX_CALLS):
        t0 = time.perf_counter()
        allreduce(buf)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], len(times)


def measure(system, rank, world, max_mib, backend, version):
    """Times each size; rank 0 prints one JSON line per size."""
    make_buffer, allreduce, go_on, barrier = backend
    for size in sizes(max_mib):
        buf = make_buffer(size // 4, rank)
        barrier()
        median_s, calls = median_call(allreduce, go_on, buf)
        if rank == 0:
            print(json.dumps({"system": SYSTEMS[system], "ranks": world, "bytes": size, "median_s": median_s,
                              "reps": calls, "version": version, "transport": TRANSPORT_TEXT[system]}), flush=True)


def gloo_rank(rank, world, port, max_mib):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def go_on(flag):
        t = torch.tensor([1.0 if flag else 0.0])
        dist.broadcast(t, 0)
        return t.item() != 0.0

    backend = (lambda n, r: torch.full((n,), float(r), dtype=torch.float32), dist.all_reduce, go_on, dist.barrier)
    measure("gloo", rank, world, max_mib, backend, f"torch {torch.__version__} (Gloo)")
    dist.destroy_process_group()


def mpi_rank(system, max_mib):
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    flag = np.zeros(1, dtype=np.float32)

    def go_on(more):
        flag[0] = 1.0 if more else 0.0
        comm.Bcast(flag, root=0)
        return flag[0] != 0.0

    backend = (lambda n, r: np.full(n, r, dtype=np.float32),
               lambda buf: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), go_on, comm.Barrier)
    library = MPI.Get_library_version().split(",")[0].strip()
    measure(system, comm.Get_rank(), comm.Get_size(), max_mib, backend, f"mpi4py {mpi4py.__version__}, {library}")


# ---------------------------------------------------------------- driver side


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_command(system, max_mib, rank=None, world=None, port=None):
    """The command line of one rank process of this script."""
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-of", system, "--max-mib", str(max_mib)]
    if system == "gloo":
        cmd += ["--rank", str(rank), "--world", str(world), "--port", str(port)]
    return cmd


def mpirun_command(system, world, max_mib):
    return (["mpirun", "-np", str(world), "--oversubscribe", "--allow-run-as-root"]
            + MPI_TRANSPORTS[system] + MPI_LOOPBACK + rank_command(system, max_mib))


def launch(system, world, max_mib):
    """Starts the rank processes (each in its own session); the first one's
    stdout carries rank 0's lines."""
    if system == "gloo":
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        port = free_port()
        return [subprocess.Popen(rank_command(system, max_mib, rank, world, port), env=env, text=True,
                                 stdout=subprocess.PIPE, start_new_session=True) for rank in range(world)]
    return [subprocess.Popen(mpirun_command(system, world, max_mib), text=True, stdout=subprocess.PIPE,
                             start_new_session=True)]


def kill(procs):
    """Ends each rank process still running, with its session, and reaps it."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run(system, world, max_mib, out):
    """Runs one system on `world` ranks; passes rank 0's lines to stdout and
    out. The rank processes are killed after TIMEOUT_S."""
    procs = launch(system, world, max_mib)
    timer = threading.Timer(TIMEOUT_S, kill, [procs])
    timer.start()
    try:
        for line in procs[0].stdout:
            print(line, end="", flush=True)
            if out:
                out.write(line)
                out.flush()
            row = json.loads(line)
            log(f"{row['system']} {world} ranks {row['bytes']:>10} B: {row['median_s'] * 1e6:10.1f} µs "
                f"({row['reps']} calls)")
        codes = [p.wait() for p in procs]
    finally:
        timer.cancel()
        kill(procs)
    if any(codes):
        sys.exit(f"{system} on {world} ranks: the rank processes exited {codes}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="gloo,mpi", help="comma-separated: gloo, mpi, mpi-shm (default gloo,mpi)")
    p.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    p.add_argument("--max-mib", type=int, default=256, help="the largest size in MiB (default 256)")
    p.add_argument("--out", help="append the JSON lines to this file too")
    p.add_argument("--rank-of", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.rank_of == "gloo":
        gloo_rank(args.rank, args.world, args.port, args.max_mib)
        return
    if args.rank_of:
        mpi_rank(args.rank_of, args.max_mib)
        return
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    out = open(args.out, "a") if args.out else None
    try:
        for system in systems:
            for world in map(int, args.ranks.split(",")):
                run(system, world, args.max_mib, out)
    finally:
        if out:
            out.close()


if __name__ == "__main__":
    main()
