#!/bin/sh
# Fetch the exact CUDA driver API (cuda.h) and NVML (nvml.h) declarations from NVIDIA's
# header wheels on PyPI (pinned version + sha256), and extract only the two headers into
# $1 (default build/include). Run by the Makefile when the headers are missing.
set -eu
DEST=${1:-build/include}
# A Python with pip: $PYTHON, else the project's venv, else python3.
PY=
for cand in "${PYTHON:-}" "$(dirname "$0")/../../.venv/bin/python" python3; do
    if [ -n "$cand" ] && "$cand" -m pip --version >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
    echo "fetch-headers: no Python with pip found (set PYTHON=...)" >&2
    exit 1
fi
CACHE=${HAMI_HEADER_CACHE:-$(dirname "$DEST")/wheels}
mkdir -p "$DEST" "$CACHE"

fetch() { # pkg version sha256 member
    pkg=$1 ver=$2 sum=$3 member=$4
    whl=$(ls "$CACHE"/$(echo "$pkg" | tr - _)-"$ver"-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$whl" ]; then
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3 \
            -d "$CACHE" "$pkg==$ver"
        whl=$(ls "$CACHE"/$(echo "$pkg" | tr - _)-"$ver"-*.whl | head -n1)
    fi
    got=$(sha256sum "$whl" | cut -d' ' -f1)
    if [ "$got" != "$sum" ]; then
        echo "fetch-headers: sha256 mismatch for $whl: got $got, want $sum" >&2
        exit 1
    fi
    "$PY" - "$whl" "$member" "$DEST" <<'PYEOF'
import sys, zipfile, os
whl, member, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    data = z.read(member)
out = os.path.join(dest, os.path.basename(member))
with open(out + ".tmp", "wb") as f:
    f.write(data)
os.replace(out + ".tmp", out)
PYEOF
}

fetch nvidia-cuda-runtime-cu12 12.9.79 \
    25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3 \
    nvidia/cuda_runtime/include/cuda.h
fetch nvidia-nvml-dev-cu12 12.9.79 \
    8bb367913c62cb65be9ae386c58dbf573f1f9e2f01cae54abb87bf5f63c6069e \
    nvidia/nvml_dev/include/nvml.h
