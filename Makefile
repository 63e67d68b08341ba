# One-command set-up: `make demo` and `make test` create .venv when missing and install into it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trainprof-installed

.PHONY: setup demo test lint clean

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

clean:
	rm -rf runs .pytest_cache
