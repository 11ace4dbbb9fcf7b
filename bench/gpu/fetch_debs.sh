#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian packages the GPU machine lacks, downloaded here (no root needed) into the ignored
# folders that bench/gpu/device_check.sh and device_gles.sh unpack there with `dpkg -x`:
#   .devdeps/  cmocka (the tests), OpenBLAS (the runner's CPU GEMMs), cJSON (its HF loader),
#              PCRE2 (its byte-level tokenizers)
#   .gl/       the EGL / GLES loaders (glvnd) and their headers (the image has NVIDIA's driver only)
# Carry both folders with the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devdeps .gl
(cd .devdeps && apt-get download libcmocka0 libcmocka-dev libopenblas0-pthread libopenblas-pthread-dev \
  libopenblas-dev libgfortran5 libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev)
(cd .gl && apt-get download libegl1 libegl-dev libgles2 libgles-dev libglvnd0 libgl-dev libgl1 libglx0 \
  libopengl0)
ls .devdeps .gl
