#!/usr/bin/env bash
# `make gpu-check` for a GPU machine that reaches no package index (a lent or air-gapped one):
# nothing is built or downloaded there. Prepare on a machine that can:
#     make native && scripts/gpu-check-offline.sh --wheels
# (the second writes hami's runtime dependencies as CPython 3.12 x86-64 wheels into .whl/, pinned
# as .venv has them), then copy the repository with native/build, the generated gRPC stubs and
# .whl/ over, and run this script there with a Python that has PyTorch:
#     GPU_CHECK_PYTHON=python3 scripts/gpu-check-offline.sh OUTDIR
# It installs the wheels into a folder of its own (no pip index), runs each check of
# tests/gpu/gpu_check.py alone under a time limit (one that hangs costs only its own rows) with
# --raw, and leaves OUTDIR/log (every table) and OUTDIR/raw.tgz (each probe's whole output).
#   GPU_CHECK_PYTHON  Python with PyTorch (default python3)
#   GPU_CHECK_CHECKS  "check:seconds ..." (default: every check, graphs first)
#   GPU_CHECK_ARGS    more arguments for gpu_check.py (e.g. --seconds 4)
#   GPU_CHECK_WHEELS  the folder of wheels to install (default .whl; none there: nothing installed)
#   NVIDIA_SMI        the nvidia-smi to use
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--wheels" ]; then
    set -e
    pins=$(.venv/bin/python -m pip freeze | grep -iE '^(grpcio|protobuf|pydantic|pydantic[-_]core|typing[-_]extensions|typing[-_]inspection|annotated[-_]types|kubernetes[-_]asyncio|orjson|nvidia[-_]ml[-_]py)==')
    rm -rf .whl && mkdir -p .whl
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $pins
    ls .whl
    exit 0
fi

SMI=${NVIDIA_SMI:-nvidia-smi}
command -v "$SMI" >/dev/null 2>&1 || { echo "SKIP: no NVIDIA driver ($SMI not found)"; exit 0; }
"$SMI" -L 2>/dev/null | grep -q '^GPU ' || { echo "SKIP: $SMI lists no GPU"; exit 0; }

OUTDIR=${1:-${OUT:-/tmp/hami-gpu-check}}
PY=${GPU_CHECK_PYTHON:-python3}
SITE=$(mktemp -d /tmp/hami-site.XXXXXX)
RAW=$(mktemp -d /tmp/hami-raw.XXXXXX)
mkdir -p "$OUTDIR"
LOG=$OUTDIR/log
for f in native/build/libvgpu.so native/build/bench/bench_driver src/hami/deviceplugin/api/api_pb2.py; do
    [ -f "$f" ] || { echo "gpu-check-offline: $f missing: build it where the tools are (make native proto)" >&2; exit 2; }
done
WHEELS=${GPU_CHECK_WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 3
fi
export PYTHONPATH=$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NVIDIA_SMI=$SMI
{
    date -u
    "$SMI" --query-gpu=name,driver_version,memory.total,uuid --format=csv,noheader
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
} | tee "$LOG"
rc=0
for spec in ${GPU_CHECK_CHECKS:-graphs:150 shared:60 alloc:120 smi,discovery:60 share:150 priority:80 overhead:90 torch_loop:120}; do
    only=${spec%%:*} limit=${spec##*:}
    echo "== $only (limit ${limit}s) [${SECONDS}s]" | tee -a "$LOG"
    # shellcheck disable=SC2086
    timeout "$limit" "$PY" tests/gpu/gpu_check.py --torch-python "$PY" --nvidia-smi "$SMI" --raw "$RAW" \
        --only "$only" ${GPU_CHECK_ARGS:-} 2>&1 | tee -a "$LOG"
    code=${PIPESTATUS[0]}
    echo "== $only exit $code [${SECONDS}s]" | tee -a "$LOG"
    [ "$code" = 0 ] || rc=1
    tar czf "$OUTDIR/raw.tgz" -C "$RAW" .
done
exit $rc
