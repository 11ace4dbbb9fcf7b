#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a CUDA machine, in one go: the runner's CUDA engine end to end. Build the tool and the
# engine test, then test_engine (CUDA against the float32 CPU run, graph replay against plain
# launches), generate and bench-serve on cuda, bench-model with graphs on and off (quick);
# bench-serve's 512-request workload and transformers beside it, hf_peer.py (serve); or both
# (all). Logs and JSON lines go to $OUT (or build/). Carry .devdeps (bench/gpu/fetch_debs.sh).
#   bench/gpu/device_runner.sh [quick|serve|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
level=${1:-quick}
mkdir -p "$out"
. bench/gpu/device_env.sh
device_configure "$out/cmake_runner.log" || exit 1
cmake --build build -j "$(nproc)" --target flashattn_cli test_engine > "$out/build_runner.log" 2>&1 ||
  { grep -E "error" "$out/build_runner.log" | head -20; exit 1; }
echo "build ok"
F=./build/flashattn
if [ "$level" != serve ]; then
timeout 300 ./build/tests/test_engine > "$out/engine_cuda.log" 2>&1; echo "test_engine rc=$?"
grep -E "OK|FAILED|SKIP|PASSED|captured|ids|logits" "$out/engine_cuda.log" | head -30
for g in on off; do
  timeout 60 $F generate --backend cuda --prompt "Once upon a time" --steps 64 --temperature 0 --ids --graphs $g \
    > "$out/generate_$g.log" 2>&1; echo "generate --graphs $g rc=$?"; tail -3 "$out/generate_$g.log"
done
cmp -s <(grep ids: "$out/generate_on.log") <(grep ids: "$out/generate_off.log") && echo "generate: same ids with graphs on and off"
timeout 120 $F bench-serve --backend cuda --requests 32 --prompt-len 2,40 --output-len 4,60 --max-batch 8 \
  --token-budget 64 2>/dev/null | tail -8
timeout 300 $F bench-model --backend cuda --config 7b --prompt-len 512 --decode 64 --batch 1,8,32 2>/dev/null |
  tee "$out/bench_model_7b.txt"
timeout 120 $F bench-model --backend cuda --config 7b --prompt-len 512 --decode 64 --batch 1 --graphs off 2>/dev/null |
  tail -3
for P in 2048 8192; do
  timeout 120 $F bench-model --backend cuda --config 7b --prompt-len $P --decode 8 --batch 1 2>/dev/null | tail -2
done
timeout 300 $F bench-model --backend cuda --config llama3-8b --prompt-len 512 --decode 64 --batch 1,32 2>/dev/null |
  tee "$out/bench_model_l3.txt"
fi
[ "$level" = quick ] && exit 0
# the serving comparison: bench-serve's workload, then transformers' static batching on the same lengths
timeout 400 $F bench-serve --backend cuda --config 7b --requests 512 --prompt-len 128,2048 --output-len 64,512 \
  --max-batch 64 --token-budget 4096 --json "$out/serve_7b.json" 2>"$out/serve_7b.progress" | tail -12
PYTHONUNBUFFERED=1 timeout 400 python3 bench/gpu/hf_peer.py --config 7b --serve-batches 2 \
  --json "$out/hf_peer_7b.jsonl" 2>&1 | tail -12
