# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned to the CPU build: an unpinned torch pulls a multi-GB CUDA wheel.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

.PHONY: venv demo test bench clean
venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ledger demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not gpu"

clean:
	rm -rf $(VENV) .pytest_cache
