#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The build requirements of `pip install .` (pyproject.toml) as wheels for the GPU machine, which
# has no package index: downloaded here into the ignored folder .whl (under 1 MiB), installed there
# by bench/gpu/device_python.sh into /tmp/site for the build alone. scikit-build-core's own needs
# on Python 3.12 are packaging and pathspec (exceptiongroup, tomli and typing-extensions only
# below 3.11); the image may hold older copies of them, so these travel too. Carry .whl with the
# device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheels="scikit-build-core==1.1.2 nanobind==3.1.0 packaging==26.4 pathspec==1.1.1"
rm -rf .whl
mkdir -p .whl
# all four are pure-Python wheels (py3-none-any): no platform tags to match
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl $wheels
ls -l .whl
du -sh .whl
