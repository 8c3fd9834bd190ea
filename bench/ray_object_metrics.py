"""Ray's side of the object rows that `ray microbenchmark` lacks, timed by
Ray's own `timeit` (a 10 s sleep, 1 s warm-up, 4 trials of 2 s) and printed
as it prints them (`NAME per second MEAN +- SD`), so that
bench/compare_ray.py reads them as it reads ray_perf's:

- a put by the driver and a get in another worker process of the same node
  (an actor with `num_cpus=0` that gets refs handed to it inside a list, so
  Ray does not resolve them before the call): 1,000 small objects per round,
  or one object of 100 KiB, 1 MiB or 10 MiB (written numpy bytes, in the
  plasma store above Ray's 100 KiB inline limit);
- gets alone in another worker process: one call per round to the same
  actor, which gets 10,000 small objects the driver put once, one
  `ray.get` at a time; and the same gets of refs inside a list the driver
  put, which the actor gets first;
- put gigabytes from written memory: `ray.put` of an 800 MiB array of
  written bytes (ray_perf's row puts `np.zeros`, whose pages were never
  written);
- n:n actor calls with a 1 MiB arg: ray_perf's "n:n actor calls with arg
  async" with a 1 MiB array put instead of `0`.

TESTS_TO_RUN selects rows by substring, as for ray_perf.
"""

import multiprocessing

import numpy as np

import ray
from ray._private.ray_microbenchmark_helpers import timeit

OBJECT_SIZES = [("100 KiB", 100 * 1024), ("1 MiB", 1 << 20), ("10 MiB", 10 << 20)]


@ray.remote(num_cpus=0)
class Reader:
    def get_all(self, refs):
        return len(ray.get(refs))

    def get_each(self, refs):
        return sum(ray.get(ref) for ref in refs)

    def get_each_nested(self, lists):
        return sum(ray.get(ref) for ref in ray.get(lists[0]))

    def length(self, refs):
        return len(ray.get(refs[0]))


@ray.remote(num_cpus=0)
class Actor:
    def small_value_arg(self, x):
        return b"ok"


@ray.remote(num_cpus=0)
class Client:
    def __init__(self, server):
        self.server = server

    def small_value_batch_big_arg(self, n):
        x = ray.put(np.ones(1 << 20, dtype=np.uint8))
        ray.get([self.server.small_value_arg.remote(x) for _ in range(n)])


def put_and_get_in_another_process(reader):
    results = []

    def small():
        refs = [ray.put(0) for _ in range(1000)]
        ray.get(reader.get_all.remote(refs))

    results += timeit("single client put and get in another process, small objects", small, 1000)
    got = [ray.put(i) for i in range(10000)]
    results += timeit(
        "single client get in another process, one by one, small objects",
        lambda: ray.get(reader.get_each.remote(got)),
        10000,
    )
    listed = ray.put(got)
    results += timeit(
        "single client get in another process, one by one, small objects not sent along",
        lambda: ray.get(reader.get_each_nested.remote([listed])),
        10000,
    )
    for label, size in OBJECT_SIZES:
        array = np.ones(size, dtype=np.uint8)

        def sized(array=array):
            ray.get(reader.length.remote([ray.put(array)]))

        results += timeit(f"single client put and get in another process, {label}", sized)
    return results


def put_written_gigabytes():
    array = np.ones(100 * 1024 * 1024, dtype=np.int64)
    return timeit("single client put gigabytes from written memory", lambda: ray.put(array), 8 * 0.1)


def n_to_n_calls_with_big_arg():
    n = 1000
    clients = [Client.remote(Actor.remote()) for _ in range(max(multiprocessing.cpu_count() // 2, 1))]

    def round_():
        ray.get([c.small_value_batch_big_arg.remote(n) for c in clients])

    return timeit("n:n actor calls with 1 MiB arg async", round_, n * len(clients))


def main():
    ray.init()
    results = put_and_get_in_another_process(Reader.remote())
    results += put_written_gigabytes()
    results += n_to_n_calls_with_big_arg()
    ray.shutdown()
    return results


if __name__ == "__main__":
    main()
