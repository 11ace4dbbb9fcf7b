# SPDX-License-Identifier: MIT
# Cross-building for 64-bit Arm Linux with Debian's gcc-aarch64-linux-gnu; libraries of the
# target (OpenBLAS, cJSON, cmocka) from Debian's arm64 packages (multiarch, dpkg
# --add-architecture arm64), tests run under qemu-aarch64 (qemu-user). `make test-arm` uses it:
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# the cross C library first; multiarch arm64 packages live under /usr/lib/aarch64-linux-gnu
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# CTest runs the test programs through qemu; -L is where the target's loader and libc lie
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
