"""Ray Serve's side of the Serve comparison: the same two applications that
raylet-serve's `serve_bench` example deploys, on Ray Serve (`ray[serve]`),
served over HTTP on 127.0.0.1 until stdin closes.

  noop   POST /noop    body read and ignored, answers {"ok": true};
                       2 replicas, max_ongoing_requests 64.
  digits POST /digits  {"pixels": [64 floats]} -> {"digit": k}: the digits
                       MLP (64 -> hidden -> 10, ReLU) with the weights in
                       WEIGHTS (JSON: w1 [64][hidden], b1, w2 [hidden][10],
                       b2), as serve_bench wrote them, computed with numpy; @serve.batch with
                       max_batch_size 32 and batch_wait_timeout_s 0.005;
                       2 replicas.
  digits_nowait        the same with batch_wait_timeout_s 0: a batch takes
  POST /digits_nowait  the requests that queued while the replica's
                       previous batch ran.

Prints `READY noop=<port> digits=<port> digits_nowait=<port>` once all answer, then waits for stdin to close and
shuts Ray down.

  target/bench-venv/bin/python bench/serve_ray.py --port 8000 --weights W.json
"""

import argparse
import json
import sys
import time
import urllib.request

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse


@serve.deployment(num_replicas=2, max_ongoing_requests=64, ray_actor_options={"num_cpus": 0})
class Noop:
    async def __call__(self, request: Request):
        await request.body()
        return JSONResponse({"ok": True})


class MLP:
    """The digits MLP, computed with numpy."""

    def __init__(self, weights_path: str):
        with open(weights_path) as f:
            weights = json.load(f)
        self.w1 = np.asarray(weights["w1"], dtype=np.float32)
        self.b1 = np.asarray(weights["b1"], dtype=np.float32)
        self.w2 = np.asarray(weights["w2"], dtype=np.float32)
        self.b2 = np.asarray(weights["b2"], dtype=np.float32)

    def forward(self, pixels: list):
        x = np.asarray(pixels, dtype=np.float32)
        hidden = np.maximum(x @ self.w1 + self.b1, 0.0)
        return [int(k) for k in np.argmax(hidden @ self.w2 + self.b2, axis=1)]

    async def __call__(self, request: Request):
        body = await request.json()
        return JSONResponse({"digit": await self.classify(body["pixels"])})


@serve.deployment(num_replicas=2, max_ongoing_requests=64, ray_actor_options={"num_cpus": 0})
class Digits(MLP):
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def classify(self, pixels: list):
        return self.forward(pixels)


@serve.deployment(num_replicas=2, max_ongoing_requests=64, ray_actor_options={"num_cpus": 0})
class DigitsNoWait(MLP):
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0)
    async def classify(self, pixels: list):
        return self.forward(pixels)


def wait_until_answering(port: int, path: str, body: bytes, timeout: float = 120.0):
    deadline = time.time() + timeout
    while True:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as answer:
                if answer.status == 200:
                    return
        except Exception:
            if time.time() > deadline:
                raise
        time.sleep(0.5)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--weights", required=True, help="the digits MLP's weights, as serve_bench wrote them")
    args = p.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(Noop.bind(), name="noop", route_prefix="/noop")
    serve.run(Digits.bind(args.weights), name="digits", route_prefix="/digits")
    serve.run(DigitsNoWait.bind(args.weights), name="digits_nowait", route_prefix="/digits_nowait")
    wait_until_answering(args.port, "/noop", b"{}")
    for path in ("/digits", "/digits_nowait"):
        wait_until_answering(args.port, path, json.dumps({"pixels": [0.0] * 64}).encode())
    print(f"READY noop={args.port} digits={args.port} digits_nowait={args.port}", flush=True)
    sys.stdin.read()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
