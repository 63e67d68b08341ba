# One-command set-up: `make demo` and `make test` create .venv when missing and install into it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trainprof-installed

.PHONY: setup demo test lint clean bench-deps browser

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/trainprof run examples/quickstart.py

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check .

# Headless Chromium for the browser tests (Debian's package), when missing and we are root.
# Best effort: it never fails the build; without it those tests skip and say why.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make browser: installing chromium for the browser tests"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
	    >/dev/null 2>&1 || echo "make browser: chromium not installed; browser tests will skip"; \
	fi

# HolisticTraceAnalysis for benchmarks/diagnose_speed.py, in its own venv (it pulls in jupyterlab).
bench-deps:
	test -x .venv-bench/bin/python || python3 -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q HolisticTraceAnalysis

clean:
	rm -rf runs .pytest_cache
