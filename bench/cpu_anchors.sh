#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The shapes of ../shared/anchors.md's CPU table (llama.cpp flash attention and
# unfused PyTorch on this machine class), each beside standard attention and the
# sgemm ceiling measured in the same process. Prints the table rows and writes
# JSON lines to ${OUT:-build}/cpu_anchors.jsonl.
# usage: bench/cpu_anchors.sh [build/flashattn]
set -euo pipefail
fa=${1:-build/flashattn}
out=${OUT:-build}/cpu_anchors.jsonl
: >"$out"
run() { "$fa" bench "$@" --json - 2>/dev/null | tee -a "$out" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    sp = "%.2fx" % r["speedup"] if r["speedup"] else "-"
    print("%-20s h%-3d sq%-5d sk%-5d d%-4d %-4s causal=%-5s flash %9.3f ms  std %9s ms  %6s  %6.1f GFLOP/s  (%3.0f%% of sgemm %.0f)  max_err %.1e  rel_l2 %.1e" % (
        r["kernel"], r["heads"], r["seq_q"], r["seq_k"], r["head_dim"], r["dtype"], r["causal"],
        r["ms_flash"], "%.3f" % r["ms_standard"] if r["ms_standard"] else "-", sp, r["gflops"],
        100 * r["gflops"] / r["sgemm_gflops"], r["sgemm_gflops"], r["max_abs_err"], r["rel_l2_err"]))
'; }
for dt in f32 f16; do
  run --seq 1024 --heads 8 --dim 64 --causal yes --dtype $dt
  run --seq 2048 --heads 8 --dim 64 --causal yes --dtype $dt
  run --seq 2048 --heads 8 --dim 128 --causal yes --dtype $dt
  run --seq 2048 --heads 32 --dim 128 --causal no --dtype $dt
  run --seq-q 1 --seq 4096 --heads 32 --dim 128 --causal no --dtype $dt
  run --seq-q 1 --seq 4096 --heads 32 --dim 128 --causal no --dtype $dt --layout bhsd
done
