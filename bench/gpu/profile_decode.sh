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
. bench/gpu/device_env.sh
device_library "$out" || exit 1
[ $# -gt 0 ] || set -- 32x16384x8 32x16384x32
for c in "$@"; do
  # the first launches of our kernels and cuDNN's (the warm-up calls)
  ncu --clock-control none --kernel-name-base demangled -k 'regex:decode_kernel|decode_sm90|combine_kernel|sdpa|fprop|fmha|flash' \
    --launch-count 10 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section SourceCounters python3 bench/gpu/decode.py --case "$c" --reps 1 --inner 1 > "$out/ncu_$c.txt" 2>&1
  echo "$c: rc=$? $(grep -c '^  [a-z_].*(' "$out/ncu_$c.txt") kernels profiled -> $out/ncu_$c.txt"
done
