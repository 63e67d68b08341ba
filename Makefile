# One-command set-up: `make demo` and `make test` create .venv when missing and install into it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trainprof-installed

.PHONY: setup demo test lint clean bench-deps browser gpu-test

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
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# GPU acceptance, on a machine with CUDA, in one go: the `gpu`-marked tests (tests/gpu), then
# benchmarks/overhead.py and benchmarks/fix_efficacy.py on the GPU. Installs nothing beyond
# `make setup`. Everything printed is also kept in $(GPU_RESULTS)/ (gitignored), with the device
# and versions, for copying the figures into README.md. The benchmarks run even when a test
# fails; the target fails if any of the three did. On a GPU machine without package registries
# whose Python already has torch and trainprof's dependencies: `make gpu-test GPU_PY=python3`
# (no venv, no install; trainprof from this folder). GPU_BENCH=0 runs the tests alone.
# The tests' run folders (traces, metadata; no TensorBoard logs or HTML) are kept as
# $(GPU_RESULTS)/runs.tgz: a failure can then be diagnosed from its traces on any machine.
GPU_RESULTS ?= gpu-results
GPU_PY ?=
GPU_BENCH ?= 1
ifeq ($(GPU_PY),)
gpu-test: setup
GPU_RUN := $(PY)
else
GPU_RUN := PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY)
endif
gpu-test:
	@mkdir -p $(GPU_RESULTS)
	@$(GPU_RUN) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-test: torch sees no CUDA device (torch.cuda.is_available() is False)')"
	$(GPU_RUN) -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); [print(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]" | tee $(GPU_RESULTS)/device.txt
	@bash -o pipefail -c 'status=0; \
	  rm -rf $(GPU_RESULTS)/runs; \
	  $(GPU_RUN) -m pytest -m gpu -v -rs -p no:cacheprovider --basetemp=$(GPU_RESULTS)/runs tests/gpu 2>&1 | tee $(GPU_RESULTS)/tests.txt || status=1; \
	  [ ! -d $(GPU_RESULTS)/runs ] || tar czf $(GPU_RESULTS)/runs.tgz --exclude="*tfevents*" --exclude=plugins --exclude="*.html" -C $(GPU_RESULTS) runs && rm -rf $(GPU_RESULTS)/runs; \
	  if [ "$(GPU_BENCH)" != 0 ]; then \
	    $(GPU_RUN) benchmarks/overhead.py --device cuda 2>&1 | tee $(GPU_RESULTS)/overhead.txt || status=1; \
	    $(GPU_RUN) benchmarks/fix_efficacy.py --device cuda 2>&1 | tee $(GPU_RESULTS)/fix_efficacy.txt || status=1; \
	  fi; \
	  echo "make gpu-test: results in $(GPU_RESULTS)/"; exit $$status'

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
