#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: an A/B of this tree's CUDA library against another source
# tree's, for a kernel change that has no switch. Here, first:
#   rm -rf .ab_base && mkdir .ab_base && git archive REF | tar -x -C .ab_base
# then there (carry .ab_base and .devdeps):
#   bench/gpu/device_ab_tree.sh [attention.py options]     (default: --dims 64,128 --quick)
# Builds both libraries side by side (.ab_base into build-ab-base/, library only), runs the
# dense and paged CUDA grids on this tree's (quick), then the forward of both, alternating
# base, new, base, new (attention.py --no-peers --no-backward). JSON lines to $OUT/ab_tree.jsonl
# (or build/), each with "lib": "base" or "new".
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
[ -f .ab_base/CMakeLists.txt ] || { echo "device_ab_tree.sh: no .ab_base tree (see the header)" >&2; exit 2; }
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cmake -S .ab_base -B build-ab-base -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF \
  -DFA_BUILD_TOOLS=OFF -DFA_BUILD_TESTS=OFF > "$out/cmake_ab_base.log" 2>&1 || { tail "$out/cmake_ab_base.log"; exit 1; }
device_configure "$out/cmake_ab_new.log" || exit 1
cmake --build build-ab-base -j 8 --target flashattn > "$out/build_ab_base.log" 2>&1 &
base=$!
cmake --build build -j 8 --target flashattn test_conformance test_paged > "$out/build_ab_new.log" 2>&1 ||
  { grep -E "error" "$out/build_ab_new.log" | head -20; exit 1; }
wait $base || { grep -E "error" "$out/build_ab_base.log" | head -20; exit 1; }
stamp "builds ok"
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
timeout 200 ./build/tests/test_conformance > "$out/conformance_ab_tree.log" 2>&1
stamp "conformance rc=$?"; grep -E "FAILED|cases," "$out/conformance_ab_tree.log" | head
timeout 100 ./build/tests/test_paged > "$out/paged_ab_tree.log" 2>&1
stamp "paged rc=$?"; grep -E "FAILED|cases" "$out/paged_ab_tree.log" | head -3
unset FLASHATTN_TEST_BACKEND FLASHATTN_TEST_QUICK
[ $# -gt 0 ] || set -- --dims 64,128 --quick
rm -f "$out/ab_tree.jsonl"
for round in 1 2; do
  for lib in base new; do
    so=build/libflashattn.so
    [ $lib = base ] && so=build-ab-base/libflashattn.so
    timeout 200 python3 bench/gpu/attention.py --lib "$so" --no-peers --no-backward --json /tmp/ab_tree.jsonl "$@" \
      > "$out/attention_${lib}_$round.log" 2>&1 || { stamp "attention $lib failed"; tail -5 "$out/attention_${lib}_$round.log"; }
    sed "s/^{/{\"lib\": \"$lib\", \"round\": $round, /" /tmp/ab_tree.jsonl >> "$out/ab_tree.jsonl"
    rm -f /tmp/ab_tree.jsonl
  done
done
stamp "A/B done"
python3 - "$out/ab_tree.jsonl" <<'PY'
import json, sys, collections
rows = collections.defaultdict(dict)
for r in (json.loads(l) for l in open(sys.argv[1])):
    if "flashattn_fwd_tflops" not in r:  # attention.py's memory line
        continue
    rows[(r["d"], r["causal"], r["seq"])][(r["lib"], r["round"])] = r["flashattn_fwd_tflops"]
print("d   mask    seq     base 1  base 2   new 1   new 2   new/base")
for (d, c, s), v in sorted(rows.items()):
    b = [v.get(("base", i), 0) for i in (1, 2)]
    n = [v.get(("new", i), 0) for i in (1, 2)]
    print(f"{d:<3} {'causal' if c else 'none':7} {s:<6} " + " ".join(f"{x:7.1f}" for x in b + n)
          + f"   {sum(n) / max(sum(b), 1e-9):.3f}")
PY
