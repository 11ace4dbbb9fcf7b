#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# First-call latency of the GLES backend: the wall time of `flashattn bench --backend gles`
# on a short call (64 queries, 64 keys, one head), per head_dim and dtype:
#   cold     every shader cache empty (a new Mesa shader cache and program-binary folder):
#            what a process pays on a machine's first call for that head_dim;
#   binaries a new Mesa shader cache, flashattn's program binaries kept (drivers without a
#            shader cache of their own, or with it disabled);
#   warm     both kept.
# usage: bench/gles_first_call.sh [build dir] [dims] [dtypes]
set -euo pipefail
build=${1:-build}
dims=${2:-64 128}
dtypes=${3:-f32 f16}
bin="$build/flashattn"
[ -x "$bin" ] || { echo "no $bin: build first (make build)"; exit 1; }
now() { date +%s.%N; }
printf '%-8s %-5s %9s %9s %9s\n' head_dim dtype cold_s binaries_s warm_s
for d in $dims; do
  for t in $dtypes; do
    cache=$(mktemp -d)
    run() {
      MESA_SHADER_CACHE_DIR=$cache/$1 FLASHATTN_CACHE_DIR=$cache/fa "$bin" bench --backend gles \
        --seq 64 --heads 1 --dim "$d" --dtype "$t" --causal yes --reps 1 --no-standard --no-sgemm \
        >/dev/null
    }
    t0=$(now); run mesa; t1=$(now); run mesa2; t2=$(now); run mesa2; t3=$(now)
    awk -v d="$d" -v t="$t" -v a="$t0" -v b="$t1" -v c="$t2" -v e="$t3" \
      'BEGIN { printf "%-8s %-5s %9.1f %9.1f %9.1f\n", d, t, b - a, c - b, e - c }'
    rm -rf "$cache"
  done
done
