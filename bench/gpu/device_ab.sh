#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: an A/B of one of the CUDA backend's switches, for instance
#   bench/gpu/device_ab.sh FLASHATTN_CUDA_PINGPONG 0 1    (the consumer warpgroups' turns)
#   bench/gpu/device_ab.sh FLASHATTN_CUDA_SLACK -1 8      (the forward's conditional rescale)
#   bench/gpu/device_ab.sh FLASHATTN_CUDA_SLACK_E4M3 -1 8 (the same in the fp8 forward)
# Build; the dense, backward and paged grids with VAR=B (quick; the exit status 1 if one
# fails); then TFLOP/s of both settings shape by shape, one right after the other, at
# FlashAttention's shapes (batch x seq = 16k, hidden 2048): bf16 d64 and d128, e4m3 d128,
# causal and not (AB_SHAPES="DTYPE:DIM:BATCH:SEQ ..." others; AB_BACKWARD=1 times the backward
# too). JSON lines to $OUT/ab.jsonl (or build/), each
# with "ab": "VAR=value". Carry .devdeps (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_ab.sh VAR A B
#   AB_SHAPES="bf16:256:16:1024 bf16:128:8:2048" AB_BACKWARD=1 \
#     bench/gpu/device_ab.sh FLASHATTN_CUDA_BWD_ORDER key head  (the backward's block order)
#   AB_SHAPES="bf16:64:4:4096 bf16:128:4:4096 bf16:256:4:4096 bf16:128:16:1024" AB_BACKWARD=1 \
#     bench/gpu/device_ab.sh FLASHATTN_CUDA_BWD_TMA 0 1          (the backward's TMA loader)
#   (the same shapes) bench/gpu/device_ab.sh FLASHATTN_CUDA_BWD_UNORDERED 0 1   (what the dQ
#     adds' order costs; the backward's determinism test fails with it, by design)
#   (the same shapes) bench/gpu/device_ab.sh FLASHATTN_CUDA_BWD_SCHED first stagger  (the
#     backward's staggered starts without a mask)
#   AB_SHAPES="bf16:64:1:16384 bf16:128:1:16384 bf16:256:1:16384 bf16:256:2:8192" AB_BACKWARD=1 \
#     bench/gpu/device_ab.sh FLASHATTN_CUDA_BWD_SCHED stagger groups   (staggered in groups
#     where a sequence's key tiles pass half the device)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: bench/gpu/device_ab.sh VAR A B" >&2; exit 2; }
var=$1 a=$2 b=$3
out=${OUT:-build}
mkdir -p "$out"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
device_configure "$out/cmake_ab.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn_cli test_conformance test_backward test_paged > "$out/build_ab.log" 2>&1 ||
  { grep -E "error" "$out/build_ab.log" | head -20; exit 1; }
echo "build ok"
fail=0
device_grids "$out" ab "$var=$b" || fail=1
rm -f "$out/ab.jsonl"
for shape in ${AB_SHAPES:-bf16:128:4:4096 bf16:128:1:16384 e4m3:128:4:4096 e4m3:128:1:16384 bf16:64:4:4096 bf16:64:1:16384}; do
  IFS=: read -r dt d bt s <<< "$shape"
  for x in "$a" "$b"; do
    rm -f /tmp/ab_row.jsonl
    env "$var=$x" ./build/flashattn bench --backend cuda --dtype "$dt" --batch "$bt" --seq "$s" \
      --heads $((2048 / d)) --dim "$d" --causal both --no-standard $([ "${AB_BACKWARD:-0}" = 1 ] && echo --backward) \
      --json /tmp/ab_row.jsonl > /dev/null &&
      sed "s/^{/{\"ab\": \"$var=$x\", /" /tmp/ab_row.jsonl >> "$out/ab.jsonl"
  done
done
python3 - "$out/ab.jsonl" <<'PY'
import json, sys
for r in (json.loads(l) for l in open(sys.argv[1])):
    bwd = f"  backward {r['gflops_backward'] / 1000:7.1f}" if "gflops_backward" in r else ""
    print(f"{r['ab']:28} {r['dtype']:5} d{r['head_dim']} b{r['batch']} s{r['seq_q']:<6} "
          f"{'causal' if r['causal'] else '      '} {r['gflops'] / 1000:7.1f} TFLOP/s{bwd}  {r['kernel']}")
PY
exit $fail
