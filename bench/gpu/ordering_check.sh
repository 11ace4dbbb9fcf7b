#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine: the racecheck hazards reported in the forward grids are all in the Hopper
# decode kernel (decode_sm90.cu): its loaders' bulk copies and zero stores against its consumers'
# ldmatrix reads, ordered by each stage's full and empty mbarriers, which racecheck does not
# model (docs/perf/h200.md). This shows each ordering is needed: a test build
# (-DFA_CUDA_ORDERING_TEST=ON, in build-ordering) runs the quick paged grid as built, which must
# pass with paged-decode-sm90 cases in it, then without the loaders' empty waits
# (FLASHATTN_CUDA_DROP_ORDERING=1; its consumers then sleep 10 us a stage, so that the loaders
# run a ring's length ahead, as they may on a busy machine; at full speed the grid passed
# without these waits) and without the consumers' full waits (=2), each of which must fail
# or stop (60 s). Logs go to $OUT (or build-ordering/).
#   bench/gpu/ordering_check.sh
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; "") ;; *)
  echo "$0: takes no arguments (see --help)" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
# cmocka and OpenBLAS where the machine has no package manager: debs carried in .devdeps
if [ -d .devdeps ] && ! ls /usr/lib/x86_64-linux-gnu/libcmocka.so /usr/lib/x86_64-linux-gnu/openblas-pthread >/dev/null 2>&1; then
  for f in .devdeps/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
out=${OUT:-build-ordering}
mkdir -p "$out"
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
export LD_LIBRARY_PATH=$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake -S . -B build-ordering -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_CUDA_ORDERING_TEST=ON \
  -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=OFF -DOPENBLAS_LIB=$blas/libopenblas.so \
  -DCBLAS_INCLUDE=/usr/include/x86_64-linux-gnu/openblas-pthread > "$out/ordering_cmake.log" 2>&1 ||
  { tail -20 "$out/ordering_cmake.log"; exit 1; }
cmake --build build-ordering -j "$(nproc)" --target test_paged > "$out/ordering_build.log" 2>&1 ||
  { grep -E "error" "$out/ordering_build.log" | head -20; exit 1; }
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
timeout 120 ./build-ordering/tests/test_paged > "$out/ordering_0.log" 2>&1
rc=$?
line=$(grep -E "paged cases" "$out/ordering_0.log")
echo "as built: rc=$rc; $line"
if [ "$rc" -ne 0 ] || ! echo "$line" | grep -qE "paged-decode-sm90 [1-9]"; then
  echo "ordering check: the grid as built must pass with paged-decode-sm90 cases"; exit 1
fi
status=0
for drop in 1 2; do
  what=$([ $drop = 1 ] && echo "the loaders' empty waits" || echo "the consumers' full waits")
  FLASHATTN_CUDA_DROP_ORDERING=$drop timeout 60 ./build-ordering/tests/test_paged > "$out/ordering_$drop.log" 2>&1
  rc=$?
  echo "without $what: rc=$rc; $(grep -E "paged cases|FAILED" "$out/ordering_$drop.log" | head -1)"
  if [ "$rc" -eq 0 ]; then
    echo "ordering check: the grid passed without $what"; status=1
  fi
done
[ $status -eq 0 ] && echo "ordering check: each of the two orderings is needed"
exit $status
