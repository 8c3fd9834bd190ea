#!/usr/bin/env python3
"""The Ray Data 2.60 side of the Parquet, images and shuffle benchmarks of
bench/compare_data.py (`--only parquet|images|shuffle`); run it with the
python of target/bench-venv. Each mode starts `ray.init(num_cpus=2)`, times
its pipeline apart from the cluster start, and prints ONE JSON line on
stdout (the last line), `{"rows": N, "seconds": S, <checks>, ...}`:

  parquet --input D --output O
      read_parquet(D) -> map_batches(out = c0 * 2 + c1, the other columns
      kept; pyarrow batches, a task per block fused with the read) ->
      write_parquet(O). Timed to write_parquet's return. Then, untimed, O is
      read back with pyarrow: rows (rows written), sum_out and sum_c0 (sums
      of those columns of O), columns (O's column names).
  images --input D [--actors 2] [--batch-size 64|0] [--backend auto|torch|numpy] [--seed 0]
      read_images(D, mode="L", include_paths=True) -> map_batches(Classifier,
      concurrency=actors): a small CNN (conv 1->8 3x3, relu, maxpool 2, conv
      8->16 3x3, relu, maxpool 2, flatten, linear 576->10; no padding; weights
      drawn from --seed, random: only the throughput is compared), one torch
      thread per actor, on the CPU; the label is parsed from each image's
      folder. --batch-size 64 runs the actors at num_cpus=0.5 (an int batch
      size keeps the read out of the actors, in 1-CPU tasks, which 2 actors of
      1 CPU each would starve); 0 is Ray's default (each block one batch, the
      read fused into the actors, 1 CPU each). Consumed by iter_batches in the
      driver. Checks: rows (images), label_sum (sum of the folder labels),
      pred_hist (predicted classes, 10 counts summing to rows). backend says
      which implementation ran: "torch <version>" or "numpy" (when torch is
      not importable, or with --backend numpy).
  shuffle --input D --seed S
      read_parquet(D) -> random_shuffle(seed=S), consumed fully by
      iter_batches in the driver (pyarrow batches). Checks: rows, sum_c0.
  verify-parquet --dir O
      Untimed, no Ray: rows, sum_out, sum_c0 and columns of the parquet files
      in O (the harness checks raylet's output with it too).

The data sets are bench/make_data.py's; their values are multiples of 2^-16,
so the sums are exact whatever the order and must equal its manifest's.
--temp-dir gives Ray's temp dir (the harness passes one per run).
"""

import argparse
import json
import os
import sys
import time

T_START = time.perf_counter()
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def emit(result):
    print(json.dumps(result), flush=True)


def parquet_summary(directory):
    """rows, sum_out, sum_c0 and the column names of the parquet files in
    `directory` (pyarrow, streamed a row group at a time)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows, sum_out, sum_c0, columns, files = 0, 0.0, 0.0, None, 0
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".parquet"):
            continue
        files += 1
        f = pq.ParquetFile(os.path.join(directory, name))
        names = f.schema_arrow.names
        columns = columns or names
        if names != columns:
            raise SystemExit(f"{name}: columns {names}, another file has {columns}")
        for g in range(f.num_row_groups):
            t = f.read_row_group(g, columns=[c for c in ("out", "c0") if c in names])
            rows += t.num_rows
            if "out" in names:
                sum_out += pc.sum(t["out"]).as_py() or 0.0
            if "c0" in names:
                sum_c0 += pc.sum(t["c0"]).as_py() or 0.0
    return {"rows": rows, "sum_out": sum_out, "sum_c0": sum_c0, "columns": columns or [], "files": files}


# ---------------------------------------------------------------- the CNN


CNN_SHAPE = "conv 1->8 3x3, relu, maxpool 2, conv 8->16 3x3, relu, maxpool 2, flatten, linear 576->10 (no padding)"


def torch_model(seed):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),    # 32 -> 30 -> 15
        nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),   # 15 -> 13 -> 6
        nn.Flatten(), nn.Linear(16 * 6 * 6, 10))
    model.eval()

    def predict(images):  # uint8 [B, 32, 32] -> int64 [B]
        with torch.inference_mode():
            x = torch.from_numpy(images).to(torch.float32).div_(255.0).unsqueeze(1)
            return model(x).argmax(dim=1).numpy()

    return predict, f"torch {torch.__version__} (CPU)"


def numpy_model(seed):
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    w1, b1 = he((8, 1, 3, 3), 9), np.zeros(8, np.float32)
    w2, b2 = he((16, 8, 3, 3), 72), np.zeros(16, np.float32)
    w3, b3 = he((576, 10), 576), np.zeros(10, np.float32)

    def conv(x, w, b):  # [B, C, H, W] x [O, C, 3, 3] -> [B, O, H-2, W-2]
        win = sliding_window_view(x, (3, 3), axis=(2, 3))
        return np.einsum("bchwij,ocij->bohw", win, w, optimize=True) + b[None, :, None, None]

    def pool(x):
        b, c, h, w = x.shape
        h2, w2 = h // 2, w // 2
        return x[:, :, :h2 * 2, :w2 * 2].reshape(b, c, h2, 2, w2, 2).max(axis=(3, 5))

    def predict(images):
        x = (images.astype(np.float32) / 255.0)[:, None]
        x = pool(np.maximum(conv(x, w1, b1), 0))
        x = pool(np.maximum(conv(x, w2, b2), 0))
        return (x.reshape(len(x), -1) @ w3 + b3).argmax(axis=1)

    return predict, "numpy"


def make_model(backend, seed):
    if backend in ("auto", "torch"):
        try:
            return torch_model(seed)
        except (ImportError, OSError, ValueError):  # not installed, or its libraries missing
            if backend == "torch":
                raise
    return numpy_model(seed)


class Classifier:
    def __init__(self, backend, seed):
        self.predict, self.backend = make_model(backend, seed)

    def __call__(self, batch):
        import numpy as np

        images = batch["image"]
        if images.dtype == object:  # images of mixed shapes come as an object array
            images = np.stack(list(images))
        labels = np.array([int(os.path.basename(os.path.dirname(p))) for p in batch["path"]], dtype=np.int64)
        return {"label": labels, "pred": np.asarray(self.predict(images), dtype=np.int64),
                "backend": np.array([self.backend] * len(labels))}


# ---------------------------------------------------------------- modes


def start_ray(args):
    import ray

    t_import = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, _temp_dir=args.temp_dir)
    ray.data.DataContext.get_current().enable_progress_bars = False
    t_init = time.perf_counter()
    return ray, {"import_s": round(t_import - T_START, 4), "init_s": round(t_init - t_import, 4)}, t_init


def finish(ray, res, t_init, t_run):
    ray.shutdown()
    res.update(seconds=round(t_run - t_init, 4), shutdown_s=round(time.perf_counter() - t_run, 4),
               ray=ray.__version__)
    return res


def with_rate(res):
    res["rows_per_s"] = round(res["rows"] / res["seconds"], 1) if res["seconds"] > 0 else None
    return res


def run_parquet(args):
    if os.path.exists(args.output) and os.listdir(args.output):
        raise SystemExit(f"{args.output} is not empty")
    ray, res, t_init = start_ray(args)
    import pyarrow.compute as pc

    def add_out(t):
        return t.append_column("out", pc.add(pc.multiply(t["c0"], 2.0), t["c1"]))

    ray.data.read_parquet(args.input).map_batches(add_out, batch_format="pyarrow").write_parquet(args.output)
    t_run = time.perf_counter()
    res = finish(ray, res, t_init, t_run)
    t0 = time.perf_counter()
    res.update(parquet_summary(args.output))
    res["verify_s"] = round(time.perf_counter() - t0, 4)
    return {"mode": "parquet", **with_rate(res)}


def run_images(args):
    ray, res, t_init = start_ray(args)
    import numpy as np

    options = dict(batch_size=args.batch_size, num_cpus=0.5) if args.batch_size else {}
    ds = ray.data.read_images(args.input, mode="L", include_paths=True).map_batches(
        Classifier, concurrency=args.actors, fn_constructor_kwargs={"backend": args.backend, "seed": args.seed},
        **options)
    rows, label_sum, hist, backends = 0, 0, np.zeros(10, np.int64), set()
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        rows += len(batch["pred"])
        backends.update(batch["backend"].tolist())
        label_sum += int(batch["label"].sum())
        hist += np.bincount(batch["pred"], minlength=10)[:10]
    t_run = time.perf_counter()
    res["rows"] = rows
    res = finish(ray, res, t_init, t_run)
    # The actors' own word (the driver does not import torch, which would add to its peak memory).
    res.update(label_sum=label_sum, pred_hist=hist.tolist(), backend=", ".join(sorted(backends)), actors=args.actors,
               batch_size=args.batch_size or None, variant="batch64" if args.batch_size else "blocks",
               cnn=CNN_SHAPE)
    return {"mode": "images", **with_rate(res)}


def run_shuffle(args):
    ray, res, t_init = start_ray(args)
    import pyarrow.compute as pc

    ctx = ray.data.DataContext.get_current()
    ds = ray.data.read_parquet(args.input).random_shuffle(seed=args.seed)
    rows, sum_c0, first = 0, 0.0, None
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        rows += batch.num_rows
        sum_c0 += pc.sum(batch["c0"]).as_py() or 0.0
        if first is None and batch.num_rows:
            first = batch["c0"][0].as_py()
    t_run = time.perf_counter()
    res["rows"] = rows
    res = finish(ray, res, t_init, t_run)
    res.update(sum_c0=sum_c0, first_c0=first, shuffle_strategy=str(ctx.shuffle_strategy), seed=args.seed)
    return {"mode": "shuffle", **with_rate(res)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--temp-dir", default=None, help="Ray's temp dir (default Ray's own)")
    common.add_argument("--num-cpus", type=int, default=2)
    a = sub.add_parser("parquet", parents=[common])
    a.add_argument("--input", required=True)
    a.add_argument("--output", required=True)
    a = sub.add_parser("images", parents=[common])
    a.add_argument("--input", required=True)
    a.add_argument("--actors", type=int, default=2)
    a.add_argument("--batch-size", type=int, default=0, help="64: batch_size=64, num_cpus=0.5; 0: Ray's default")
    a.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto")
    a.add_argument("--seed", type=int, default=0, help="seed of the CNN's random weights")
    a = sub.add_parser("shuffle", parents=[common])
    a.add_argument("--input", required=True)
    a.add_argument("--seed", type=int, required=True)
    a = sub.add_parser("verify-parquet")
    a.add_argument("--dir", required=True)
    args = p.parse_args()
    if args.mode == "verify-parquet":
        emit(parquet_summary(args.dir))
        return
    emit({"parquet": run_parquet, "images": run_images, "shuffle": run_shuffle}[args.mode](args))


if __name__ == "__main__":
    sys.exit(main())
