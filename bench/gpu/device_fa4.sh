#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine: FlashAttention-4 from the wheels of bench/gpu/fetch_fa4.sh, installed with
# `pip install --no-deps --target` into /tmp/fa4site (the CUTLASS DSL's packages need their own
# folder on PYTHONPATH too, as --target runs no .pth file).
#   bench/gpu/device_fa4.sh stage     (carrying .fa4/1: its wheels into /tmp/fa4whl)
#   bench/gpu/device_fa4.sh install   (carrying .fa4/2: the runtime wheel joined, all installed)
# Then: PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages python3 bench/gpu/attention.py
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '3,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/../.."
case "${1:-}" in
stage)
  mkdir -p /tmp/fa4whl
  cp .fa4/1/* /tmp/fa4whl/
  ls /tmp/fa4whl ;;
install)
  [ -d /tmp/fa4whl ] || { echo "no staged wheels in /tmp/fa4whl: run 'stage' first on this machine" >&2; exit 2; }
  cp .fa4/2/* /tmp/fa4whl/
  cd /tmp/fa4whl
  name=$(ls *.part00 | sed 's/\.part00$//')
  cat "$name".part00 "$name".part01 > "$name"
  sha256sum -c runtime.sha256
  rm -rf /tmp/fa4site # --target keeps what an earlier install left
  python3 -m pip install -q --no-deps --target /tmp/fa4site ./*.whl
  ls -d /tmp/fa4site/flash_attn /tmp/fa4site/nvidia_cutlass_dsl/dsl_packages ;;
*)
  echo "usage: $0 stage|install (see --help)" >&2
  exit 2 ;;
esac
