"""Ray's side of the generator rows, which `ray microbenchmark` lacks (Ray
2.60's ray/_private/ray_perf.py has no generator or streaming row), timed by
Ray's own `timeit` (a 10 s sleep, 1 s warm-up, 4 trials of 2 s) and printed
as it prints them (`NAME per second MEAN +- SD`), so that
bench/compare_ray.py reads them as it reads ray_perf's:

- generator items (1 KiB): one remote generator task
  (`num_returns="streaming"`) yields 1,000 items of 1 KiB (`bytes`, made
  fresh for each item; under Ray's 100 KiB inline limit, so they come back
  inside the generator's reports to the owner), and the driver iterates the
  `ObjectRefGenerator`, `ray.get`ting each ref as it arrives; 1,000 items
  per round;
- generator items (1 MiB): the same with 100 items of 1 MiB
  (above the inline limit: each is put in the plasma store by the worker
  and read from it by the driver); 100 items per round.

The item counts per call are those of raylet's side
(cli/src/microbenchmark/generators.rs). Backpressure is left at Ray's
default: `_generator_backpressure_num_objects` unset, which Ray 2.60's
RemoteFunction._remote turns into -1, i.e. no backpressure (the task yields
as fast as it can however many items the driver has not consumed yet;
ray/remote_function.py, ray/_common/ray_option_utils.py).

TESTS_TO_RUN selects rows by substring, as for ray_perf.
"""

import ray
from ray._private.ray_microbenchmark_helpers import timeit

# (label, bytes per item, items per call)
ITEM_SIZES = [("1 KiB", 1 << 10, 1000), ("1 MiB", 1 << 20, 100)]


@ray.remote(num_returns="streaming")
def items_of(size, count):
    for i in range(count):
        yield bytes([i & 0xFF]) * size


def take_all(size, count):
    """Gets every item of one generator task as its ref arrives."""
    got = 0
    for ref in items_of.remote(size, count):
        value = ray.get(ref)
        assert len(value) == size
        got += 1
    assert got == count


def main():
    ray.init()
    results = []
    for label, size, count in ITEM_SIZES:
        results += timeit(
            f"generator items ({label})",
            lambda size=size, count=count: take_all(size, count),
            count,
        )
    ray.shutdown()
    return results


if __name__ == "__main__":
    main()
