# Thin wrapper over CMake. `make bench CASE=llm-lora`, `make test`, `make gpu-check`.
BUILD ?= build
CASE ?= llm-lora
SCALE ?=
DEVICE ?= auto
JOBS ?= $(shell nproc)
ASAN_JOBS ?= 2
ARGS ?=
# ccache, when installed, serves every build folder (a rebuild after a small change, CI on a
# machine that built before); without it nothing changes
LAUNCHER := $(if $(shell command -v ccache 2>/dev/null),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

.PHONY: all build deps test asan bench plan report gpu-check fuzz clean regress regress-update

all: build

deps:
	@./tools/deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

# every test under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build, Debug at -O1, as ASan's
# docs advise: asserts and every check stay), leaks too, ASAN_JOBS tests at once (tests that start
# MPI ranks never together: RESOURCE_LOCK). On this 2-core machine the suite took 684 s at -O0 one
# at a time, 577 s at -O1, 474 s at -O1 two at a time;
# Open MPI's own process-lifetime allocations are suppressed (tests/lsan.supp: its libraries
# only, never ours)
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0
asan: deps
	cmake -S . -B build-asan -DVRAMLAB_CUDA=OFF -DVRAMLAB_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS_DEBUG="-g -O1" $(LAUNCHER)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(ASAN_ENV) ctest --output-on-failure -j $(ASAN_JOBS)

bench: build
	./$(BUILD)/vramlab bench $(CASE) --device $(DEVICE) $(if $(SCALE),--scale $(SCALE)) $(ARGS)

# a short fixed run of every case against reports/baselines/<device-class>.json; exits 1 on a
# regression (a missing baseline is created). DEVICE=cuda on GPU runners. regress-update
# rewrites the baseline deliberately and says what changed.
REGRESS_DEVICE = $(if $(filter auto,$(DEVICE)),cpu,$(DEVICE))
regress: build
	./$(BUILD)/vramlab regress --device $(REGRESS_DEVICE) --out $(BUILD)/regress.json $(ARGS)

regress-update: build
	./$(BUILD)/vramlab regress --update --device $(REGRESS_DEVICE) --out $(BUILD)/regress.json $(ARGS)

plan: build
	./$(BUILD)/vramlab plan $(CASE) $(ARGS)

report: build
	./$(BUILD)/vramlab report $(CASE) $(ARGS)

# REQUIRE_GPU=1: fail when no case ran on a GPU (no device, or no CUDA backend) -- GPU runners
REQUIRE_GPU ?=
gpu-check: build
	@if [ -x ./$(BUILD)/vramlab-gpu-check ]; then \
	   ./$(BUILD)/vramlab-gpu-check $(if $(filter 1,$(REQUIRE_GPU)),--require-gpu) $(ARGS); \
	 elif [ "$(REQUIRE_GPU)" = 1 ]; then \
	   echo "gpu-check: --require-gpu: no case ran on a GPU (this build has no CUDA backend: nvcc not found)"; exit 1; \
	 else echo "gpu-check: skipped: this build has no CUDA backend (nvcc not found)"; fi

# libFuzzer targets (clang, ASan + UBSan) over every parser of outside bytes, FUZZ_TIME
# seconds each (tools/fuzz/run.sh; FUZZ=name for one target)
FUZZ_TIME ?= 60
FUZZ ?=
fuzz:
	./tools/fuzz/run.sh --time $(FUZZ_TIME) $(FUZZ)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
