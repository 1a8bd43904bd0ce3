#!/usr/bin/env bash
# Checks libvgpu on a machine with a real NVIDIA GPU and PyTorch (skips cleanly otherwise):
#   1. PyTorch allocates up to the limit, then raises torch.cuda.OutOfMemoryError
#      (default caching allocator, expandable segments = VMM path, cudaMallocAsync = pool path);
#   2. torch.cuda.mem_get_info() and nvidia-smi inside `hami exec` show the limit;
#   3. overhead of a small-kernel loop with and without the library.
# Usage: scripts/gpu-check-libvgpu.sh [LIMIT, default 4G]
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-4G}
PY=${PYTHON:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}

skip() { echo "SKIP: $*"; exit 0; }
command -v nvidia-smi >/dev/null 2>&1 || skip "nvidia-smi not found (no NVIDIA driver)"
nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi sees no GPU"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || skip "PyTorch with CUDA is not importable by $PY"

make -s -C native build/libvgpu.so
LIB=$PWD/native/build/libvgpu.so
CACHE_DIR=$(mktemp -d)
trap 'rm -rf "$CACHE_DIR"' EXIT
hexec() { # hexec NAME -- CMD...
    local name=$1; shift
    PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m hami exec --gpumem "$LIMIT" --lib "$LIB" \
        --cache "$CACHE_DIR/$name.cache" "$@"
}
LIMIT_BYTES=$(PYTHONPATH=src "$PY" -c "from hami.execcmd import parse_size; print(parse_size('$LIMIT'))")
fail=0

ALLOC_PROBE='
import os, sys, torch
limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
blocks, got = [], 0
try:
    while got <= 2 * limit:
        blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda")); got += 256 << 20
    print(f"FAIL no OOM after {got >> 20} MiB"); sys.exit(1)
except torch.cuda.OutOfMemoryError:
    pass
ok = total == limit and limit - 1536 * 2**20 <= got <= limit
status = "ok" if ok else "FAIL"
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"
print(f"{status} alloc={conf} total={total >> 20}MiB reached={got >> 20}MiB before OOM (limit {limit >> 20}MiB)")
sys.exit(0 if ok else 1)
'
for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
    PYTORCH_CUDA_ALLOC_CONF=$conf hexec "alloc${conf//[^a-z]/}" -- "$PY" -c "$ALLOC_PROBE" "$LIMIT_BYTES" || fail=1
done

echo "== nvidia-smi inside hami exec (expect total = $LIMIT)"
SMI=$(hexec smi -- nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv,noheader,nounits || true)
echo "$SMI"
want_mib=$((LIMIT_BYTES >> 20))
first_total=$(echo "$SMI" | head -n1 | cut -d, -f2 | tr -d ' ')
if [ "$first_total" = "$want_mib" ]; then echo "ok nvidia-smi total=${first_total}MiB"; else echo "FAIL nvidia-smi total=${first_total}MiB, want ${want_mib}MiB"; fail=1; fi

LOOP_PROBE='
import time, torch
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
for _ in range(1000): x.add_(1)
torch.cuda.synchronize(); n = 100000; t = time.perf_counter()
for _ in range(n): x.add_(1)
torch.cuda.synchronize(); print(f"{(time.perf_counter() - t) / n * 1e9:.0f}")
'
echo "== small-kernel loop (ns per launch incl. PyTorch dispatch; best of 3)"
best() { local b=""; for _ in 1 2 3; do v=$("$@"); if [ -z "$b" ] || [ "$v" -lt "$b" ]; then b=$v; fi; done; echo "$b"; }
base=$(best "$PY" -c "$LOOP_PROBE")
with=$(best hexec loop -- "$PY" -c "$LOOP_PROBE")
echo "without libvgpu: ${base} ns/iter; with libvgpu: ${with} ns/iter; added $((with - base)) ns"
exit $fail
