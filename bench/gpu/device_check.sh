#!/usr/bin/env bash
# On a CUDA machine, in one go: build, the CUDA conformance grids (forward and backward)
# against float64, then the benchmark beside PyTorch. Logs go to $OUT (or build/).
#   bench/gpu/device_check.sh [full|quick|backward|paged]   (backward / paged: that grid alone)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
# cmocka for the tests where the machine has no package manager: debs carried in .devdeps
if [ -d .devdeps ] && ! ls /usr/lib/x86_64-linux-gnu/libcmocka.so /usr/lib/x86_64-linux-gnu/openblas-pthread >/dev/null 2>&1; then
  for f in .devdeps/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
# OpenBLAS (the Llama runner's GEMMs) unpacked from .devdeps: no alternatives symlink there
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
export LD_LIBRARY_PATH=$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_BUILD_TOOLS=OFF -DOPENBLAS_LIB=$blas/libopenblas.so \
  -DCBLAS_INCLUDE=/usr/include/x86_64-linux-gnu/openblas-pthread > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -20; exit 1; }
echo "build ok"
export FLASHATTN_TEST_BACKEND=cuda
level=${1:-full}
if [ "$level" = quick ]; then export FLASHATTN_TEST_QUICK=1; fi
if [ "$level" != backward ] && [ "$level" != paged ]; then
  timeout 300 ./build/tests/test_conformance > "$out/conformance_cuda.log" 2>&1; echo "conformance_cuda rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_cuda.log" | head -20
  # the same grid with three persistent forward blocks taking every case's query tiles
  FLASHATTN_CUDA_PERSISTENT_BLOCKS=3 timeout 300 ./build/tests/test_conformance > "$out/conformance_cuda_p3.log" 2>&1
  echo "conformance_cuda (3 persistent blocks) rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_cuda_p3.log" | head -20
  # and with the wide d64 tiles (FA_CUDA_SM90_WIDE_TILES) on every case they could take
  FLASHATTN_CUDA_WIDE_MIN_Q=0 FLASHATTN_CUDA_PERSISTENT_BLOCKS=3 timeout 300 ./build/tests/test_conformance \
    > "$out/conformance_cuda_wide.log" 2>&1
  echo "conformance_cuda (wide tiles, 3 persistent blocks) rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_cuda_wide.log" | head -20
  # and the dense decode route with the Hopper decode kernel's 3-block shape on every call
  FLASHATTN_CUDA_DECODE_WIDE_MIN=0 timeout 300 ./build/tests/test_conformance > "$out/conformance_cuda_dec.log" 2>&1
  echo "conformance_cuda (FLASHATTN_CUDA_DECODE_WIDE_MIN=0) rc=$?"
  grep -E "FAILED|cases|could not" "$out/conformance_cuda_dec.log" | head -20
fi
timeout ${PAGED_TIMEOUT:-300} ./build/tests/test_paged > "$out/paged_cuda.log" 2>&1; echo "paged_cuda rc=$?"
grep -E "FAILED|cases|could not|want" "$out/paged_cuda.log" | head -20
# the Hopper forward's and decode kernel's other loaders (row copies instead of TMA boxes)
FLASHATTN_CUDA_TMA=0 timeout ${PAGED_TIMEOUT:-300} ./build/tests/test_paged > "$out/paged_cuda_rows.log" 2>&1
echo "paged_cuda (FLASHATTN_CUDA_TMA=0) rc=$?"
grep -E "FAILED|cases|could not|want" "$out/paged_cuda_rows.log" | head -20
# the Hopper decode kernel's 3-block shape on every paged decode call, and from 9
# blocks (batched calls take it, most lone sequences not: the batch-invariance check compares
# the two shapes' bits)
for w in 0 9; do
  FLASHATTN_CUDA_DECODE_WIDE_MIN=$w timeout ${PAGED_TIMEOUT:-300} ./build/tests/test_paged > "$out/paged_cuda_dec$w.log" 2>&1
  echo "paged_cuda (FLASHATTN_CUDA_DECODE_WIDE_MIN=$w) rc=$?"
  grep -E "FAILED|cases|could not|want" "$out/paged_cuda_dec$w.log" | head -20
done
[ "$level" = paged ] && exit 0
timeout 300 ./build/tests/test_backward > "$out/backward_cuda.log" 2>&1; echo "backward_cuda rc=$?"
grep -E "FAILED|cases|could not" "$out/backward_cuda.log" | head -20
# the staggered order in groups of two key tiles at every head_dim, so that the grid's short
# sequences take several
FLASHATTN_CUDA_BWD_SCHED=groups FLASHATTN_CUDA_BWD_GROUP=2 FLASHATTN_TEST_QUICK=1 timeout 300 ./build/tests/test_backward \
  > "$out/backward_cuda_groups.log" 2>&1
echo "backward_cuda (groups of 2 key tiles) rc=$?"
grep -E "FAILED|cases|could not" "$out/backward_cuda_groups.log" | head -20
if [ "${SANITIZE:-0}" = 1 ]; then
  # memcheck and racecheck on every 8th case of the short grids
  export FLASHATTN_TEST_QUICK=1 FLASHATTN_TEST_EVERY=12
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/tests/test_conformance > "$out/memcheck_fwd.log" 2>&1; echo "memcheck forward rc=$?"
  FLASHATTN_CUDA_PERSISTENT_BLOCKS=2 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/tests/test_conformance > "$out/memcheck_fwd_p2.log" 2>&1; echo "memcheck forward (2 persistent blocks) rc=$?"
  FLASHATTN_CUDA_PERSISTENT_BLOCKS=2 FLASHATTN_CUDA_WIDE_MIN_Q=0 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/tests/test_conformance > "$out/memcheck_fwd_wide.log" 2>&1; echo "memcheck forward (wide tiles, 2 persistent blocks) rc=$?"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 ./build/tests/test_backward > "$out/memcheck_bwd.log" 2>&1; echo "memcheck backward rc=$?"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 ./build/tests/test_conformance > "$out/racecheck_fwd.log" 2>&1; echo "racecheck forward rc=$?"
  FLASHATTN_CUDA_WIDE_MIN_Q=0 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 ./build/tests/test_conformance > "$out/racecheck_fwd_wide.log" 2>&1; echo "racecheck forward (wide tiles) rc=$?"
  export FLASHATTN_TEST_EVERY=16
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 ./build/tests/test_backward > "$out/racecheck_bwd.log" 2>&1; echo "racecheck backward rc=$?"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|cases," "$out"/memcheck_*.log "$out"/racecheck_*.log
fi
