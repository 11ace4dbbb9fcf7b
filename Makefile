# SPDX-License-Identifier: MIT
# `make run`: build, then benchmark flashattn on the best backend present.
# `make test`: build, then run the first tier of tests through CTest (minutes);
# `make test-full`: the second tier (label "full": every GLES head_dim on each fused forward).
# Both install the Debian packages the build needs when they are missing.
# `make test-arm`: cross-build for aarch64 into build-arm and run the NEON table's tests under
# qemu-aarch64 (installs the cross compiler, qemu-user and Debian's arm64 libraries).

BUILD ?= build
JOBS ?= $(shell nproc)
DEPS := cmake gcc make pkg-config python3-venv python3-pip libopenblas-dev libcmocka-dev libcjson-dev libpcre2-dev libegl-dev libgles-dev libegl-mesa0 libgl1-mesa-dri \
        clang libclang-rt-dev libomp-dev
CMAKE_FLAGS ?=
# The CUDA backend is built where nvcc is found (CMake's default) and a GPU answers
# `nvidia-smi -L`: without one its kernels compile for about 6 minutes on 2 cores for tests
# that would all skip. CUDA=ON or CUDA=OFF decides instead (ON needs nvcc).
CUDA ?= auto
ifeq ($(CUDA),auto)
CUDA_CMAKE := $(shell nvidia-smi -L >/dev/null 2>&1 && echo -UFA_WITH_CUDA || echo -DFA_WITH_CUDA=OFF)
else
CUDA_CMAKE := -DFA_WITH_CUDA=$(CUDA)
endif

.PHONY: all deps deps-arm test-arm build run test test-full test-python test-torch sanitize fuzz clean

all: build

deps:
	@missing=""; for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "need root to install:$$missing (or install them yourself)"; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

build: deps
	@if [ "$(CUDA_CMAKE)" = "-DFA_WITH_CUDA=OFF" ] && [ "$(CUDA)" = auto ] && \
	  { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then \
	  echo "no GPU answers nvidia-smi -L: building without the CUDA backend (CUDA=ON builds it)"; fi
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_CMAKE) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/flashattn bench
	@echo
	@echo "a short story from stories260K (models/), attention by flashattn:"
	./$(BUILD)/flashattn generate --prompt "Once upon a time" --steps 128 --temperature 0.8 --seed 42

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE full

test-full: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L full

# The Python package: `pip install .` into a fresh virtual environment (nanobind and
# scikit-build-core from PyPI, the C library built by CMake inside), then its tests.
test-python: deps
	python3 -m venv $(BUILD)-python/venv
	$(BUILD)-python/venv/bin/pip install -q ".[test]"
	cd $(BUILD)-python && venv/bin/python -m pytest -q $(CURDIR)/python/tests

# The same with torch (pip install ".[test,torch]": the custom ops, autograd, torch.compile) in a
# virtual environment of its own, so that test-python keeps checking the package without it.
# torch comes from PyPI with its CUDA libraries (2.5 GB, about 2 minutes); CPU tests only.
test-torch: deps
	python3 -m venv $(BUILD)-torch/venv
	$(BUILD)-torch/venv/bin/pip install -q ".[test,torch]"
	cd $(BUILD)-torch && venv/bin/python -m pytest -q $(CURDIR)/python/tests

# The tests again with AddressSanitizer + UndefinedBehaviorSanitizer (used by CI).
sanitize: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFA_SANITIZE=ON $(CUDA_CMAKE)
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && FLASHATTN_TEST_QUICK=1 ctest --output-on-failure -j $(JOBS) -LE full

# The checkpoint and tokenizer loaders under libFuzzer (clang) for FUZZ_SECONDS, seeded with
# tok512 and a tiny synthetic checkpoint (used by CI).
FUZZ_SECONDS ?= 25
fuzz: build
	CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFA_WITH_CUDA=OFF \
	  -DFA_WITH_GLES=OFF -DFA_BUILD_TOOLS=OFF
	cmake --build $(BUILD)-fuzz --target fuzz_loader -j $(JOBS)
	mkdir -p $(BUILD)-fuzz/corpus
	cp models/tok512.bin $(BUILD)-fuzz/corpus/
	cp tests/data/bytelevel_small.json $(BUILD)-fuzz/corpus/
	./$(BUILD)/flashattn gen-model --config 8x1x2x1x8x16x4 --out $(BUILD)-fuzz/corpus/tiny.bin
	./$(BUILD)-fuzz/tests/fuzz_loader -max_total_time=$(FUZZ_SECONDS) -max_len=8192 $(BUILD)-fuzz/corpus

# Cross-building for 64-bit Arm Linux: gcc-aarch64-linux-gnu, qemu-user, and the runner's and
# tests' libraries as Debian arm64 packages (multiarch, beside the amd64 ones).
ARM_BUILD ?= build-arm
ARM_SYSROOT := /usr/aarch64-linux-gnu
ARM_DEPS := cmake make gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libopenblas-dev:arm64 \
            libcmocka-dev:arm64 libcjson-dev:arm64 libpcre2-dev:arm64
# Debian 12's qemu-user (7.2) hangs here once a guest program runs a second thread (a plain
# two-thread OpenMP loop does, and so does OpenBLAS's pool), so the emulated tests run on one
ARM_ENV := OMP_THREAD_LIMIT=1 OPENBLAS_NUM_THREADS=1
ARM_RUN := $(ARM_ENV) qemu-aarch64 -L $(ARM_SYSROOT)

deps-arm:
	@missing=""; for p in $(ARM_DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "need root to install:$$missing (or install them yourself)"; exit 1; fi; \
	  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The kernel contract, the short conformance grid on the neon_fhm and neon tables (f32, f16,
# bf16), the numerics and API tests and the runner's (stories260K greedy against the models
# README); qemu's default CPU has FEAT_FHM, so neon_fhm must be the table chosen
test-arm: deps-arm
	cmake -S . -B $(ARM_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
	  -DCMAKE_BUILD_TYPE=Release -DFA_WITH_CUDA=OFF -DFA_WITH_GLES=OFF
	cmake --build $(ARM_BUILD) -j $(JOBS)
	$(ARM_RUN) $(ARM_BUILD)/flashattn info | tee $(ARM_BUILD)/info.txt
	grep -q "^cpu.kernels: neon_fhm " $(ARM_BUILD)/info.txt || { echo "the neon_fhm table was not chosen"; exit 1; }
	cd $(ARM_BUILD) && $(ARM_ENV) ctest --output-on-failure -j $(JOBS) \
	  -R "^(kernels|conformance_neon_fhm|conformance_neon|numerics|api|model)$$"

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-python $(BUILD)-torch $(ARM_BUILD)
