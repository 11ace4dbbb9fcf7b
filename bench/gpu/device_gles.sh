#!/usr/bin/env bash
# The GLES backend on NVIDIA's EGL (the H200 machine): the EGL/GLES loader libraries and
# headers carried as Debian packages in .gl/ (the image has the driver, not the loaders),
# OpenBLAS and cmocka from .devdeps/, then: info, the quick conformance grid on GLES, and
# the fused-vs-standard benchmark rows of docs/perf/gles.md. Logs to $OUT (or build/).
#   bench/gpu/device_gles.sh   (every fused variant: tiled, rows, rows-tex; GRIDS_ONLY=1: the grids)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build}
mkdir -p "$out"
for f in .gl/*.deb .devdeps/*.deb; do dpkg -x "$f" /; done
ldconfig
export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json}
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
export LD_LIBRARY_PATH=$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=OFF -DFA_WITH_GLES=ON -DFA_BUILD_TOOLS=ON -DOPENBLAS_LIB=$blas/libopenblas.so \
  -DCBLAS_INCLUDE=/usr/include/x86_64-linux-gnu/openblas-pthread > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -20; exit 1; }
echo "build ok"
./build/flashattn info --backend gles 2>&1 | tee "$out/gles_info.txt"
for fwd in tiled rows rows-tex tiled:64; do # tiled:64: in 64-key chunks (FLASHATTN_GLES_KEY_CHUNK)
  chunk=${fwd#*:}; [ "$chunk" = "$fwd" ] && chunk=
  FLASHATTN_GLES_FORWARD=${fwd%%:*} FLASHATTN_GLES_KEY_CHUNK=$chunk FLASHATTN_TEST_BACKEND=gles \
    FLASHATTN_TEST_QUICK=1 timeout 300 ./build/tests/test_conformance > "$out/conformance_gles_${fwd%%:*}$chunk.log" 2>&1
  echo "conformance_gles ($fwd) rc=$?"; grep -E "FAILED|cases|could not" "$out/conformance_gles_${fwd%%:*}$chunk.log" | head
done
[ "${GRIDS_ONLY:-0}" = 1 ] && exit 0
j="$out/gles-h200.jsonl"
: > "$j"
row() { ./build/flashattn bench --backend gles "$@" --json "$out/row.jsonl" && cat "$out/row.jsonl" >> "$j"; }
for fwd in tiled rows rows-tex; do
  for dt in f32 f16; do
    FLASHATTN_GLES_FORWARD=$fwd row --dtype $dt --seq 2048 --heads 8 --dim 64 --causal yes --reps 10
    # rows-tex holds four rows an invocation, built for CPU renderers: at d128 it spills on GPUs
    [ $fwd = rows-tex ] || FLASHATTN_GLES_FORWARD=$fwd row --dtype $dt --seq 2048 --heads 32 --dim 128 --causal no --reps 5
  done
done
for dt in f32 f16; do row --dtype $dt --seq 4096 --seq-q 1 --heads 32 --dim 128 --causal yes --reps 20; done
rm -f "$out/row.jsonl"
