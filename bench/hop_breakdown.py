"""Where a synchronous call's time goes, hop by hop, from the records that
processes write with RAYLET_HOP_PROBES set (common/src/hop_probe.rs).

    RAYLET_HOP_PROBES=DIR target/release/raylet microbenchmark --filter "1:1 actor calls sync"
    python3 bench/hop_breakdown.py DIR

The records of every process are merged by time (one monotonic clock on
the machine) and read as calls: a call starts at CallerSubmits and passes
the hops in order up to CallerGot. Calls that skip a hop or overlap another
are left out, so run one synchronous metric at a time. Prints the median
and p99 of each hop's share, and of the whole call."""

import statistics
import struct
import sys
from pathlib import Path

HOPS = [
    "caller submits",
    "caller wrote the frame",
    "worker read the frame",
    "worker dequeued the call",
    "worker resolved the arguments",
    "the function returned",
    "worker wrote the result",
    "caller read the result",
    "caller stored the result",
    "caller's get woke",
    "caller's get returned",
]


def records(directory):
    merged = []
    for path in Path(directory).glob("*.hops"):
        data = path.read_bytes()
        for nanos, hop in struct.iter_unpack("<QQ", data):
            if nanos == 0:
                break
            merged.append((nanos, hop))
    merged.sort()
    return merged


def calls(merged):
    """Each whole call's times at its hops, in order: the records from one
    CallerSubmits to the next, when they hold each hop once. (A worker may
    read a frame before the caller's write returns, so the order within a
    call is not checked; such a hop shows a negative span.)"""
    window = []
    for record in merged + [(None, 1)]:
        if record[1] == 1 and window:
            hops = [hop for _, hop in window]
            if sorted(hops) == list(range(1, len(HOPS) + 1)):
                yield [nanos for nanos, _ in sorted(window, key=lambda r: r[1])]
            window = []
        if record[0] is not None and (window or record[1] == 1):
            window.append(record)


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    whole = list(calls(records(sys.argv[1])))
    if not whole:
        sys.exit(f"no whole call in {sys.argv[1]}: run one synchronous metric with RAYLET_HOP_PROBES set")
    print(f"{len(whole)} calls")
    print("| hop (time since the one before) | median us | p99 us |")
    print("|---|---:|---:|")
    for index in range(1, len(HOPS)):
        spans = [(call[index] - call[index - 1]) / 1000 for call in whole]
        print(f"| {HOPS[index]} | {statistics.median(spans):.1f} | {percentile(spans, 0.99):.1f} |")
    totals = [(call[-1] - call[0]) / 1000 for call in whole]
    print(f"| **whole call** | **{statistics.median(totals):.1f}** | **{percentile(totals, 0.99):.1f}** |")
    starts = sorted(call[0] for call in whole)
    ends = {call[0]: call[-1] for call in whole}
    gaps = [(later - ends[earlier]) / 1000 for earlier, later in zip(starts, starts[1:]) if later - earlier < 10**7]
    if gaps:
        print(f"| until the next call starts (the result's reference dropped, the loop) "
              f"| {statistics.median(gaps):.1f} | {percentile(gaps, 0.99):.1f} |")


if __name__ == "__main__":
    main()
