# slurm-gpu: set-up, tests and demo on one Debian 12 machine (as root).
#
#   make demo      install what is needed, start the local cluster, run the demo jobs
#   make test      install what is needed, start the local cluster, run unit + cluster tests
#   make lint      ruff, mypy, the layering contracts (import-linter) and shellcheck
#   make graph     the import graph's figures: modules, layers, upward imports, loops
#   make dist      the release files: dist/slurm_gpu-VERSION-py3-none-any.whl and the sdist
#   make deps | venv | cluster-up | cluster-down | lab-up | lab-down | bench
#
# Targets run their prerequisites in order (never in parallel): the cluster needs the venv
# (its hooks run the venv's interpreter) and the venv needs python3-venv from deps.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.NOTPARALLEL:
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= test,dev,postgresql,stacks,web
PYTEST_ARGS ?=
TC_ROOT ?= /var/lib/slurm-gpu-testcluster
# make demo serves each demo job's web page on this loopback port after the run (docs/web.md).
WEB_PORT ?= 8080
# Everything that installs packages or starts daemons needs root; use sudo when not root.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: help deps venv cluster-up cluster-down lab-up lab-down test lint graph demo bench dist

# $(call quiet,COMMAND): run an install step, showing its output (pip's notices, setuptools'
# banners) only when it fails.
quiet = log=$$(mktemp); if $(1) >"$$log" 2>&1; then rm -f "$$log"; else rc=$$?; \
    cat "$$log" >&2; rm -f "$$log"; echo "make: failed: $(1)" >&2; exit $$rc; fi

help:
	@sed -n '1,11p' Makefile | sed 's/^# \{0,1\}//'

# The release files sites install by file (README "Install on a real cluster"): a wheel and
# an sdist in $(DIST), built with the venv's Python when there is one, else $(PYTHON) (3.11+,
# with pip; pip fetches the build backend, setuptools and wheel, from the package index).
DIST ?= dist
DIST_PYTHON := $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
dist:
	rm -f $(DIST)/slurm_gpu-*.whl $(DIST)/slurm-gpu-*.tar.gz $(DIST)/slurm_gpu-*.tar.gz
	$(DIST_PYTHON) -m pip wheel -q --no-deps -w $(DIST) .
	$(DIST_PYTHON) -c 'import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])' $(DIST) >/dev/null
	rm -rf build slurm_gpu.egg-info
	@ls -1 $(DIST)/slurm_gpu-*.whl $(DIST)/slurm-gpu-*.tar.gz

deps:
	$(SUDO) share/testcluster/install-deps

# The web page's chart library, unpacked from npm (docs/web.md); without npm, nothing.
UPLOT := slurm_gpu/web/static/vendor/uplot/VERSION

venv: $(STAMP) $(UPLOT)

$(UPLOT): share/web/fetch-uplot
	share/web/fetch-uplot

# Re-installs only when the packaging metadata changed since the last install. The editable
# install is setuptools' compat mode: a path in a .pth file. Its default mode adds an import
# hook that every interpreter of the virtualenv imports at start (with pathlib and more), which a
# wheel install never has; the hooks, gpueff and the benchmarks start interpreters from here
# (docs/performance.md, "The development install's start-up").
$(STAMP): setup.cfg pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV) || { \
	    echo "make: cannot create $(VENV); run 'make deps' (python3-venv)" >&2; exit 1; }
	@echo "installing slurm-gpu[$(EXTRAS)] into $(VENV) (output shown only on failure) ..."
	@$(call quiet,$(VENV)/bin/python -m pip install --upgrade pip)
	@$(call quiet,$(VENV)/bin/python -m pip install --config-settings editable_mode=compat -e '.[$(EXTRAS)]')
	@rm -f $(VENV)/.installed-*
	touch $@

# Bytecode and the records' generated methods for every module first: the cluster's users
# (sgtest1, sgtest2) cannot write slurm_gpu/__pycache__, so what root never compiled there would
# be compiled at each of their runs.
cluster-up: venv
	$(VENV)/bin/python -m slurm_gpu.precompile
	$(SUDO) env VENV="$(abspath $(VENV))" share/testcluster/start

cluster-down:
	$(SUDO) share/testcluster/stop

# The version lab (Slurm 24.11 and 26.05, three compute hosts each; docs/testcluster.md). The
# lab tests start it themselves; these targets are for working with it by hand.
lab-up: deps venv
	$(SUDO) env BUILD_PYTHON="$(abspath $(VENV))/bin/python" share/testlab/start

lab-down:
	$(SUDO) share/testlab/stop

test: deps venv cluster-up
	$(VENV)/bin/pytest $(PYTEST_ARGS)

SHELL_SCRIPTS = $(shell git ls-files 2>/dev/null | while read -r f; do \
	    [ -f "$$f" ] && head -n1 "$$f" | grep -Eq '^#!.*(/|env )(ba)?sh\b' && echo "$$f"; done)

# Runs every checker, then fails if any of them failed.
lint: venv
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	$(VENV)/bin/lint-imports || status=1; \
	if command -v shellcheck >/dev/null; then \
	    echo "shellcheck $(SHELL_SCRIPTS)"; shellcheck $(SHELL_SCRIPTS) || status=1; \
	else echo "make: shellcheck is not installed (make deps); shell scripts not checked" >&2; fi; \
	exit $$status

# Figures only (exit 0): `make lint` enforces the same layers with lint-imports.
graph: venv
	$(VENV)/bin/python share/dev/importgraph.py

demo: deps venv cluster-up
	$(VENV)/bin/slurm-gpu --config $(TC_ROOT)/slurm-gpu.toml demo run --serve-web $(WEB_PORT)

bench: deps venv cluster-up
	@if [ -x benchmarks/run ]; then benchmarks/run; \
	else echo "make: benchmarks/run does not exist; nothing to run" >&2; fi
