#!/usr/bin/env bash
# `make gpu-check`: every claim the fake GPU supports, checked on a real NVIDIA GPU, as one table
# (tests/gpu/gpu_check.py). Prints "SKIP: ..." and exits 0 on a machine without an NVIDIA GPU,
# before building or installing anything.
#
# It builds what it needs: the project venv, the gRPC stubs and native/ (make), and a separate
# venv with PyTorch (default torch==2.9.1 from PyPI) under ~/.cache/hami/gpu-check-venv.
#   GPU_CHECK_TORCH        pip requirement for PyTorch (e.g. torch==2.5.1 for an older driver)
#   GPU_CHECK_TORCH_INDEX  pip index URL for it (e.g. a CUDA-specific wheel index)
#   GPU_CHECK_VENV         where the PyTorch venv lives
#   NVIDIA_SMI             the nvidia-smi to use
# Extra arguments go to the driver (e.g. --only alloc,smi --seconds 5).
set -euo pipefail
cd "$(dirname "$0")/.."
SMI=${NVIDIA_SMI:-nvidia-smi}
skip() { echo "SKIP: $*"; exit 0; }
command -v "$SMI" >/dev/null 2>&1 || skip "no NVIDIA driver ($SMI not found)"
"$SMI" -L 2>/dev/null | grep -q '^GPU ' || skip "$SMI lists no GPU"

PYTHON=${PYTHON:-python3}
make -s .venv/.installed proto native
VENV=${GPU_CHECK_VENV:-$HOME/.cache/hami/gpu-check-venv}
TORCH=${GPU_CHECK_TORCH:-torch==2.9.1}
if [ "$(cat "$VENV/.hami-torch" 2>/dev/null)" != "$TORCH" ] || ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    echo "gpu-check: installing $TORCH into $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q ${GPU_CHECK_TORCH_INDEX:+--index-url "$GPU_CHECK_TORCH_INDEX"} "$TORCH"
    echo "$TORCH" > "$VENV/.hami-torch"
fi
"$VENV/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "gpu-check: $TORCH cannot use this GPU (driver too old for its CUDA?); set GPU_CHECK_TORCH / GPU_CHECK_TORCH_INDEX" >&2
    exit 1
}
exec .venv/bin/python tests/gpu/gpu_check.py --torch-python "$VENV/bin/python" --nvidia-smi "$SMI" "$@"
