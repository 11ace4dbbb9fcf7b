#!/usr/bin/env bash
# Nsight Compute profile of decode: flashattn's paged and dense decode kernels beside cuDNN's
# on one bench/gpu/decode.py case, the sections that say where a memory-bound kernel loses
# (throughput, occupancy, warp stalls, the top stalling instructions). On a CUDA machine:
#   bench/gpu/profile_decode.sh [CASE ...]     CASE = BATCHxKVxHEADS_KV (default 32x16384x8 32x16384x32)
# Builds the library alone into build/ when build/libflashattn.so is missing; reports go to $OUT
# (or build/), one text file per case.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
if [ ! -f build/libflashattn.so ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=OFF \
    -DFA_BUILD_TESTS=OFF > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
  cmake --build build -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head; exit 1; }
fi
[ $# -gt 0 ] || set -- 32x16384x8 32x16384x32
for c in "$@"; do
  # the first launches of our kernels and cuDNN's (the warm-up calls)
  ncu --clock-control none --kernel-name-base demangled -k 'regex:decode_kernel|decode_sm90|combine_kernel|sdpa|fprop|fmha|flash' \
    --launch-count 10 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section SourceCounters python3 bench/gpu/decode.py --case "$c" --reps 1 --inner 1 > "$out/ncu_$c.txt" 2>&1
  echo "$c: rc=$? $(grep -c '^  [a-z_].*(' "$out/ncu_$c.txt") kernels profiled -> $out/ncu_$c.txt"
done
