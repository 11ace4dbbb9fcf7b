#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sweep the CPU planner's tile sizes (query rows per task x keys per tile) on a few
# shapes and print GFLOP/s per pair: the measurements behind src/cpu/plan.c.
# usage: bench/cpu_tile_sweep.sh [build/flashattn]
set -euo pipefail
fa=${1:-build/flashattn}
shapes=(
  "--seq 512 --heads 8 --dim 64 --causal yes"
  "--seq 2048 --heads 8 --dim 64 --causal yes"
  "--seq 2048 --heads 32 --dim 128 --causal no"
  "--seq 4096 --heads 8 --dim 128 --causal yes"
)
printf "%-46s %7s %7s %9s\n" shape block_q block_k GFLOP/s
for s in "${shapes[@]}"; do
  for bq in 32 64 96 128 192 256; do
    for bk in 64 128 256 512; do
      g=$(FLASHATTN_CPU_BLOCK_Q=$bq FLASHATTN_CPU_BLOCK_K=$bk "$fa" bench $s --no-standard \
          --no-sgemm --reps 3 --json - 2>/dev/null | sed -n 's/.*"gflops":\([0-9.]*\).*/\1/p')
      printf "%-46s %7d %7d %9.1f\n" "$s" "$bq" "$bk" "$g"
    done
  done
done
