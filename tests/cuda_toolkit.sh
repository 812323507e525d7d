#!/usr/bin/env bash
# Installs (once) the parts of CUDA 13 that compile kernels without a GPU — NVRTC, ptxas and the
# headers, from NVIDIA's PyPI wheels, into ~/.cache/tally/cuda-13 — and prints the toolkit's
# folder, for tests/cuda_codegen.rs's TALLY_CUDA_TOOLKIT (its lib/ holds libnvrtc.so.13).
set -euo pipefail
target="${TALLY_CUDA_WHEELS:-$HOME/.cache/tally/cuda-13}"
root="$target/nvidia/cu13"
if [ ! -e "$root/lib/libnvrtc.so.13" ] || [ ! -e "$root/bin/ptxas" ]; then
    # The major version CubeCL 0.10's cudarc loads (libnvrtc.so.13); crt and cccl hold headers
    # that NVRTC includes.
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target "$target" \
        nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 >&2
fi
for needed in include/cuda_bf16.h bin/ptxas lib/libnvrtc.so.13; do
    [ -e "$root/$needed" ] || { echo "error: $root/$needed is missing after installing the CUDA wheels" >&2; exit 1; }
done
echo "$root"
