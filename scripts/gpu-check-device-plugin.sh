#!/usr/bin/env bash
# Runs `hami device-plugin --dry-run` against the real NVIDIA driver: prints the GPUs NVML
# reports (UUID, model, memory, PCI bus id, NUMA node) and the hami.io/node-nvidia-register
# annotation the plugin would write for this node. Nothing is registered or written.
#
#   scripts/gpu-check-device-plugin.sh [extra hami device-plugin flags, e.g. --node-config f]
#
# Exits 0 with a "skipped" line on a machine without an NVIDIA GPU/driver.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check-device-plugin: skipped (no NVIDIA GPU or driver on this machine)"
    exit 0
fi
make -s proto >/dev/null
echo "== nvidia-smi -L"
nvidia-smi -L
echo "== hami device-plugin --dry-run (real NVML)"
NODE_NAME=${NODE_NAME:-$(hostname)} .venv/bin/hami device-plugin --dry-run "$@"
