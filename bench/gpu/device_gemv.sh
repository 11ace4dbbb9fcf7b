#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a CUDA machine, in one go: the runner's fused few-row projections (src/model/cuda/gemv.cu)
# checked and measured beside cuBLAS. Builds the tool and the tests, runs test_gemv,
# test_numerics and test_engine, then bench-model's decode at batches 1, 2, 4 and 8 with
# FLASHATTN_GEMV_ROWS=0 (cuBLAS) and 8 (fused wherever they take the step), in turns, twice.
# Logs go to $OUT (or build/). Carry .devdeps (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_gemv.sh [CONFIG]   (CONFIG: bench-model --config, default 7b)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
config=${1:-7b}
mkdir -p "$out"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
device_configure "$out/cmake_gemv.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn_cli test_gemv test_numerics test_engine > "$out/build_gemv.log" 2>&1 ||
  { grep -E "error" "$out/build_gemv.log" | head -20; exit 1; }
for t in gemv numerics engine; do
  timeout 300 ./build/tests/test_$t > "$out/$t.log" 2>&1; echo "test_$t rc=$?"
  grep -E "PASSED|FAILED|ERROR" "$out/$t.log" | head -10
done
for round in 1 2; do
  for rows in 0 8; do
    echo "== round $round, FLASHATTN_GEMV_ROWS=$rows"
    FLASHATTN_GEMV_ROWS=$rows timeout 200 ./build/flashattn bench-model --backend cuda --config "$config" \
      --prompt-len 512 --decode 64 --batch 1,2,4,8 2>/dev/null | tee -a "$out/bench_gemv_$config.txt"
  done
done
