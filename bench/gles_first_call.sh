#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# First-call latency of the GLES backend: `flashattn bench --backend gles` on a short call
# (64 queries, 64 keys), per head_dim and dtype, with every shader cache empty (a new Mesa
# shader cache and program-binary folder), then again with them warm. The difference is
# the shader compile a process pays on a device's first call for that head_dim.
# usage: bench/gles_first_call.sh [build dir] [dims] [dtypes]
set -euo pipefail
build=${1:-build}
dims=${2:-64 128}
dtypes=${3:-f32 f16}
bin="$build/flashattn"
[ -x "$bin" ] || { echo "no $bin: build first (make build)"; exit 1; }
now() { date +%s.%N; }
printf '%-6s %-5s %10s %10s\n' head_dim dtype cold_s warm_s
for d in $dims; do
  for t in $dtypes; do
    cache=$(mktemp -d)
    run() {
      MESA_SHADER_CACHE_DIR=$cache/mesa FLASHATTN_CACHE_DIR=$cache/fa "$bin" bench --backend gles \
        --seq 64 --heads 1 --dim "$d" --dtype "$t" --causal yes --reps 1 --no-standard --no-sgemm \
        >/dev/null
    }
    t0=$(now); run; t1=$(now); run; t2=$(now)
    awk -v d="$d" -v t="$t" -v a="$t0" -v b="$t1" -v c="$t2" \
      'BEGIN { printf "%-8s %-5s %10.1f %10.1f\n", d, t, b - a, c - b }'
    rm -rf "$cache"
  done
done
