"""Ray's counterpart of the quickstart's `first task result N ms after start`:
time from process spawn (BENCH_T0, the spawner's time.time() just before it
started this interpreter) through `import ray`, `ray.init()` (which starts a
local cluster, as `raylet::init()` starts an embedded one) and the result of
one tiny remote task."""

import os
import time

T0 = float(os.environ.get("BENCH_T0", time.time()))

import ray  # noqa: E402

t_import = time.time()
ray.init()
t_init = time.time()


@ray.remote
def f():
    return 1


assert ray.get(f.remote()) == 1
t_first = time.time()
print(
    f"first task result {(t_first - T0) * 1000:.1f} ms after start "
    f"(import ray {(t_import - T0) * 1000:.1f} ms, ray.init() {(t_init - t_import) * 1000:.1f} ms)",
    flush=True,
)
ray.shutdown()
