#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a Hopper machine: compute-sanitizer racecheck reports hazards in three Hopper kernels, all
# between a loader's writes into a stage (or Q buffer) and the consumers' reads of it, ordered
# by the stage's full and empty mbarriers, which racecheck does not model (docs/perf/h200.md):
# the decode kernel's K/V stages (decode_sm90.cu), the backward's Q/dO stages with their lse
# and D (backward_sm90.cuh), the persistent forward's Q buffers with the query tile passed in
# ring.item (forward_sm90.cuh). This shows each ordering is needed: a test build
# (-DFA_CUDA_ORDERING_TEST=ON, in build-ordering) runs each kernel's grid (the quick paged grid,
# which must have paged-decode-sm90 cases; the quick backward grid; the quick dense grid on 3
# persistent blocks) as built and as the control (FLASHATTN_CUDA_DROP_ORDERING=4:KERNEL: the
# kernel's consumers sleep 10 us a stage, a query tile in the forward, every wait kept), both
# of which must pass; then with the consumers so slowed and without the loaders' empty waits
# (=1:KERNEL, so that the loaders run a ring's length ahead, as they may on a busy machine),
# and without the consumers' full waits (=2:KERNEL), each of which must fail, or stop: run
# for three times the control's time (90 s at least) and not finish. Logs go to $OUT (or
# build-ordering/).
#   bench/gpu/ordering_check.sh
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '3,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; "") ;; *)
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
export FLASHATTN_TEST_BACKEND=cuda
status=0
# kernel, test, the line its log ends with
for check in "decode test_paged paged cases" "backward test_backward cases," "forward test_conformance cases,"; do
  set -- $check
  kernel=$1 test=$2 pat="$3${4:+ $4}"
  extra=(FLASHATTN_TEST_QUICK=1)
  [ "$kernel" = forward ] && extra+=(FLASHATTN_CUDA_PERSISTENT_BLOCKS=3)
  ok=1 control=0
  for drop in 0 4; do
    t0=$(date +%s)
    env "${extra[@]}" FLASHATTN_CUDA_DROP_ORDERING="$([ $drop = 0 ] || echo $drop:$kernel)" \
      timeout 300 ./build-ordering/tests/$test \
      > "$out/ordering_${kernel}_$drop.log" 2>&1
    rc=$? secs=$(( $(date +%s) - t0 ))
    line=$(grep -E "$pat" "$out/ordering_${kernel}_$drop.log" | tail -1)
    echo "$kernel, $([ $drop = 0 ] && echo "as built" || echo "control (slow consumers, every wait)"): rc=$rc in $secs s; $line"
    [ $drop = 4 ] && control=$secs
    if [ "$rc" -ne 0 ] || { [ "$kernel" = decode ] && ! echo "$line" | grep -qE "paged-decode-sm90 [1-9]"; }; then
      echo "ordering check: the $kernel grid must pass here$([ "$kernel" = decode ] && echo ", with paged-decode-sm90 cases")"
      ok=0
    fi
  done
  [ $ok = 1 ] || { status=1; continue; }
  limit=$(( 3 * control > 90 ? 3 * control : 90 ))
  for drop in 1 2; do
    what=$([ $drop = 1 ] && echo "the loaders' empty waits" || echo "the consumers' full waits")
    env "${extra[@]}" FLASHATTN_CUDA_DROP_ORDERING=$drop:$kernel timeout -k 10 $limit ./build-ordering/tests/$test \
      > "$out/ordering_${kernel}_$drop.log" 2>&1
    rc=$?
    case $rc in
      0) result="passed" ;;
      124 | 137) result="stopped: not finished in $limit s" ;;
      *) result="failed (rc $rc)" ;;
    esac
    echo "$kernel, without $what: $result; $(grep -E "FAILED|$pat" "$out/ordering_${kernel}_$drop.log" | head -1)"
    [ "$rc" -ne 0 ] || { echo "ordering check: the $kernel grid passed without $what"; status=1; }
  done
done
[ $status -eq 0 ] && echo "ordering check: each of the six orderings is needed"
exit $status
