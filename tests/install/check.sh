#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install flashattn from build dir $1 into a fresh prefix, then build and run a consumer
# through find_package (shared and static) and through pkg-config (shared and --static).
#   tests/install/check.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$here" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
"$tmp/cmake/consumer_shared"
"$tmp/cmake/consumer_static"
# the shared program finds the library through its rpath, the static one needs none
if ldd "$tmp/cmake/consumer_static" | grep -q libflashattn; then echo "consumer_static links libflashattn.so"; exit 1; fi
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
libdir=$(pkg-config --variable=libdir flashattn)
cc "$here/consumer.c" -o "$tmp/pc_shared" $(pkg-config --cflags --libs flashattn) -lm -Wl,-rpath,"$libdir"
"$tmp/pc_shared"
cc "$here/consumer.c" -o "$tmp/pc_static" $(pkg-config --cflags flashattn) "$libdir/libflashattn.a" \
  $(pkg-config --static --libs-only-other --libs-only-l flashattn | sed 's/-lflashattn//') -lm
"$tmp/pc_static"
echo "install: find_package and pkg-config consumers ran (shared and static)"
