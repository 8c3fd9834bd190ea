#!/usr/bin/env python3
"""Seeded inputs for the side-by-side Data benchmarks of bench/compare_data.py
(`--only parquet|images|shuffle`); run with the python of target/bench-venv
(numpy and pyarrow; the images need numpy only, their PNGs are written with
the standard library).

  make_data.py parquet --dir D --rows N --files F --seed S [--row-group R] [--compression C]
      F parquet files D/part-00000.parquet ... holding N rows in all (the
      first N % F files one row more), row groups of at most R rows (default
      1,000,000), 8 float64 columns c0..c7. Every value is a standard normal
      draw rounded to a multiple of 2^-16 (its magnitude is far below 2^10),
      so that any sum of up to 10^7 of them, and of `c0 * 2 + c1`, is exact
      in float64 whatever the order of the additions: a sum computed by any
      pipeline (after a shuffle, over a rewritten file) must equal the one
      recorded here bit for bit. File i is drawn from its own stream
      (numpy's PCG64 seeded with SeedSequence(S).spawn(F)[i]), so the bytes
      depend only on N, F, S and R, not on how the work is split.
  make_data.py images --dir D --count N --seed S --digits FILE
      N PNG images (32x32, 8-bit grayscale) D/<label>/img_NNNNN.png, NNNNN
      the image's index (5 digits, more when N > 100,000), <label> 0..9 the
      class of the digit it was made from. FILE is the 8x8 digits as CSV, one
      digit a line: 64 pixel values 0..16 (row by row), then the label 0..9
      (the raylet side exports it; a header line that does not parse is
      skipped). Image i: a digit drawn uniformly from FILE, each pixel
      scaled to 0..255 (v * 255 / 16), upscaled 4x (each pixel a 4x4 square),
      plus gaussian noise (sigma --noise, default 24), rounded and clipped to
      0..255; one seeded generator (PCG64(S)) draws the digit and the noise
      of every image in index order.

Each writes D/../<name of D>.json beside D (not inside it, so that no reader
of D sees it): the parameters, the files, and the figures the benchmarks
check their results against (rows, exact column sums; the image count per
label and the sum of the labels). It prints that JSON on one line too.
D is removed first and written afresh.
"""

import argparse
import csv
import hashlib
import json
import os
import shutil
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

COLUMNS = [f"c{i}" for i in range(8)]
QUANTUM = 2.0 ** -16  # every parquet value is a multiple of this
SIDE = 32  # image side, pixels
SCALE = 4  # 8x8 digits upscaled 4x


def manifest_path(directory):
    directory = Path(directory)
    return directory.parent / (directory.name + ".json")


def write_manifest(directory, meta):
    path = manifest_path(directory)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, path)
    print(json.dumps(meta), flush=True)


def fresh_dir(directory):
    directory = Path(directory)
    manifest_path(directory).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


# ---------------------------------------------------------------- parquet


def quantized_normals(rng, shape):
    """Standard normal draws rounded to a multiple of 2^-16, as float64, and
    the same as int64 multiples of 2^-16 (for exact sums)."""
    q = np.rint(rng.standard_normal(shape) / QUANTUM).astype(np.int64)
    return q.astype(np.float64) * QUANTUM, q


def make_parquet(args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if args.rows < 0 or args.files < 1 or args.row_group < 1:
        sys.exit("--rows must be >= 0, --files and --row-group >= 1")
    t0 = time.perf_counter()
    directory = fresh_dir(args.dir)
    seeds = np.random.SeedSequence(args.seed).spawn(args.files)
    base, extra = divmod(args.rows, args.files)
    # Exact sums, in units of 2^-16 (Python ints: no overflow).
    sums = {c: 0 for c in COLUMNS}
    sum_out = 0
    files = []
    for i in range(args.files):
        rows = base + (1 if i < extra else 0)
        rng = np.random.Generator(np.random.PCG64(seeds[i]))
        path = directory / f"part-{i:05d}.parquet"
        schema = pa.schema([(c, pa.float64()) for c in COLUMNS])
        with pq.ParquetWriter(path, schema, compression=args.compression) as writer:
            left = rows
            while left > 0:
                n = min(left, args.row_group)
                # Column by column, so each column of a group is one contiguous draw.
                values, ints = zip(*(quantized_normals(rng, n) for _ in COLUMNS))
                for c, q in zip(COLUMNS, ints):
                    sums[c] += int(q.sum())
                sum_out += int((ints[0] * 2 + ints[1]).sum())
                writer.write_table(pa.table(dict(zip(COLUMNS, values)), schema=schema), row_group_size=n)
                left -= n
        files.append({"name": path.name, "rows": rows, "bytes": path.stat().st_size})
    meta = {
        "kind": "parquet", "dir": str(directory), "rows": args.rows, "files": args.files, "seed": args.seed,
        "row_group": args.row_group, "compression": args.compression, "columns": COLUMNS,
        "bytes_on_disk": sum(f["bytes"] for f in files), "bytes_in_memory": args.rows * 8 * len(COLUMNS),
        # Exact: every partial sum is a multiple of 2^-16 far below 2^53 * 2^-16.
        "sums": {c: s * QUANTUM for c, s in sums.items()},
        "sum_out": sum_out * QUANTUM, "out_expr": "c0 * 2 + c1",
        "generator": "numpy PCG64(SeedSequence(seed).spawn(files)[i]), standard_normal rounded to 2^-16",
        "numpy": np.__version__, "pyarrow": pa.__version__, "make_s": round(time.perf_counter() - t0, 3),
        "file_list": files,
    }
    write_manifest(directory, meta)


# ---------------------------------------------------------------- images


def read_digits(path):
    """(pixels uint8 [n, 8, 8] in 0..16, labels int64 [n]) from the CSV."""
    pixels, labels = [], []
    with open(path, newline="") as f:
        for lineno, row in enumerate(csv.reader(f), 1):
            row = [cell.strip() for cell in row if cell.strip() != ""]
            if not row:
                continue
            try:
                values = [float(v) for v in row]
            except ValueError:
                if lineno == 1:
                    continue  # a header
                raise SystemExit(f"{path}:{lineno}: not numbers: {row[:5]}...")
            if len(values) != 65:
                raise SystemExit(f"{path}:{lineno}: {len(values)} values, expected 64 pixels and a label")
            px, label = values[:64], values[64]
            if any(v < 0 or v > 16 or v != int(v) for v in px) or label not in range(10):
                raise SystemExit(f"{path}:{lineno}: pixels must be integers 0..16 and the label 0..9")
            pixels.append(px)
            labels.append(int(label))
    if not pixels:
        raise SystemExit(f"{path}: no digits")
    return np.array(pixels, dtype=np.uint8).reshape(-1, 8, 8), np.array(labels, dtype=np.int64)


def png_gray8(image):
    """The bytes of an 8-bit grayscale PNG of the 2-D uint8 array (no
    filtering, zlib level 6): the same bytes on every machine."""
    h, w = image.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def make_images(args):
    if args.count < 0:
        sys.exit("--count must be >= 0")
    t0 = time.perf_counter()
    digits, labels = read_digits(args.digits)
    directory = fresh_dir(args.dir)
    for label in range(10):
        (directory / str(label)).mkdir()
    rng = np.random.Generator(np.random.PCG64(args.seed))
    width = max(5, len(str(max(args.count - 1, 0))))
    per_label = [0] * 10
    total_bytes = 0
    pixel_sum = 0
    for i in range(args.count):
        k = int(rng.integers(len(digits)))
        base = np.kron(digits[k].astype(np.float64) * (255.0 / 16.0), np.ones((SCALE, SCALE)))
        noisy = base + rng.normal(0.0, args.noise, size=(SIDE, SIDE))
        image = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        data = png_gray8(image)
        label = int(labels[k])
        (directory / str(label) / f"img_{i:0{width}d}.png").write_bytes(data)
        per_label[label] += 1
        total_bytes += len(data)
        pixel_sum += int(image.sum(dtype=np.int64))
    meta = {
        "kind": "images", "dir": str(directory), "count": args.count, "seed": args.seed, "noise": args.noise,
        "digits_file": str(Path(args.digits).resolve()),
        "digits_sha256": hashlib.sha256(Path(args.digits).read_bytes()).hexdigest(), "digits": int(len(digits)),
        "side": SIDE, "mode": "L",
        "per_label": per_label, "label_sum": sum(l * n for l, n in enumerate(per_label)),
        "pixel_sum": pixel_sum, "bytes_on_disk": total_bytes,
        "generator": "numpy PCG64(seed): per image integers(len(digits)), then normal(0, noise, (32, 32))",
        "numpy": np.__version__, "make_s": round(time.perf_counter() - t0, 3),
    }
    write_manifest(directory, meta)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    pq_ = sub.add_parser("parquet", help="parquet files of 8 float64 columns")
    pq_.add_argument("--dir", required=True)
    pq_.add_argument("--rows", type=int, required=True)
    pq_.add_argument("--files", type=int, required=True)
    pq_.add_argument("--seed", type=int, required=True)
    pq_.add_argument("--row-group", type=int, default=1_000_000, help="most rows per row group (default 1,000,000)")
    pq_.add_argument("--compression", default="snappy", help="parquet codec (default snappy; 'none' for none)")
    im = sub.add_parser("images", help="32x32 grayscale PNGs of noisy upscaled digits")
    im.add_argument("--dir", required=True)
    im.add_argument("--count", type=int, required=True)
    im.add_argument("--seed", type=int, required=True)
    im.add_argument("--digits", required=True, help="CSV: 64 pixel values 0..16, then the label, per line")
    im.add_argument("--noise", type=float, default=24.0, help="sigma of the gaussian noise, in 0..255 units")
    args = p.parse_args()
    if args.kind == "parquet":
        make_parquet(args)
    else:
        make_images(args)


if __name__ == "__main__":
    main()
