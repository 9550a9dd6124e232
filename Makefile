# Two entry points for a fresh machine (README): `make demo` and `make test`.
# Both create .venv on first use and install everything (torch CPU build first,
# pinned, so pip does not pull a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[quality,test]'
	touch $@

.PHONY: install demo test bench
install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/channel-health demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

bench: $(BIN)/.installed
	$(BIN)/channel-health bench --repeat 3 --json bench.json
