# LM Resiliency: every target does its own set-up and can be run again safely.
#   make demo   set-up, build, then a 4-rank CPU (gloo) DDP run with one corrupted rank
#   make test   set-up, build, C++ tests (ctest), Python tests (pytest)
#   make test-fast  the same without the tests that spawn multi-rank worlds
#   make bench  set-up, build with benchmarks, CPU benchmark ratios
#   make deps   Debian packages and the .venv only

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_DIR := build
APT_PACKAGES := libgtest-dev nlohmann-json3-dev libgloo-dev libbenchmark-dev ccache
JOBS ?= $(shell nproc)
# One persistent build tree serves pip, ctest and the benchmarks, so the sources compile once.
PIP_BUILD_FLAGS := --no-build-isolation --no-deps -q \
	-Cbuild-dir=$(BUILD_DIR) \
	-Ccmake.define.LMR_BUILD_TESTS=ON \
	-Ccmake.define.LMR_BUILD_BENCHMARKS=ON \
	-Ccmake.define.LMR_OOB=ON \
	-Ccmake.define.LMR_WERROR=ON


FUZZ_SECONDS ?= 120
FUZZ_APT_PACKAGES := clang libclang-rt-14-dev

.PHONY: deps apt apt-install venv build demo test test-fast test-cpp test-python bench fuzz clean

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

$(VENV)/.deps-stamp: requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.deps-stamp

build: deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install $(PIP_BUILD_FLAGS) .

demo: build
	$(VENV)/bin/lmr-demo

test-cpp: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

test-python: build
	$(PY) -m pytest -q tests/python

test: test-cpp test-python

test-fast: test-cpp
	$(PY) -m pytest -q -m "not distributed" tests/python

bench: build
	$(PY) bench/run_cpu_bench.py --build-dir $(BUILD_DIR)
	$(PY) bench/injection_overhead.py
	$(PY) bench/scout_overhead.py
	$(PY) bench/oob_overhead.py
	$(PY) bench/oob_latency.py

# Fuzz the manifest, journal and artifact parsers with libFuzzer + ASan/UBSan (leaks
# included) for FUZZ_SECONDS; new inputs land in build-fuzz/corpus.
fuzz: apt
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(FUZZ_APT_PACKAGES)"
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DLMR_CUDA=OFF -DLMR_BUILD_FUZZERS=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined"
	cmake --build build-fuzz --target manifest_fuzz -j $(JOBS)
	mkdir -p build-fuzz/corpus
	build-fuzz/fuzz/manifest_fuzz build-fuzz/corpus fuzz/corpus -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  -dict=fuzz/json.dict

clean:
	rm -rf $(BUILD_DIR) build-fuzz dist *.egg-info
