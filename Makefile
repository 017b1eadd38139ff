# The two commands of the README:
#   make demo   set up .venv and run the main job on a synthetic JPEG set made on the spot
#   make test   set up .venv with the test extras (and redis-server) and run the test suite
# Both work on a fresh clone; CI (.ci/run) calls `make test`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A torch that real GPU users satisfy is in pyproject; when no torchvision is installed yet,
# this pair (on this machine's disk; PyPI's torchvision does not pair with the CPU build
# 2.13.0) is installed first: the benchmarks and tests compare against torchvision's own
# pipelines and run users' torchvision transforms.
TORCH_BOOTSTRAP ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=
# Two pytest-xdist processes, each taking a whole test file at a time (module fixtures such as
# a file's uploads stay in one process): the suite spends about half its time waiting on
# subprocesses and servers, and ran in 12.5 min this way against 23.7 in one process on the
# 2-core test machine. PYTEST_JOBS= runs it in one process.
PYTEST_JOBS ?= -n 2 --dist loadfile

.PHONY: demo test setup setup-test system-deps clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

setup: $(VENV)/bin/python
	$(PY) -c "import torchvision" 2>/dev/null || $(PIP) install --quiet $(TORCH_BOOTSTRAP)
	$(PIP) install --quiet -e .

setup-test: $(VENV)/bin/python system-deps
	$(PY) -c "import torchvision" 2>/dev/null || $(PIP) install --quiet $(TORCH_BOOTSTRAP)
	$(PIP) install --quiet -e ".[test]"

# Debian packages the tests drive for real: redis-server (shared cache tier) and fio
# (the storage benchmark's reference), and libjpeg62-turbo-dev, whose jpeglib.h the region
# JPEG decoder (fastload/data/_jpeg.c) builds against. Installed only when missing.
system-deps:
	@PKGS=""; \
	command -v redis-server >/dev/null && command -v fio >/dev/null || PKGS="redis-server fio"; \
	[ -e /usr/include/jpeglib.h ] || PKGS="$$PKGS libjpeg62-turbo-dev"; \
	[ -z "$$PKGS" ] || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$PKGS >/dev/null; }

demo: setup
	$(PY) benchmarks/loader_throughput.py

# lint-imports checks the layer contracts of pyproject.toml and exits 1 on a break, which
# stops the target before pytest runs.
test: setup-test
	$(VENV)/bin/lint-imports --no-logo --no-cache
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_JOBS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .fastload-data build *.egg-info
