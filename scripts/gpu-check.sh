#!/usr/bin/env bash
# Every real-GPU check in one command, for a machine with an NVIDIA GPU, its driver and PyTorch.
# Each check prints its figures, or a SKIP line when the machine has no GPU (exit 0 then).
#   scripts/gpu-check.sh            (or: make gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
run() { echo; echo "===== $*"; "$@" || rc=1; }
run scripts/gpu-check-device-plugin.sh
run scripts/gpu-check-libvgpu.sh "${GPU_CHECK_LIMIT:-4G}"
run "${PYTHON:-.venv/bin/python}" scripts/gpu-check-compute-share.py
exit $rc
