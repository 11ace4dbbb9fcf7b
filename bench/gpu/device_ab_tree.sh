#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: an A/B of this tree's CUDA library against another source
# tree's, for a kernel change that has no switch. Here, first:
#   rm -rf .ab_base && mkdir .ab_base && git archive REF | tar -x -m -C .ab_base
# then there (carry .ab_base and .devdeps):
#   bench/gpu/device_ab_tree.sh [attention.py options]     (default: --dims 64,128 --quick)
# Builds both libraries side by side (.ab_base into build-ab-base/, library only), runs the
# dense, backward and paged CUDA grids on this tree's (quick), then the forward of both,
# alternating base, new, base, new (attention.py --no-peers --no-backward). JSON lines to
# $OUT/ab_tree.jsonl (or build/), each with "lib": "base" or "new". Both libraries are driven
# through this tree's bench/gpu/flashattn_ctypes.py: REF must have the same public structs.
# Exits 1 when a grid or a run fails (the A/B still runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
[ -f .ab_base/CMakeLists.txt ] || { echo "device_ab_tree.sh: no .ab_base tree (see the header)" >&2; exit 2; }
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf build-ab-base # never a build of another REF
cmake -S .ab_base -B build-ab-base -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF \
  -DFA_BUILD_TOOLS=OFF -DFA_BUILD_TESTS=OFF > "$out/cmake_ab_base.log" 2>&1 || { tail "$out/cmake_ab_base.log"; exit 1; }
device_configure "$out/cmake_ab_new.log" || exit 1
cmake --build build-ab-base -j 8 --target flashattn > "$out/build_ab_base.log" 2>&1 &
base=$!
cmake --build build -j 8 --target flashattn test_conformance test_backward test_paged > "$out/build_ab_new.log" 2>&1 ||
  { grep -E "error" "$out/build_ab_new.log" | head -20; kill $base; wait $base; exit 1; }
wait $base || { grep -E "error" "$out/build_ab_base.log" | head -20; exit 1; }
stamp "builds ok"
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
fail=0
for t in conformance backward paged; do
  timeout 200 ./build/tests/test_$t > "$out/${t}_ab_tree.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || fail=1
  stamp "$t rc=$rc"; grep -E "FAILED|cases" "$out/${t}_ab_tree.log" | head -5
done
unset FLASHATTN_TEST_BACKEND FLASHATTN_TEST_QUICK
[ $# -gt 0 ] || set -- --dims 64,128 --quick
rm -f "$out/ab_tree.jsonl"
for round in 1 2; do
  for lib in base new; do
    so=build/libflashattn.so
    [ $lib = base ] && so=build-ab-base/libflashattn.so
    rm -f /tmp/ab_tree.jsonl
    if timeout 200 python3 bench/gpu/attention.py --lib "$so" --no-peers --no-backward --json /tmp/ab_tree.jsonl "$@" \
      > "$out/attention_${lib}_$round.log" 2>&1; then
      sed "s/^{/{\"lib\": \"$lib\", \"round\": $round, /" /tmp/ab_tree.jsonl >> "$out/ab_tree.jsonl"
    else
      fail=1; stamp "attention $lib round $round failed (its rows left out)"; tail -5 "$out/attention_${lib}_$round.log"
    fi
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
keys = (("base", 1), ("base", 2), ("new", 1), ("new", 2))
print("d   mask    seq     base 1  base 2   new 1   new 2   new/base (means of the rounds there)")
for (d, c, s), v in sorted(rows.items()):
    b = [v[k] for k in keys[:2] if k in v]
    n = [v[k] for k in keys[2:] if k in v]
    cells = " ".join(f"{v[k]:7.1f}" if k in v else "    n/a" for k in keys)
    ratio = f"{(sum(n) / len(n)) / (sum(b) / len(b)):.3f}" if b and n else "n/a"
    print(f"{d:<3} {'causal' if c else 'none':7} {s:<6} {cells}   {ratio}")
PY
exit $fail
