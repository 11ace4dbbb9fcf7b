#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CPU decode beside ggml's flash attention (ggml-org/ggml, llama.cpp's upstream), measured in
# one process by bench/ggml_decode.c. Builds ggml CPU-only outside this tree when it is not
# built yet (in $GGML_BUILD, default GGML_SRC_DIR-build), compiles the harness against it and
# libflashattn, then runs it; extra arguments go to the harness (--json, --reps, --shape ...).
# usage: bench/cpu_decode_peer.sh GGML_SRC_DIR [flashattn build dir] [harness args...]
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1/include/ggml.h" ]; then
  echo "usage: $0 GGML_SRC_DIR [flashattn build dir] [harness args...]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "$1" && pwd)
shift
fa_build=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then fa_build=$1; shift; fi
fa_build=$(cd "$fa_build" && pwd)
gb=${GGML_BUILD:-$src-build}
if [ ! -f "$gb/src/libggml-cpu.so" ]; then
  cmake -S "$src" -B "$gb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=ON \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >&2
  cmake --build "$gb" -j"$(nproc)" --target ggml ggml-cpu ggml-base >&2
fi
[ -f "$fa_build/libflashattn.so" ] || { echo "no libflashattn.so in $fa_build" >&2; exit 2; }
exe=$fa_build/ggml_decode
cc -O2 -march=native -fopenmp -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra \
  -I"$here/include" -I"$src/include" "$here/bench/ggml_decode.c" -o "$exe" \
  -L"$fa_build" -L"$gb/src" -Wl,-rpath,"$fa_build:$gb/src" -lflashattn -lggml -lggml-cpu -lggml-base -lm
echo "# ggml $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown), flashattn $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)" >&2
exec "$exe" "$@"
