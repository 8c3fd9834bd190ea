#!/usr/bin/env bash
# Everything raylet does on a CUDA GPU (examples/gpu_check.rs), in two
# halves, because the GPU machine has no Rust toolchain and no network:
#
#   bench/gpu_check.sh build      here: builds the release binary with the
#                                 `cuda` feature and packs it, stripped,
#                                 with NVRTC and CUDA's headers from the
#                                 PyPI wheels and the GPT corpus the `gpt`
#                                 example prepared, into
#                                 target/gpu-check/bundle.tar.xz (< 64 MiB)
#   bench/gpu_check.sh device [ARGS]
#                                 on the GPU machine, from the repository
#                                 root with the bundle carried there:
#                                 unpacks it and runs gpu_check ARGS (at most
#                                 8 minutes), writing gpu_check.md, its log
#                                 and nvidia-smi's report into $OUT (or
#                                 target/gpu-check/out)
#   bench/gpu_check.sh record FILE
#                                 here: appends the device run's table
#                                 (its gpu_check.md), dated, to bench/gpu.md,
#                                 BENCHMARKS.md's "What ran on a GPU"
#   bench/gpu_check.sh rehearse   here, without a GPU: `device` with every
#                                 step on the CPU and one fake GPU, and the
#                                 tiny GPT, to check the script end to end
#
# NVRTC must be no newer than the driver's CUDA: the wheels are CUDA 12.4's
# (R550 drivers and later), as are cudarc's bindings (CUDARC_CUDA_VERSION in
# .cargo/config.toml). For an older driver, set both to its version.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_WHEELS=(
    "nvidia-cuda-nvrtc-cu12==12.4.127"
    "nvidia-cuda-runtime-cu12==12.4.127"
    "nvidia-cuda-nvcc-cu12==12.4.131"
    "nvidia-cuda-cccl-cu12==12.4.127.post1"
)
WORK=target/gpu-check
BUNDLE=$WORK/bundle.tar.xz
CARRY_LIMIT=$((64 << 20))
CORPUS=target/gpt-example/data

build() {
    [ -f "$CORPUS/preparation.json" ] || {
        echo "no prepared GPT corpus in $CORPUS: run 'cargo run --release -p raylet-lm --example gpt -- --steps 1' first" >&2
        exit 1
    }
    cargo build --release -p raylet-lm --features cuda --example gpu_check
    local stage=$WORK/stage/gpu-check
    rm -rf "$WORK/stage"
    mkdir -p "$stage/lib" "$stage/cuda/include" "$WORK/wheels"
    strip -o "$stage/gpu_check" target/release/examples/gpu_check
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3.11 -d "$WORK/wheels" "${CUDA_WHEELS[@]}"
    local unpacked=$WORK/wheels/unpacked
    rm -rf "$unpacked"
    for wheel in "$WORK"/wheels/*.whl; do
        python3 -m zipfile -e "$wheel" "$unpacked"
    done
    cp -L "$unpacked"/nvidia/cuda_nvrtc/lib/libnvrtc*.so* "$stage/lib/"
    cp -r "$unpacked"/nvidia/cuda_runtime/include/. "$stage/cuda/include/"
    cp -r "$unpacked"/nvidia/cuda_nvcc/include/crt "$stage/cuda/include/"
    cp -r "$unpacked"/nvidia/cuda_cccl/include/cuda "$unpacked"/nvidia/cuda_cccl/include/nv "$stage/cuda/include/"
    cp -r "$CORPUS" "$stage/data"
    tar -C "$WORK/stage" -cJf "$BUNDLE" gpu-check
    local size
    size=$(stat -c %s "$BUNDLE")
    echo "bundle: $BUNDLE, $((size >> 20)) MiB"
    if ((size > CARRY_LIMIT)); then
        echo "the bundle is over the 64 MiB a device run carries" >&2
        exit 1
    fi
}

device() {
    local out=${OUT:-$WORK/out}
    unpacked=$(mktemp -d)
    trap 'rm -rf "$unpacked"' EXIT
    mkdir -p "$out"
    tar -C "$unpacked" -xJf "$BUNDLE"
    local root=$unpacked/gpu-check
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi here" >>"$out/nvidia-smi.txt"
    export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CUDA_PATH=$root/cuda
    export TMPDIR=$unpacked
    local status=0
    timeout 480 "$root/gpu_check" --data "$root/data" --out "$out/gpu_check.md" "$@" 2>&1 | tee "$out/gpu_check.log" ||
        status=$?
    echo "gpu_check ended with status $status; its table, log and nvidia-smi's report are in $out"
    return "$status"
}

# Appends the table FILE, dated, to bench/gpu.md, then rewrites the sections
# of BENCHMARKS.md (its "What ran on a GPU" is bench/gpu.md).
record() {
    local table=${1:?record takes the gpu_check.md of a device run}
    python3 - "$table" <<'PY'
import sys, datetime
table = open(sys.argv[1]).read().strip()
stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
with open("bench/gpu.md", "a") as gpu:
    gpu.write(f"\n### `cuda`, {stamp}\n\n{table}\n")
PY
    python3 bench/compare_ray.py --refresh-sections
}

case "${1:-}" in
build) build ;;
device) shift && device "$@" ;;
record) record "${2:-}" ;;
# BURN_DEVICE: burn loads a sharded optimizer's state onto the default
# device before moving it to the parameters', and in a cuda build that is
# the GPU, which a rehearsal has not.
rehearse) GPU_CHECK_ON_CPU=1 BURN_DEVICE=flex device --model tiny --gpt-steps 3 --epochs 2 ;;
*)
    sed -n '2,26p' "$0" >&2
    exit 2
    ;;
esac
