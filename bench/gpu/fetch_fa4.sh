#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# FlashAttention-4 (flash-attn-4, the CuTe-DSL kernels with an sm90 path) as wheels for the GPU
# machine, which has no package index: the peer bench/gpu/attention.py measures when
# `flash_attn.cute` imports. Its CUTLASS DSL runtime wheel (libs-cu12, 92 MB) is more than one
# device call carries (64 MiB), so the wheels land in two ignored folders of under 60 MB each:
# .fa4/1 (the small wheels and the first half of that one) and .fa4/2 (its second half).
# On the device, with the machine kept warm between the two calls (it stays warm for a short
# while after each; files under /tmp survive until it is given back):
#   call 1, carry .fa4/1:  bench/gpu/device_fa4.sh stage
#   call 2, carry .fa4/2:  bench/gpu/device_fa4.sh install && <the benchmark, PYTHONPATH set as
#                          device_fa4.sh prints>
set -euo pipefail
if [ $# -gt 0 ]; then
  if [ "$1" = --help ] || [ "$1" = -h ]; then sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
  echo "$0: takes no arguments (see --help)" >&2
  exit 2
fi
cd "$(dirname "$0")/../.."
wheels="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu12==4.8.1 quack-kernels==0.6.5
apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2"
rm -rf .fa4
mkdir -p .fa4/all .fa4/1 .fa4/2
# the device runs CPython 3.12 on x86-64 Linux (glibc 2.28 or newer)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
  -d .fa4/all $wheels
big=$(ls .fa4/all/nvidia_cutlass_dsl_libs_cu12-*.whl)
for f in .fa4/all/*.whl; do [ "$f" = "$big" ] || mv "$f" .fa4/1/; done
split -b 46m -d "$big" ".fa4/1/$(basename "$big").part"
mv ".fa4/1/$(basename "$big").part01" .fa4/2/
[ ! -e ".fa4/1/$(basename "$big").part02" ] || { echo "the runtime wheel needs more than two parts" >&2; exit 1; }
sha256sum "$big" | sed 's|.fa4/all/||' > .fa4/2/runtime.sha256
rm -rf .fa4/all
du -sh .fa4/1 .fa4/2
