# SPDX-License-Identifier: MIT
# Sourced by the device scripts, from the repository root: the debs carried in .devdeps
# (bench/gpu/fetch_debs.sh) unpacked where the machine lacks them (it has no package manager),
# OpenBLAS's directory on the library path (no alternatives symlink there), and
# device_configure LOG: the CUDA build's configuration with the tools (no GLES), its output in
# LOG, its tail shown when it fails; device_library DIR: the CUDA library alone into build/
# unless build/libflashattn.so is there, the logs in DIR; device_grids DIR SUFFIX [VAR=VALUE
# ...]: build/tests' dense, backward and paged grids on CUDA (quick) with those variables set,
# the dense one again with the wide d64 tiles on every case and the paged one with the decode
# kernel's 3-block shape, the logs in DIR as RUN_SUFFIX.log, status 1 when one fails.
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ -d .devdeps ] && ! ls /usr/lib/x86_64-linux-gnu/libcmocka.so >/dev/null 2>&1; then
  for f in .devdeps/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
export LD_LIBRARY_PATH=$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
device_configure() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=ON -DFA_BUILD_TESTS=ON \
    -DOPENBLAS_LIB=$blas/libopenblas.so -DCBLAS_INCLUDE=/usr/include/x86_64-linux-gnu/openblas-pthread \
    > "$1" 2>&1 || { tail -20 "$1"; return 1; }
}
device_library() {
  [ -f build/libflashattn.so ] && return 0
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=OFF \
    -DFA_BUILD_TESTS=OFF > "$1/cmake.log" 2>&1 || { tail -20 "$1/cmake.log"; return 1; }
  cmake --build build -j "$(nproc)" --target flashattn > "$1/build.log" 2>&1 ||
    { grep -E "error" "$1/build.log" | head; return 1; }
}
device_grids() {
  local dir=$1 sfx=$2 run t wide rc fail=0
  shift 2
  # conformance_wide: the dense grid with the wide d64 tiles on every case they could take;
  # conformance_dec and paged_wide: the grids with the decode kernel's 3-block shape on every
  # decode call; paged_mixed: with it from 9 blocks (batched calls wide, lone sequences mostly
  # not, so that the batch-invariance check compares the two shapes' bits)
  for run in conformance backward paged conformance_wide conformance_dec paged_wide paged_mixed; do
    t=${run%_*} wide=
    case $run in
      conformance_wide) wide=FLASHATTN_CUDA_WIDE_MIN_Q=0 ;;
      conformance_dec | paged_wide) wide=FLASHATTN_CUDA_DECODE_WIDE_MIN=0 ;;
      paged_mixed) wide=FLASHATTN_CUDA_DECODE_WIDE_MIN=9 ;;
    esac
    env FLASHATTN_TEST_BACKEND=cuda FLASHATTN_TEST_QUICK=1 $wide "$@" timeout 200 ./build/tests/test_$t \
      > "$dir/${run}_$sfx.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || fail=1
    echo "$run${*:+ ($*)} rc=$rc"; grep -E "FAILED|cases" "$dir/${run}_$sfx.log" | head -5
  done
  return $fail
}
