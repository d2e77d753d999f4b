# LM Resiliency: every target does its own set-up and can be run again safely.
#   make demo   set-up, build, then a 4-rank CPU (gloo) DDP run with one corrupted rank
#   make test   set-up, build, C++ tests (ctest), Python tests (pytest)
#   make bench  set-up, build with benchmarks, CPU benchmark ratios
#   make deps   Debian packages and the .venv only

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_DIR := build
APT_PACKAGES := libgtest-dev nlohmann-json3-dev libbenchmark-dev ccache
JOBS ?= $(shell nproc)
# One persistent build tree serves pip, ctest and the benchmarks, so the sources compile once.
PIP_BUILD_FLAGS := --no-build-isolation --no-deps -q \
	-Cbuild-dir=$(BUILD_DIR) \
	-Ccmake.define.LMR_BUILD_TESTS=ON \
	-Ccmake.define.LMR_BUILD_BENCHMARKS=ON


.PHONY: deps apt venv build demo test test-cpp test-python bench clean

deps: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
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

bench: build
	$(PY) bench/run_cpu_bench.py --build-dir $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) dist *.egg-info
