# LM Resiliency: every target does its own set-up and can be run again safely.
#   make demo   set-up, build, then lmr-qualify: 4 CPU ranks (gloo), DDP, every fault family, a self-healing restart
#   make test   set-up, build, C++ tests (ctest), Python tests (pytest); then the 25 slowest
#               tests and the time of each phase
#   make test-fast  C++ tests and the Python tests that spawn no world (after a build)
#   make lint   ruff check, clang-format --dry-run -Werror, then make lint-threads
#   make format apply ruff's safe fixes and clang-format
#   make lint-threads  liblmr under clang -Wthread-safety -Werror (syntax only, the sources that
#               reach an annotated header: about 30 s)
#   make bench  set-up, build with benchmarks, CPU benchmark ratios
#   make wheel  set-up, build, then the manylinux wheels in dist/ (CPU; CUDA 13 when nvcc is
#               found), each installed into a fresh venv and smoke-tested (scripts/wheel_smoke.sh)
#   make deps   Debian packages and the .venv only

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_DIR := build
APT_PACKAGES := libgtest-dev nlohmann-json3-dev libbenchmark-dev ccache
JOBS ?= $(shell nproc)
MEGATRON_CORE := megatron-core==0.19.2
# One persistent build tree serves pip, ctest, the benchmarks and the CPU wheel (make wheel), so
# the sources compile once: it is built as the CPU wheel ships (no CUDA kernels, the C++ runtime
# linked in, Gloo vendored) and reports the wheel's version (LMR_WHEEL_VARIANT: 0.1.0+cpu).
# Unity batches and precompiled headers (CMakeLists.txt) cut a clean build to about a third.
PIP_COMMON_FLAGS := --no-build-isolation --no-deps -q \
	-Ccmake.define.LMR_OOB=ON \
	-Ccmake.define.LMR_STATIC_RUNTIME=ON \
	-Ccmake.define.LMR_WERROR=ON \
	-Ccmake.define.LMR_UNITY_BUILD=ON
PIP_BASE_FLAGS := $(PIP_COMMON_FLAGS) -Cbuild-dir=$(BUILD_DIR) -Ccmake.define.LMR_CUDA=OFF
PIP_BUILD_FLAGS := $(PIP_BASE_FLAGS) \
	-Ccmake.define.LMR_BUILD_TESTS=ON \
	-Ccmake.define.LMR_BUILD_BENCHMARKS=ON


FUZZ_SECONDS ?= 120
FUZZ_APT_PACKAGES := clang libclang-rt-14-dev
# clang-format 19 (Debian bookworm) keeps trailing comments as written (AlignTrailingComments: Leave).
CLANG_FORMAT := clang-format-19
LINT_APT_PACKAGES := $(CLANG_FORMAT) clang
# The C++ that clang-format checks: what git tracks under these paths.
FORMAT_FILES = $(shell git ls-files -- include src python/bindings tools tests/cpp 'bench/*.cc' fuzz | grep -E '\.(h|cc|cu|cuh)$$')
# The library's sources for the thread-safety check: those that reach an annotated header
# (CUDA files are not parsed by it).
THREAD_CHECK_FILES = $(shell scripts/thread_check_files.sh)

.PHONY: deps apt apt-install venv build compile demo test test-fast test-cpp test-python bench fuzz clean \
	lint lint-apt lint-threads format wheel wheel-cpu wheel-cuda

deps: apt venv

apt:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(APT_PACKAGES)"

apt-install:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# pip installs without byte-compiling (one core); compileall then does it on every core. Byte
# code matters: where PYTHONDONTWRITEBYTECODE is set (as on our CI machines) nothing is ever
# cached, and every fresh rank compiles torch again (import torch 5.8 s instead of 2.8 s).
PIP_INSTALL := $(PY) -m pip install -q --no-compile
COMPILE_ALL := $(PY) -m compileall -qq -j 0
$(VENV)/.deps-stamp: requirements-dev.txt requirements-frameworks.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -r requirements-dev.txt
	DS_BUILD_OPS=0 $(PIP_INSTALL) --no-build-isolation -r requirements-frameworks.txt torch==2.13.0
	# Megatron Core's metadata asks for Python >= 3.12 but its cp311 wheel runs here; its deps
	# (torch, numpy, packaging) are already installed.
	$(PIP_INSTALL) --ignore-requires-python --no-deps $(MEGATRON_CORE)
	# Some packages ship files for other Python versions that do not compile: not an error.
	$(COMPILE_ALL) $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || true
	touch $@

venv: $(VENV)/.deps-stamp

build: deps
	@$(MAKE) --no-print-directory compile

# The package and the test and benchmark programs, without the set-up.
compile:
	LMR_WHEEL_VARIANT=cpu CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install $(PIP_BUILD_FLAGS) .

# The demo builds only what it runs (no test or benchmark programs); make test adds them to the
# same build tree later without recompiling the library.
demo: deps
	LMR_WHEEL_VARIANT=cpu CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install $(PIP_BASE_FLAGS) \
		-Ccmake.define.LMR_BUILD_TESTS=OFF -Ccmake.define.LMR_BUILD_BENCHMARKS=OFF .
	$(VENV)/bin/lmr-qualify --out qualify-out

test-cpp: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

test-python: build
	$(PY) -m pytest -q tests/python

# Each phase timed (scripts/timed); the summary is printed whether the tests pass or not.
# .ci/run times `make lint` into the same summary (LMR_KEEP_TIMES=1).
test:
	@[ -n "$(LMR_KEEP_TIMES)" ] || scripts/timed --reset
	@scripts/timed set-up $(MAKE) --no-print-directory deps && \
	  scripts/timed build $(MAKE) --no-print-directory compile && \
	  scripts/timed ctest ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) && \
	  scripts/timed pytest $(PY) -m pytest -q --durations=25 tests/python && \
	  scripts/timed wheel $(MAKE) --no-print-directory wheel-cpu; \
	  status=$$?; scripts/timed --summary; exit $$status

test-fast: test-cpp
	$(PY) -m pytest -q --durations=10 -m "not distributed" tests/python

bench: build
	$(PY) bench/run_cpu_bench.py --build-dir $(BUILD_DIR)
	$(PY) bench/injection_overhead.py
	$(PY) bench/scout_overhead.py
	$(PY) bench/oob_overhead.py
	$(PY) bench/oob_latency.py
	$(PY) bench/moe_overhead.py --rounds 3 --steps 10

# The wheels (docs/install.md): pip wheel from a build tree, auditwheel's manylinux repair (the
# tag), then scripts/wheel_smoke.sh: no ELF file may need a library outside the manylinux
# allowlist, and the wheel must work in a fresh venv with nothing but the pinned torch. The CPU wheel reuses the build tree (packaging only); the CUDA
# wheel (signature kernels for sm_80 and sm_90, the host path where no GPU is visible) has its own.
WHEEL_DIR := dist
CUDA_WHEEL_ARCHS := 80;90
define build_wheel
	rm -rf $(WHEEL_DIR)/raw-$(1) && mkdir -p $(WHEEL_DIR)/raw-$(1)
	LMR_WHEEL_VARIANT=$(2) CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip wheel $(3) -w $(WHEEL_DIR)/raw-$(1) .
	rm -f $(WHEEL_DIR)/lm_resiliency-*+$(2)-*.whl
	PATH=$(VENV)/bin:$$PATH $(PY) -m auditwheel repair -w $(WHEEL_DIR) $(WHEEL_DIR)/raw-$(1)/lm_resiliency-*.whl
	scripts/wheel_smoke.sh $(WHEEL_DIR)/lm_resiliency-*+$(2)-*.whl
endef

wheel-cpu: build
	$(call build_wheel,cpu,cpu,$(PIP_BUILD_FLAGS))

wheel-cuda: build
	@command -v nvcc >/dev/null || { echo "make wheel-cuda: no nvcc on PATH (the CUDA toolkit)"; exit 1; }
	$(call build_wheel,cuda,cu$(shell nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1\2/p'),\
		$(PIP_COMMON_FLAGS) -Cbuild-dir=build-cuda -Ccmake.define.LMR_CUDA=ON \
		-Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$(CUDA_WHEEL_ARCHS)")

wheel: wheel-cpu
	@if command -v nvcc >/dev/null; then $(MAKE) --no-print-directory wheel-cuda; \
	else echo "no nvcc on PATH: the CPU wheel only"; fi
	@ls -l $(WHEEL_DIR)/*.whl

# With the build's packages: one apt-get for both in CI, which lints first.
lint-apt:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(APT_PACKAGES) $(LINT_APT_PACKAGES)"

lint: venv lint-apt
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python scripts/import_graph.py
	@echo "$(CLANG_FORMAT) --dry-run -Werror (C++ under include src python/bindings tools tests/cpp bench fuzz)"
	@$(CLANG_FORMAT) --dry-run -Werror $(FORMAT_FILES)
	@echo "no iostreams in liblmr or _core (they crashed inside _core next to torch)"
	@! grep -rnE '#include <(sstream|iostream|fstream|istream|ostream)>' include src python/bindings
	@$(MAKE) --no-print-directory lint-threads

format: venv lint-apt
	$(VENV)/bin/ruff check --fix .
	@echo "$(CLANG_FORMAT) -i (C++ under include src python/bindings tools tests/cpp bench fuzz)"
	@$(CLANG_FORMAT) -i $(FORMAT_FILES)

# Clang's thread-safety analysis over liblmr and its tools (lmr::Mutex, LMR_GUARDED_BY): syntax
# only, with the include paths of the real build; gcc builds ignore the annotations.
lint-threads: lint-apt
	@printf '%s\n' $(THREAD_CHECK_FILES) | xargs -P $(JOBS) -n 4 clang++ -std=c++20 -fsyntax-only \
	  -Wthread-safety -Wthread-safety-beta -Werror -Iinclude -Isrc -Itools/lmr-oobd -isystem third_party/gloo -DLMR_VERSION='"lint"'
	@echo "thread-safety analysis: clean"

# Fuzz with libFuzzer + ASan/UBSan (leaks included): the manifest, journal and artifact
# parsers, and the out-of-band daemons' wire protocol and peer messages; each target for
# FUZZ_SECONDS, or for FUZZ_RUNS inputs when given (make fuzz FUZZ_RUNS=10000000). New
# inputs land in build-fuzz/corpus/<target>.
FUZZ_TARGETS := manifest_fuzz oob_store_fuzz oob_message_fuzz
FUZZ_LIMIT = $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS),-max_total_time=$(FUZZ_SECONDS))
fuzz: apt
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(FUZZ_APT_PACKAGES)"
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DLMR_CUDA=OFF -DLMR_BUILD_FUZZERS=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined"
	cmake --build build-fuzz --target $(FUZZ_TARGETS) -j $(JOBS)
	mkdir -p $(addprefix build-fuzz/corpus/,$(FUZZ_TARGETS))
	build-fuzz/fuzz/manifest_fuzz build-fuzz/corpus/manifest_fuzz fuzz/corpus $(FUZZ_LIMIT) -max_len=4096 \
	  -dict=fuzz/json.dict
	build-fuzz/fuzz/oob_store_fuzz build-fuzz/corpus/oob_store_fuzz $(FUZZ_LIMIT) -max_len=2048
	build-fuzz/fuzz/oob_message_fuzz build-fuzz/corpus/oob_message_fuzz $(FUZZ_LIMIT) -max_len=2048 \
	  -dict=fuzz/json.dict

clean:
	rm -rf $(BUILD_DIR) build-fuzz dist *.egg-info
