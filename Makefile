# Two entry points for a fresh machine (README): `make demo` and `make test`.
# Both create .venv on first use and install everything (torch CPU build first,
# pinned, so pip does not pull a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# First run only: ~2.9 GB in .venv (torch ~0.75 GB of it), about 5 min on a fast
# connection; pip prints what it downloads, so the step is never silent.
$(BIN)/.installed: pyproject.toml
	@echo "==> First run: installing into $(VENV) (~2.9 GB on disk, about 5 min; later runs skip this)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "==> [1/2] torch 2.13.0 (CPU build, the largest download)"
	$(BIN)/python -m pip install torch==2.13.0
	@echo "==> [2/2] channel-health and its dependencies (faust, chDB, sentence-transformers, test tools, extras incl. LiteLLM and OTel)"
	$(BIN)/python -m pip install -e '.[quality,test,tools,embedded,litellm,otel]'
	@echo "==> Installed: $$(du -sh $(VENV) | cut -f1) in $(VENV)"
	touch $@

.PHONY: install demo test test-all lint bench bench-cost
install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/channel-health demo

# The default suite leaves out the tests marked slow (long scenario sweeps, 20-seed and 40,000-message
# forms); each has a reduced form that runs by default. `make test-all` runs everything.
# Two pytest-xdist processes, one test file each at a time (--dist loadfile: a file's module and
# session fixtures are built once): the integration tests mostly wait on their broker, worker and
# chDB subprocesses, so the other process uses that time. Every test picks its own free port and
# tmp_path, so two run side by side. Wall times of both forms: docs/lab/test-suite.md.
PYTEST_PAR ?= -n 2 --dist loadfile
test: lint $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_PAR)

test-all: lint $(BIN)/.installed
	$(BIN)/python -m pytest -q $(PYTEST_PAR)

# ruff (faults, not style) and mypy (strict on the core packages), configured in pyproject.toml;
# each takes seconds (mypy about 40 s on a cold cache).
lint: $(BIN)/.installed
	$(BIN)/ruff check pipeline tests
	$(BIN)/mypy

bench: $(BIN)/.installed
	$(BIN)/channel-health bench --repeat 3 --json bench.json

# Instructions per event of the processor under valgrind's callgrind (a figure that does not move with the
# VM; docs/THROUGHPUT.md "Instructions per event"): three runs of ~70 s each on 2 vCPUs; needs valgrind.
bench-cost: $(BIN)/.installed
	$(BIN)/python -m pipeline.tools.bench.cost --repeat 3 --json bench-cost.json
