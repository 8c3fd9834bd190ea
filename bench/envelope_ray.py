#!/usr/bin/env python3
"""The Ray 2.60 driver of the release-test envelope comparison
(bench/compare_envelope.sh); its raylet counterpart is
core/examples/scale_envelope.rs, which does the same work.

    envelope_ray.py WORKLOAD [--scale N] [--address HOST:PORT] [--node-ip IP]

Connects to a running cluster (`ray start --head ...`; --address defaults to
"auto"), runs one workload, and prints exactly one JSON line on stdout:
{"workload": ..., "seconds": ..., "scale": N, ...}, where `seconds` is the
wall time of the workload measured here (the connection excluded) and the
other keys time its phases.

Workloads, our own versions of Ray's release tests (release/benchmarks in
ray-project/ray):
  tasks_1m      as single_node/test_single_node.py's test_many_queued_tasks:
                one task per CPU blocks on a gate actor, N no-op tasks
                (default 1,000,000) are submitted behind them, the gate
                opens, and every result is got, one at a time.
  args_10k      as test_single_node.py's test_many_args: N (default 10,000)
                puts of a list of 10,000 ones, then one task taking the N
                refs as its arguments (resolved by Ray before it runs) and
                summing them. Ray's test passes the lists by value.
  pgs_1000      as distributed/test_many_pgs.py, smaller: N placement groups
                (default 1,000) of one {"CPU": 0.001} bundle created, each
                waited ready, then all removed.
  many_actors   as distributed/test_many_actors.py: N actors (default 100)
                of no CPU created and each called once.
  broadcast_1g  as object_store/test_object_store.py: a 1 GiB uint8 array of
                ones put by the driver, one reader actor on each of the N
                nodes (default 3) that have the resources host1 .. hostN,
                called once; then, timed, every reader sums the array on its
                node (which pulls it there) at once.
"""

import argparse
import asyncio
import json
import time

import numpy as np
import ray
from ray.util.placement_group import placement_group, remove_placement_group

DEFAULT_SCALE = {"tasks_1m": 1_000_000, "args_10k": 10_000, "pgs_1000": 1_000, "many_actors": 100,
                 "broadcast_1g": 3}
LIST_LEN = 10_000
BROADCAST_BYTES = 2**30


@ray.remote(num_cpus=0)
class Gate:
    """Tasks wait on it until it opens."""

    def __init__(self):
        self.permits = asyncio.Semaphore(0)

    async def wait(self):
        await self.permits.acquire()

    async def open(self, count):
        for _ in range(count):
            self.permits.release()


@ray.remote(num_cpus=1)
def block(gate):
    ray.get(gate.wait.remote())


@ray.remote(num_cpus=1)
def noop():
    return None


@ray.remote
def sum_args(*lists):
    return sum(sum(values) for values in lists)


@ray.remote(num_cpus=0)
class Idle:
    def ping(self):
        return None


@ray.remote(num_cpus=0)
class Reader:
    def ping(self):
        return None

    def sum(self, array):
        return int(array.sum())


def timed(work, *args):
    t0 = time.perf_counter()
    phases = work(*args)
    return {"seconds": time.perf_counter() - t0, **phases}


def queued_tasks(n):
    cpus = int(ray.cluster_resources()["CPU"])
    gate = Gate.remote()
    blocked = [block.remote(gate) for _ in range(cpus)]
    t0 = time.perf_counter()
    pending = [noop.remote() for _ in range(n)]
    submit_s = time.perf_counter() - t0
    gate.open.remote(cpus)
    ray.get(blocked)
    for ref in pending:
        assert ray.get(ref) is None
    return {"submit_s": submit_s}


def many_args(n):
    t0 = time.perf_counter()
    refs = [ray.put([1] * LIST_LEN) for _ in range(n)]
    put_s = time.perf_counter() - t0
    total = ray.get(sum_args.remote(*refs))
    assert total == n * LIST_LEN, total
    return {"put_s": put_s}


def placement_groups(n):
    groups = [placement_group([{"CPU": 0.001}]) for _ in range(n)]
    for pg in groups:
        ray.get(pg.ready())
    for pg in groups:
        remove_placement_group(pg)
    return {}


def many_actors(n):
    actors = [Idle.remote() for _ in range(n)]
    ray.get([actor.ping.remote() for actor in actors])
    return {}


def broadcast(hosts):
    array = np.ones(BROADCAST_BYTES, dtype=np.uint8)
    ref = ray.put(array)
    del array
    readers = [Reader.options(resources={f"host{k}": 1}).remote() for k in range(1, hosts + 1)]
    ray.get([reader.ping.remote() for reader in readers])
    t0 = time.perf_counter()
    sums = ray.get([reader.sum.remote(ref) for reader in readers])
    seconds = time.perf_counter() - t0
    assert sums == [BROADCAST_BYTES] * hosts, sums
    return {"seconds": seconds}


WORKLOADS = {
    "tasks_1m": lambda n: timed(queued_tasks, n),
    "args_10k": lambda n: timed(many_args, n),
    "pgs_1000": lambda n: timed(placement_groups, n),
    "many_actors": lambda n: timed(many_actors, n),
    "broadcast_1g": broadcast,
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--scale", type=int, help="the workload's size (default: Ray's published scale)")
    p.add_argument("--address", default="auto", help="the head's GCS address (default: auto)")
    p.add_argument("--node-ip", help="this machine's address on the cluster's network")
    a = p.parse_args()
    scale = a.scale or DEFAULT_SCALE[a.workload]
    ray.init(address=a.address, _node_ip_address=a.node_ip, logging_level="warning")
    phases = WORKLOADS[a.workload](scale)
    result = {"workload": a.workload, "seconds": phases.pop("seconds"), "scale": scale, **phases,
              "ray": ray.__version__}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
