#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a CUDA machine: where compute-sanitizer racecheck's hazard reports point. Builds the
# library and grids with line information (-lineinfo, in build-lineinfo), runs racecheck on
# the quick grids named (backward: every 16th case; forward: every 12th; paged: every 8th),
# and prints each grid's reports as pairs of source lines (a write and the access it races
# with, each with its function) and the hazards counted, most first (racecheck's cap on the
# count raised to 10^8): the list to check against each kernel's mbarrier orderings
# (bench/gpu/ordering_check.sh shows the Q/dO, Q buffer and decode stage orderings are
# needed). LIB_DIR=dir runs a library and tests already built with -lineinfo there instead
# (libflashattn.so, test_backward, test_conformance, test_paged). Logs go to $OUT (or
# build-lineinfo/).
#   bench/gpu/racecheck_map.sh [backward|forward|paged]...   (none: all three)
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
for g in "$@"; do
  case $g in backward|forward|paged) ;; *) echo "$0: grids are backward, forward or paged, not '$g' (see --help)" >&2; exit 2 ;; esac
done
cd "$(dirname "$0")/../.."
. bench/gpu/device_env.sh
out=${OUT:-build-lineinfo}
mkdir -p "$out"
if [ -n "${LIB_DIR:-}" ]; then
  bin=$LIB_DIR
  export LD_LIBRARY_PATH=$PWD/$bin:$LD_LIBRARY_PATH
else
  cmake -S . -B build-lineinfo -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-lineinfo -DFA_WITH_CUDA=ON \
    -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=OFF -DFA_BUILD_TESTS=ON -DOPENBLAS_LIB=$blas/libopenblas.so \
    -DCBLAS_INCLUDE=/usr/include/x86_64-linux-gnu/openblas-pthread > "$out/lineinfo_cmake.log" 2>&1 ||
    { tail -20 "$out/lineinfo_cmake.log"; exit 1; }
  cmake --build build-lineinfo -j "$(nproc)" --target test_backward test_conformance test_paged \
    > "$out/lineinfo_build.log" 2>&1 || { grep -E "error" "$out/lineinfo_build.log" | head -20; exit 1; }
  bin=build-lineinfo/tests
fi
# pairs of source lines from racecheck's analysis reports, counted
summarise() {
  python3 - "$1" <<'PY'
import collections, re, sys
# "Race reported between Write access at FUNCTION+0xOFF in FILE:LINE", then one
# "and Read access at FUNCTION+0xOFF in FILE:LINE [N hazards]" line per instruction
access = re.compile(r'(Write|Read) access at (.*?)\+0x[0-9a-f]+ in (?:\S*/)?([^/\s:]+):(\d+)(?:\s*\[(\d+) hazards?\])?')
name = lambda f: re.sub(r'[(<].*', '', re.sub(r'^void |<unnamed>::', '', f))[:48]
pairs, first = collections.Counter(), None
for line in open(sys.argv[1], errors='replace'):
    m = access.search(line)
    if 'Race reported between' in line:
        first = m and (f"{m.group(1)} {m.group(3)}:{m.group(4)}", name(m.group(2)))
    elif first and m and 'and ' in line:
        key = f"{first[0]} ({first[1]}) <-> {m.group(1)} {m.group(3)}:{m.group(4)} ({name(m.group(2))})"
        pairs[key] += int(m.group(5)) if m.group(5) else 1
for key, hazards in pairs.most_common():
    print(f"{hazards:9d}  {key}")
print(f"{len(pairs)} pairs of lines, {sum(pairs.values())} hazards")
PY
}
# racecheck stops counting at 10M hazards by default (its warning says so): far more here, so
# that every pair of lines is reached (at 10^9 racecheck itself stopped mid-way through the
# backward grid, exit status 9, on an H100; 10^8 finishes)
export NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS=${NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS:-100000000}
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
[ $# -gt 0 ] || set -- backward forward paged
for g in "$@"; do
  case $g in backward) test=test_backward every=16 ;; forward) test=test_conformance every=12 ;; paged) test=test_paged every=8 ;; esac
  FLASHATTN_TEST_EVERY=$every timeout 300 compute-sanitizer --tool racecheck --racecheck-report analysis \
    --print-limit 100000 "$bin/$test" > "$out/racecheck_map_$g.log" 2>&1
  echo "$g: rc=$? $(grep -hE "RACECHECK SUMMARY" "$out/racecheck_map_$g.log" | tail -1)"
  summarise "$out/racecheck_map_$g.log"
done
