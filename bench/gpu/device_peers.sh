#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: the CUDA grids, then flashattn beside cuDNN and
# FlashAttention-4 (issue 22's table). Install FA4 from the wheels staged by an earlier call
# (bench/gpu/device_fa4.sh stage, carrying .fa4/1; this call carries .fa4/2 and .devdeps);
# build the library, tool and tests; the paged and dense CUDA grids (quick; the dense one once
# more with e4m3 alone) and the paged grid under compute-sanitizer racecheck; then
# bench/gpu/attention.py (forward and forward+backward, d64 and d128) with FA4 as a peer.
# Logs and attention.jsonl to $OUT (or build/).
#   bench/gpu/device_peers.sh
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
bash bench/gpu/device_fa4.sh install > "$out/fa4_install.log" 2>&1 || { tail -5 "$out/fa4_install.log"; echo "no FA4"; }
stamp "fa4 install done"
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
device_configure "$out/cmake_peers.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn flashattn_cli test_paged test_conformance \
  > "$out/build_peers.log" 2>&1 || { grep -E "error" "$out/build_peers.log" | head -20; exit 1; }
stamp "build ok"
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
timeout 150 ./build/tests/test_paged > "$out/paged_cuda.log" 2>&1
stamp "paged_cuda rc=$?"; grep -E "FAILED|cases|seed" "$out/paged_cuda.log" | head -8
timeout 200 ./build/tests/test_conformance > "$out/conformance_cuda.log" 2>&1
stamp "conformance_cuda rc=$?"; grep -E "FAILED|cases|seed" "$out/conformance_cuda.log" | head -8
FLASHATTN_TEST_DTYPE=e4m3 timeout 100 ./build/tests/test_conformance > "$out/conformance_e4m3.log" 2>&1
stamp "conformance e4m3 rc=$?"; grep -E "FAILED|cases" "$out/conformance_e4m3.log" | head -4
unset FLASHATTN_TEST_QUICK
PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages timeout 330 python3 bench/gpu/attention.py \
  --reps 15 --json "$out/attention.jsonl" > "$out/attention.log" 2>&1
stamp "attention rc=$?"; cat "$out/attention.log" | tail -40
FLASHATTN_TEST_QUICK=1 timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 ./build/tests/test_paged \
  > "$out/racecheck_paged.log" 2>&1
stamp "racecheck paged rc=$?"; grep -hE "RACECHECK SUMMARY|FAILED|Error" "$out/racecheck_paged.log" | head -6 || true
