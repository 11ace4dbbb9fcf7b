#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine: compute-sanitizer racecheck reports hazards in three Hopper kernels, all
# between a loader's writes into a stage (or Q buffer) and the consumers' reads of it, ordered
# by the stage's full and empty mbarriers, which racecheck does not model (docs/perf/h200.md):
# the decode kernel's K/V stages (decode_sm90.cu), the backward's Q/dO stages with their lse
# and D (backward_sm90.cuh), the persistent forward's Q buffers with the query tile passed in
# ring.item (forward_sm90.cuh). This shows each ordering is needed: a test build
# (-DFA_CUDA_ORDERING_TEST=ON, in build-ordering) runs each kernel's grid as built (the quick
# paged grid, which must have paged-decode-sm90 cases; the quick backward grid; the quick
# dense grid on 3 persistent blocks), which must pass, then without that kernel's loaders'
# empty waits (FLASHATTN_CUDA_DROP_ORDERING=1:KERNEL; its consumers then sleep 10 us a stage,
# so that the loaders run a ring's length ahead, as they may on a busy machine) and without
# its consumers' full waits (=2:KERNEL), each of which must fail or stop (90 s). Logs go to
# $OUT (or build-ordering/).
#   bench/gpu/ordering_check.sh
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; "") ;; *)
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
cmake --build build-ordering -j "$(nproc)" --target test_paged test_backward test_conformance \
  > "$out/ordering_build.log" 2>&1 || { grep -E "error" "$out/ordering_build.log" | head -20; exit 1; }
export FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1
status=0
# kernel, test, the line its log ends with
for check in "decode test_paged paged cases" "backward test_backward cases," "forward test_conformance cases,"; do
  set -- $check
  kernel=$1 test=$2 pat="$3${4:+ $4}"
  env=()
  [ "$kernel" = forward ] && env=(FLASHATTN_CUDA_PERSISTENT_BLOCKS=3)
  env "${env[@]}" timeout 300 ./build-ordering/tests/$test > "$out/ordering_${kernel}_0.log" 2>&1
  rc=$?
  line=$(grep -E "$pat" "$out/ordering_${kernel}_0.log" | tail -1)
  echo "$kernel, as built: rc=$rc; $line"
  if [ "$rc" -ne 0 ] || { [ "$kernel" = decode ] && ! echo "$line" | grep -qE "paged-decode-sm90 [1-9]"; }; then
    echo "ordering check: the $kernel grid as built must pass$([ "$kernel" = decode ] && echo " with paged-decode-sm90 cases")"
    status=1
    continue
  fi
  for drop in 1 2; do
    what=$([ $drop = 1 ] && echo "the loaders' empty waits" || echo "the consumers' full waits")
    env "${env[@]}" FLASHATTN_CUDA_DROP_ORDERING=$drop:$kernel timeout 90 ./build-ordering/tests/$test \
      > "$out/ordering_${kernel}_$drop.log" 2>&1
    rc=$?
    echo "$kernel, without $what: rc=$rc; $(grep -E "$pat|FAILED" "$out/ordering_${kernel}_$drop.log" | head -1)"
    if [ "$rc" -eq 0 ]; then
      echo "ordering check: the $kernel grid passed without $what"; status=1
    fi
  done
done
[ $status -eq 0 ] && echo "ordering check: each of the six orderings is needed"
exit $status
