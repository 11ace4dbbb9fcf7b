#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a CUDA machine, in one go: prefill over a paged cache end to end. Build the library, the
# tool and the tests; the dense, backward and paged grids (also with FLASHATTN_CUDA_SLACK=-1)
# and test_engine on CUDA (quick); chunked prefill at page 16 beside the dense forward, pages
# shuffled and in order (prefill_paged.py); bench-model's Llama-2-7B prefill at 2048 and 8192
# tokens and decode at batch 1 and 32; transformers' prefill beside it (hf_peer.py). Logs and
# JSON lines go to $OUT (or build/). Carry .devdeps (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_prefill.sh [check|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
level=${1:-all}
mkdir -p "$out"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
device_configure "$out/cmake_prefill.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn flashattn_cli test_paged test_conformance test_backward test_engine \
  > "$out/build_prefill.log" 2>&1 || { grep -E "error" "$out/build_prefill.log" | head -20; exit 1; }
stamp "build ok"
F=./build/flashattn
if [ "$level" != bench ]; then
  device_grids "$out" cuda
  stamp "grids done"
  # the forward with its O rescaled every key tile (the conditional rescale off)
  device_grids "$out" noslack FLASHATTN_CUDA_SLACK=-1
  stamp "grids with FLASHATTN_CUDA_SLACK=-1 done"
  FLASHATTN_TEST_QUICK=1 timeout 300 ./build/tests/test_engine > "$out/engine_cuda.log" 2>&1
  stamp "test_engine rc=$?"; grep -E "FAILED|PASSED|ids|logits" "$out/engine_cuda.log" | head -12
fi
[ "$level" = check ] && exit 0
for order in "" --in-order; do
  timeout 200 python3 bench/gpu/prefill_paged.py --page 16 $order --json "$out/prefill_paged.jsonl" \
    > "$out/prefill_paged$order.log" 2>&1
  stamp "prefill_paged --page 16 $order rc=$?"; tail -10 "$out/prefill_paged$order.log"
done
for P in 2048 8192; do
  timeout 150 $F bench-model --backend cuda --config 7b --prompt-len $P --decode 8 --batch 1 2>/dev/null | tail -2
done
timeout 300 $F bench-model --backend cuda --config 7b --prompt-len 512 --decode 64 --batch 1,32 2>/dev/null | tail -3
stamp "bench-model done"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu/hf_peer.py --config 7b --decode-batch '' --serve-requests 0 \
  --json "$out/hf_peer_prefill.jsonl" 2>&1 | tail -4
stamp "hf_peer done"
