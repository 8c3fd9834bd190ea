#!/usr/bin/env python3
"""Merges the JSON lines of raylet's allreduce benchmark and of its peers
(bench/allreduce_peers.py: torch.distributed's Gloo, Open MPI through mpi4py)
into bench/allreduce.md: a header (when, on what machine, the versions, the
exact commands, what differs between the systems) and, per rank count, two
tables: raylet over TCP links (as between hosts) beside the TCP peers, and
raylet over shared memory (ranks on one host) beside Open MPI's shared
memory; each with raylet's time, algbw and busbw, its busbw as a share of
loopback TCP streams measured in the same run, each peer's busbw and the
ratio of the two.

Run by bench/compare_allreduce.sh, which runs the repetitions and leaves one
file per system and repetition, <runs>/rep<R>-<system>.jsonl, each line

  {"system": "raylet-tcp", "ranks": 2, "bytes": 1024, "median_s": 1.9e-05, "reps": 1234}

(raylet-shm for raylet's shared-memory transport)
(the peers add "version" and "transport"; raylet also writes its loopback
TCP reference, {"system": "loopback-tcp", "streams": n, "gbps": ...}). A
value in the tables is the median over the repetitions of the per-run median
call time, and the bandwidths follow from it: algbw = bytes / time,
busbw = algbw x 2(n-1)/n, as nccl-tests defines them. A ratio is raylet's
busbw over the peer's (the peer's median time over raylet's): above 1,
raylet is faster.

Standard library only.
"""

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from allreduce_peers import SYSTEMS, TRANSPORT_TEXT, mpirun_command, rank_command
from benchlib import ROOT, log, machine_info, run_line

# raylet's transports: (system, table title, the peers' columns: (system, title)).
TRANSPORTS = [
    ("raylet-tcp", "TCP links (as between hosts)", [(SYSTEMS["gloo"], "Gloo"), (SYSTEMS["mpi"], "MPI (TCP)")]),
    ("raylet-shm", "one host, shared memory", [(SYSTEMS["mpi-shm"], "MPI (shared memory)")]),
]
RAYLET = {system for system, _, _ in TRANSPORTS}


def load(runs):
    """{(system, ranks, bytes): {rep: seconds}}, {streams: [GB/s]}, {system: version}."""
    times, tcp, versions = defaultdict(dict), defaultdict(list), {}
    for path in sorted(runs.glob("rep*-*.jsonl")):
        rep = int(re.match(r"rep(\d+)-", path.name).group(1))
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["system"] == "loopback-tcp":
                tcp[row["streams"]].append(row["gbps"])
                continue
            times[(row["system"], row["ranks"], row["bytes"])][rep] = row["median_s"]
            if "version" in row:
                versions[row["system"]] = row["version"]
    return times, tcp, versions


# ---------------------------------------------------------------- formatting


def human(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def fmt_time(seconds):
    """As raylet's example prints it: µs below 10 ms, then ms."""
    us = seconds * 1e6
    return f"{us / 1000:.1f} ms" if us >= 10_000 else f"{us:.0f} µs"


def busbw(size, ranks, seconds):
    """nccl-tests' bus bandwidth in GB/s."""
    return size / seconds / 1e9 * 2 * (ranks - 1) / ranks


def median_time(times, system, ranks, size):
    per_rep = times.get((system, ranks, size))
    return statistics.median(per_rep.values()) if per_rep else None


def command(cmd):
    """A command line of allreduce_peers.py, with this checkout's paths relative."""
    return " ".join(cmd).replace(f"{ROOT}/", "")


# ---------------------------------------------------------------- report


def header(w, args, times, tcp, versions, peers):
    reps = max((len(v) for v in times.values()), default=0)
    info = {"machine": machine_info(), "started": args.started, "argv": args.argv.split()}
    names = {SYSTEMS["gloo"]: "torch.distributed's Gloo backend on CPU", SYSTEMS["mpi"]: "Open MPI through mpi4py"}
    shown = [f"{names[s]} ({versions.get(s, '?')})" for s in names if s in peers]
    w(run_line(info, "compare_allreduce.sh")
      + ": raylet's collective group (`raylet_train::collective`, the `allreduce_bench` example) against "
      + (" and ".join(shown) or "no peer (none installed)")
      + f", in `target/allreduce-venv` (Python {info['machine']['python']}). {reps} repetitions, the order of the "
      "systems rotated by one each repetition. Other work (Rust builds) may have run alongside on this shared "
      "machine, so the absolute figures are noisy; the systems were measured turn by turn, so the ratios are the "
      "figures to read.\n")
    w("The same measurement on every side: a sum allreduce of f32, in place, each rank's buffer filled with its "
      "rank; sizes from 1 KiB up in steps of ×4; each rank a separate process, on 127.0.0.1. For each size one "
      "warm-up call, then timed calls for at least 0.6 s (at most 10,000), rank 0 broadcasting before each call "
      "whether another follows, so that the ranks start each call together; the time is rank 0's median call. "
      "algbw = bytes / time; busbw = algbw × 2(n−1)/n (nccl-tests). A table value is the median over the "
      "repetitions; a ratio is raylet's busbw over the peer's, above 1 when raylet is faster.\n")
    if tcp:
        each = "; ".join(f"each of {n} streams at once {statistics.median(v):.2f} GB/s"
                         for n, v in sorted(tcp.items()) if n > 1)
        w(f"Loopback TCP, measured by raylet's example in the same runs (median): one stream alone "
          f"{statistics.median(tcp[1]):.2f} GB/s; {each}.\n")
    commands(w, args, peers)
    differences(w, peers)


def commands(w, args, peers):
    w("Commands (`<R>` the repetition):\n")
    w(f"- raylet: `{args.raylet_command}`.")
    if not peers:
        w("")
        return
    kinds = [k for k, s in SYSTEMS.items() if s in peers]
    w(f"- the peers: `{args.peers_command}` with `<S>` each of {', '.join(kinds)}, which starts")
    if SYSTEMS["gloo"] in peers:
        rank = rank_command("gloo", args.max_mib, "<r>", "<n>", "<port>")
        w(f"  - gloo: one process per rank, `GLOO_SOCKET_IFNAME=lo {command(rank)}`, each calling "
          "`torch.distributed.init_process_group(\"gloo\", init_method=\"tcp://127.0.0.1:<port>\", ...)` "
          "and then `dist.all_reduce(tensor)` (default op: sum) on a `torch.float32` tensor;")
    for kind in ("mpi", "mpi-shm"):
        if SYSTEMS[kind] in peers:
            w(f"  - {kind}: `{command(mpirun_command(kind, '<n>', args.max_mib))}`, each rank calling "
              "`MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)` on a numpy float32 array "
              f"({TRANSPORT_TEXT[kind]});")
    w("")


def differences(w, peers):
    w("What differs:\n")
    w("- raylet: each rank is an actor in a worker process of its own, in the example's embedded cluster; the ranks "
      "meet through the cluster's key-value store and connect over direct TCP links. Up to 64 KiB every rank "
      "sends its buffer to every other at once; above, a chunked ring (reduce-scatter, then allgather). Written in "
      "Rust. Two transports, each in its own table:\n"
      "  - **TCP** (`GroupOptions { shared_memory: false, .. }`, what ranks on different hosts use): the bytes go "
      "over the TCP links, read into a 1 MiB scratch buffer and reduced from there; a rank polls a link "
      "without blocking for up to 50 µs after the last bytes came, then blocks in the kernel (Open MPI's ranks "
      "poll as long as they wait); a message goes out with its header in one write up to 64 KiB, and a rank "
      "writes before it reads, on one thread, messages up to a quarter of the send buffer the kernel gave the "
      "link (it asks for 1 MiB; 512 KiB messages here), a second thread writing larger ones meanwhile.\n"
      "  - **shared memory** (the default for ranks on one host): each direction of a link is a 4 MiB ring in a "
      "`/dev/shm` file both processes map; a rank copies into the ring, its peer reduces (or copies) straight out "
      "of it, 256 KiB at a time; a waiting rank spins briefly, yields, then sleeps on a futex. The TCP link stays "
      "open beside it to tell that the peer is gone.")
    if SYSTEMS["gloo"] in peers:
        w("- Gloo: torch's `ProcessGroupGloo` with its own choice of allreduce algorithm, over TCP between each pair "
          "of ranks; each call goes through Python and torch's dispatcher (a few µs, which shows only at the "
          "smallest sizes).")
    if SYSTEMS["mpi"] in peers:
        w("- Open MPI: its `coll/tuned` component picks the algorithm by size and rank count (recursive doubling, "
          "ring, ...). In the **MPI (TCP)** column, the fair peer, bytes move only over TCP on lo: `pml ob1` "
          "(so UCX, which would choose shared memory by itself, is not used) with the `self` and `tcp` transports; "
          "vader, Open MPI's shared-memory transport, is excluded. Ranks poll busily while they wait, except when "
          "mpirun sees more ranks than cores (the 4-rank runs), where Open MPI yields the CPU when idle. Each call "
          "goes through Python (mpi4py).")
    if SYSTEMS["mpi-shm"] in peers:
        w("- **MPI (shared memory)**, the peer of raylet's shared-memory transport: the same with vader allowed "
          "(`--mca btl self,vader,tcp`), Open MPI's usual setting on one machine; for large messages vader may copy "
          "straight from the other process's memory (CMA, one copy), where raylet's rings take two.")
    w("")


def tables(w, times, tcp, peers):
    for ranks in sorted({k[1] for k in times if k[0] in RAYLET}):
        for system, title, columns in TRANSPORTS:
            if any(k[0] == system and k[1] == ranks for k in times):
                table(w, times, tcp, ranks, system, title, [(s, t) for s, t in columns if s in peers])


def table(w, times, tcp, ranks, system, title, columns):
    """One rank count, one transport: raylet's figures, the share of the loopback streams, the peers'."""
    w(f"### {ranks} ranks, {title}\n")
    alone, each = (statistics.median(tcp[n]) if tcp.get(n) else None for n in (1, ranks))
    head = ["size", "raylet time", "raylet algbw GB/s", "raylet busbw GB/s", "/ one stream alone",
            f"/ each of {ranks} streams at once"]
    for _, peer in columns:
        head += [f"{peer} busbw GB/s", f"raylet / {peer}"]
    w("| " + " | ".join(head) + " |")
    w("|---|" + "---:|" * (len(head) - 1))
    for size in sorted({k[2] for k in times if k[0] == system and k[1] == ranks}):
        ours = median_time(times, system, ranks, size)
        bus = busbw(size, ranks, ours)
        cells = [human(size), fmt_time(ours), f"{size / ours / 1e9:.3f}", f"{bus:.3f}",
                 f"{100 * bus / alone:.0f}%" if alone else "–", f"{100 * bus / each:.0f}%" if each else "–"]
        for peer, _ in columns:
            theirs = median_time(times, peer, ranks, size)
            cells += [f"{busbw(size, ranks, theirs):.3f}", f"{theirs / ours:.2f}×"] if theirs else ["–", "–"]
        w("| " + " | ".join(cells) + " |")
    w("")


def raw(w, times):
    w("<details><summary>Median call time of each run, µs (the JSON lines are in "
      "<code>target/bench/allreduce/</code>, not committed)</summary>\n")
    w("```")
    for (system, ranks, size), per_rep in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        runs = " ".join(f"{per_rep[r] * 1e6:.1f}" for r in sorted(per_rep))
        w(f"{ranks} ranks {human(size):>8} {system:20} {runs}")
    w("```\n")
    w("</details>\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, required=True, help="the folder of rep<R>-<system>.jsonl files")
    p.add_argument("--report", type=Path, required=True, help="the Markdown file to write")
    p.add_argument("--started", required=True, help="when the run started, ISO 8601 with its UTC offset")
    p.add_argument("--argv", default="", help="the options compare_allreduce.sh was given")
    p.add_argument("--max-mib", type=int, required=True, help="the largest size the runs were given, in MiB")
    p.add_argument("--raylet-command", required=True, help="raylet's command line, <R> for the repetition")
    p.add_argument("--peers-command", required=True, help="the peers' command line, <S> for the system")
    args = p.parse_args()

    times, tcp, versions = load(args.runs)
    if not any(k[0] in RAYLET for k in times):
        p.error(f"no raylet lines in {args.runs}")
    peers = {k[0] for k in times} - RAYLET
    lines = []
    header(lines.append, args, times, tcp, versions, peers)
    tables(lines.append, times, tcp, peers)
    raw(lines.append, times)
    args.report.write_text("\n".join(lines))
    log(f"wrote {args.report}")


if __name__ == "__main__":
    main()
