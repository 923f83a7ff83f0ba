# Thin wrapper over CMake + ctest. Everything real lives in CMakeLists.txt.
BUILD      ?= build
JOBS       ?= $(shell nproc)
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: all deps configure build test demo bench crash clean

all: build

deps:
	@scripts/deps.sh

configure: deps
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600 $(CTEST_ARGS)

demo: build
	scripts/demo.sh $(BUILD)/bin

bench: build
	$(BUILD)/bin/kvtier-bench rpc
	$(BUILD)/bin/kvtier-bench nvme
	$(BUILD)/bin/kvtier-bench restart

# Long crash campaigns (tests/crash/); make test runs a short version of each.
crash: build
	tests/crash/run.sh $(CRASH_ITERATIONS)

clean:
	rm -rf $(BUILD)
