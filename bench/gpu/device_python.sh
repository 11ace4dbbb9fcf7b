#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine (no package index), in one go: `pip install .` of the Python package with
# the CUDA backend, its build requirements from the wheels in .whl (bench/gpu/fetch_wheels.sh),
# then what it reports (version, backends, the CUDA device), every Python test (the CPU ones
# and python/tests/test_cuda.py) and bench/gpu/torch_calls.py. Logs go to $OUT (or
# build-python/). About 2 minutes of build with 16 cores, 2-3 of tests, under 1 of benchmark.
#   bash bench/gpu/device_python.sh [all|cuda]   (cuda: test_cuda.py alone; carry .whl with the call)
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
tests=$repo/python/tests
[ "${1:-all}" = cuda ] && tests=$repo/python/tests/test_cuda.py
out=${OUT:-build-python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
echo "the image's own build packages (the build uses .whl's): $(python3 -m pip list 2>/dev/null | grep -iE '^(scikit.build.core|nanobind|packaging|pathspec) ' | tr -s ' ' | paste -sd,)"

# the build requirements, seen by the build alone (the tests run on the image's own packages)
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl: run bench/gpu/fetch_wheels.sh here first"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
# FA_WITH_CUDA=ON: a missing nvcc fails the build instead of leaving the backend out
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
export CMAKE_ARGS="-DFA_WITH_CUDA=ON -DFA_WITH_GLES=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
start=$(date +%s)
PYTHONPATH=/tmp/site timeout 240 python3 -m pip install -v --no-build-isolation --no-index --no-deps . \
  > "$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -30; tail -20 "$out/build.log"; exit 1; }
echo "pip install . (CUDA build): $(( $(date +%s) - start )) s"

cd /tmp # import the installed package, not python/flashattn
python3 - <<'PY' 2>&1 | tee "$out/info.txt"
import subprocess
import flashattn
import flashattn._C
print("flashattn", flashattn.version(), "backends:", flashattn.backends())
print(flashattn.info("cuda"), end="")
print(subprocess.run(["ldd", flashattn._C.__file__], capture_output=True, text=True).stdout, end="")
PY
timeout 240 python3 -m pytest -q -rs --durations=12 -p no:cacheprovider "$tests" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -20
grep -E "[0-9]+ (passed|failed|skipped)" "$out/pytest.log" | tail -1
timeout 90 python3 "$repo/bench/gpu/torch_calls.py" 2>&1 | tee "$out/torch_calls.md"
