#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: the Hopper forward's consumer warpgroups taking turns for
# their GEMMs (FLASHATTN_CUDA_PINGPONG=1, the default) against issuing them freely (=0). Build;
# the dense and paged grids with turns (quick); then TFLOP/s of both settings shape by shape, one after the other, at
# FlashAttention's shapes (batch x seq = 16k, hidden 2048): bf16 d64 and d128, e4m3 d128, causal
# and not. JSON lines to $OUT/pingpong.jsonl (or build/). Carry .devdeps (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_pingpong.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
device_configure "$out/cmake_pp.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn_cli test_conformance test_paged > "$out/build_pp.log" 2>&1 ||
  { grep -E "error" "$out/build_pp.log" | head -20; exit 1; }
echo "build ok"
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
FLASHATTN_CUDA_PINGPONG=1 timeout 200 ./build/tests/test_conformance > "$out/conformance_pp.log" 2>&1
echo "conformance (turns) rc=$?"; grep -E "FAILED|cases," "$out/conformance_pp.log" | head
FLASHATTN_CUDA_PINGPONG=1 timeout 100 ./build/tests/test_paged > "$out/paged_pp.log" 2>&1
echo "paged (turns) rc=$?"; grep -E "FAILED|cases" "$out/paged_pp.log" | head -3
unset FLASHATTN_TEST_BACKEND FLASHATTN_TEST_QUICK
rm -f "$out/pingpong.jsonl"
for shape in bf16:128:4:4096 bf16:128:1:16384 e4m3:128:4:4096 e4m3:128:1:16384 bf16:64:4:4096 bf16:64:1:16384; do
  IFS=: read -r dt d b s <<< "$shape"
  for pp in 0 1; do
    FLASHATTN_CUDA_PINGPONG=$pp ./build/flashattn bench --backend cuda --dtype "$dt" --batch "$b" --seq "$s" \
      --heads $((2048 / d)) --dim "$d" --causal both --no-standard --json /tmp/pp_row.jsonl > /dev/null &&
      sed "s/^{/{\"pingpong\": $pp, /" /tmp/pp_row.jsonl >> "$out/pingpong.jsonl"
  done
done
python3 - "$out/pingpong.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(f"pingpong={r['pingpong']} {r['dtype']:5} d{r['head_dim']} b{r['batch']} s{r['seq_q']:<6} "
          f"{'causal' if r['causal'] else '      '} {r['gflops'] / 1000:7.1f} TFLOP/s  {r['kernel']}")
PY
