# One-command set-up: `make demo` and `make test` create .venv when missing and install into it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trainprof-installed

.PHONY: setup demo test lint clean bench-deps

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

# HolisticTraceAnalysis for benchmarks/diagnose_speed.py, in its own venv (it pulls in jupyterlab).
bench-deps:
	test -x .venv-bench/bin/python || python3 -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q HolisticTraceAnalysis

clean:
	rm -rf runs .pytest_cache
