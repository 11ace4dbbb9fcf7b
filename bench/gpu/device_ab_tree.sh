#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine, in one go: an A/B of this tree's CUDA library against other source
# trees', for kernel changes that have no switch. Here, first, one folder a tree:
#   rm -rf .ab_base && mkdir .ab_base && git archive REF | tar -x -m -C .ab_base
# (more as .ab_NAME, for instance the steps between REF and this tree), then there (carry
# them and .devdeps):
#   [AB_TREES=".ab_base .ab_step"] bench/gpu/device_ab_tree.sh [attention.py options]
# (default: AB_TREES=.ab_base; --dims 64,128 --quick). Builds every library side by side
# (.ab_NAME into build-ab-NAME/, library only), runs the dense, backward and paged CUDA grids
# on this tree's (quick), then the forward of each, every tree in turn and then again
# (attention.py --no-peers --no-backward; AB_BACKWARD=1 times fwd+bwd too, and the table
# gives it beside the forward). JSON lines to $OUT/ab_tree.jsonl (or build/), each
# with "lib": NAME or "new"; the table gives each over the first tree. Every library is driven
# through this tree's bench/gpu/flashattn_ctypes.py: the trees must have the same public
# structs. Exits 1 when a grid or a run fails (the A/B still runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
trees=${AB_TREES:-.ab_base}
names=()
for tr in $trees; do
  case $tr in .ab_*/* | .ab_ | .ab_new) tr= ;; .ab_*) ;; *) tr= ;; esac
  [ -n "$tr" ] || { echo "device_ab_tree.sh: AB_TREES names folders .ab_NAME (NAME not new) in the repository root" >&2; exit 2; }
  [ -f "$tr/CMakeLists.txt" ] || { echo "device_ab_tree.sh: no source tree in $tr (see the header)" >&2; exit 2; }
  names+=("${tr#.ab_}")
done
. bench/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
jobs=$(( $(nproc) / (${#names[@]} + 1) ))
[ "$jobs" -ge 1 ] || jobs=1
pids=()
for tr in $trees; do
  n=${tr#.ab_}
  rm -rf "build-ab-$n" # never a build of another tree
  cmake -S "$tr" -B "build-ab-$n" -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF \
    -DFA_BUILD_TOOLS=OFF -DFA_BUILD_TESTS=OFF > "$out/cmake_ab_$n.log" 2>&1 || { tail "$out/cmake_ab_$n.log"; exit 1; }
  cmake --build "build-ab-$n" -j "$jobs" --target flashattn > "$out/build_ab_$n.log" 2>&1 &
  pids+=($!)
done
stop_builds() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
device_configure "$out/cmake_ab_new.log" || { stop_builds; exit 1; }
cmake --build build -j "$jobs" --target flashattn test_conformance test_backward test_paged > "$out/build_ab_new.log" 2>&1 ||
  { grep -E "error" "$out/build_ab_new.log" | head -20; stop_builds; exit 1; }
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { grep -E "error" "$out/build_ab_${names[$i]}.log" | head -20; stop_builds; exit 1; }
done
stamp "builds ok"
fail=0
device_grids "$out" ab_tree || fail=1
stamp "grids done"
[ $# -gt 0 ] || set -- --dims 64,128 --quick
rm -f "$out/ab_tree.jsonl"
for round in 1 2; do
  for lib in "${names[@]}" new; do
    so=build/libflashattn.so
    [ $lib = new ] || so=build-ab-$lib/libflashattn.so
    rm -f /tmp/ab_tree.jsonl
    if timeout 200 python3 bench/gpu/attention.py --lib "$so" --no-peers \
      $([ "${AB_BACKWARD:-0}" = 1 ] || echo --no-backward) --json /tmp/ab_tree.jsonl "$@" \
      > "$out/attention_${lib}_$round.log" 2>&1; then
      sed "s/^{/{\"lib\": \"$lib\", \"round\": $round, /" /tmp/ab_tree.jsonl >> "$out/ab_tree.jsonl"
    else
      fail=1; stamp "attention $lib round $round failed (its rows left out)"; tail -5 "$out/attention_${lib}_$round.log"
    fi
  done
done
stamp "A/B done"
python3 - "$out/ab_tree.jsonl" "${names[@]}" new <<'PY'
import json, sys, collections
libs = sys.argv[2:]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for r in (json.loads(l) for l in open(sys.argv[1])):
    for part in ("fwd", "fwdbwd"):
        if f"flashattn_{part}_tflops" in r:  # not attention.py's memory line
            rows[(r["d"], r["causal"], r["seq"], part)][r["lib"]].append(r[f"flashattn_{part}_tflops"])
print("TFLOP/s, the rounds' mean (each lib over the first in brackets)")
print("d   mask    seq    part  " + "".join(f"{x[:14]:>24}" for x in libs))
for (d, c, s, part), v in sorted(rows.items()):
    mean = {x: sum(v[x]) / len(v[x]) for x in libs if v[x]}
    first = mean.get(libs[0])
    cells = "".join(f"{mean[x]:15.1f} ({mean[x] / first:5.3f})" if x in mean and first else f"{'n/a':>24}"
                    for x in libs)
    print(f"{d:<3} {'causal' if c else 'none':7} {s:<6} {part:6}{cells}")
PY
exit $fail
