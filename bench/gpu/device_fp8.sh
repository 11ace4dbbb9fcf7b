#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: the fp8 (e4m3) forward. Build the library, tool and
# conformance test; the CUDA conformance grid (its e4m3 cases beside the rest, quick level), also
# with three persistent blocks, and every other e4m3 case under compute-sanitizer; the error on outlier inputs beside bf16's (bench/fp8_error.c);
# then TFLOP/s of e4m3 and bf16 at FlashAttention's shapes (batch x seq = 16k, 16 heads of 128),
# and of e4m3 with descale factors per head, per 128 and per 64 rows (b4 s4k), each the median
# of the tool's timed runs. Logs to $OUT (or build/). Carry .devdeps
# (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_fp8.sh [check|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
level=${1:-all}
mkdir -p "$out"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
device_configure "$out/cmake_fp8.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn_cli test_conformance > "$out/build_fp8.log" 2>&1 ||
  { grep -E "error" "$out/build_fp8.log" | head -20; exit 1; }
echo "build ok"
./build/flashattn info --backend cuda | grep -E "device|fp8"
if [ "$level" != bench ]; then
  export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
  timeout 300 ./build/tests/test_conformance > "$out/conformance_fp8.log" 2>&1; echo "conformance_cuda rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_fp8.log" | head -20
  FLASHATTN_CUDA_PERSISTENT_BLOCKS=3 timeout 300 ./build/tests/test_conformance > "$out/conformance_fp8_p3.log" 2>&1
  echo "conformance_cuda (3 persistent blocks) rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_fp8_p3.log" | head -20
  # the e4m3 grid under compute-sanitizer: memcheck, then racecheck (shared-memory hazards)
  for tool in memcheck racecheck; do
    FLASHATTN_TEST_DTYPE=e4m3 FLASHATTN_TEST_EVERY=2 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
      ./build/tests/test_conformance > "$out/${tool}_fp8.log" 2>&1
    echo "$tool e4m3 grid rc=$?"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|cases," "$out/${tool}_fp8.log" | head -4
  done
  unset FLASHATTN_TEST_BACKEND FLASHATTN_TEST_QUICK
  cc -O2 -Iinclude -Itests/ref -o build/fp8_error bench/fp8_error.c tests/ref/ref.c -Lbuild -lflashattn -lm \
    -Wl,-rpath,$PWD/build && ./build/fp8_error --backend cuda | tee "$out/fp8_error_cuda.txt"
fi
[ "$level" = check ] && exit 0
rm -f "$out/fp8_bench.jsonl"
for bs in 4:4096 2:8192 1:16384; do
  for dt in e4m3 bf16; do
    ./build/flashattn bench --backend cuda --dtype "$dt" --batch "${bs%%:*}" --seq "${bs##*:}" --heads 16 \
      --dim 128 --causal both --no-standard --json /tmp/fp8_row.jsonl > /dev/null && cat /tmp/fp8_row.jsonl >> "$out/fp8_bench.jsonl"
  done
done
# descale factors per (batch, kv head), per 128-row block (one a key tile) and per 64 rows (one a key)
for n in 0 128 64; do
  ./build/flashattn bench --backend cuda --dtype e4m3 --batch 4 --seq 4096 --heads 16 --dim 128 --causal both \
    --no-standard --descale-rows $n --json /tmp/fp8_row.jsonl > /dev/null && cat /tmp/fp8_row.jsonl >> "$out/fp8_bench.jsonl"
done
python3 - "$out/fp8_bench.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    ds = f"descale/{r['descale_rows']}" if 'descale_rows' in r else ''
    print(f"{r['dtype']:5} b{r['batch']} s{r['seq_q']:<6} {'causal' if r['causal'] else '      '} "
          f"{r['ms_flash']:8.3f} ms {r['gflops'] / 1000:7.1f} TFLOP/s  {r['kernel']} {ds}")
PY
