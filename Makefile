# SPDX-License-Identifier: MIT
# `make run`: build, then benchmark flashattn on the best backend present.
# `make test`: build, then run every test through CTest.
# Both install the Debian packages the build needs when they are missing.

BUILD ?= build
JOBS ?= $(shell nproc)
DEPS := cmake gcc make libopenblas-dev libcmocka-dev libegl-dev libgles-dev libegl-mesa0 libgl1-mesa-dri
CMAKE_FLAGS ?=

.PHONY: all deps build run test sanitize clean

all: build

deps:
	@missing=""; for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "need root to install:$$missing (or install them yourself)"; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/flashattn bench

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The tests again with AddressSanitizer + UndefinedBehaviorSanitizer (used by CI).
sanitize: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFA_SANITIZE=ON
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && FLASHATTN_TEST_QUICK=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan
