# Two commands on a fresh Debian machine with Python 3.11, pip and apt:
#   make demo   - install, start the embedded stack, run the example batch job, stop
#   make test   - install, run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench redis-server install clean

install: $(STAMP)

$(STAMP): setup.py requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -e .
	touch $(STAMP)

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

demo: $(STAMP) redis-server
	$(PY) examples/demo.py

test: $(STAMP) redis-server
	$(PY) -m pytest

bench: $(STAMP) redis-server
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) bench/batch_overhead.py
	$(PY) bench/enqueue.py
	$(PY) bench/onnx_batch.py
	@command -v wrk >/dev/null 2>&1 || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
	[ -x bench/.venv-bentoml/bin/bentoml ] || { python3 -m venv bench/.venv-bentoml && \
	  bench/.venv-bentoml/bin/pip install --quiet --disable-pip-version-check -r bench/requirements-bentoml.txt; }
	$(PY) bench/realtime.py

clean:
	rm -rf $(VENV) build *.egg-info
