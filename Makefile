# `make demo` runs the main job, `make test` the tests. Also: `make fuzz`, the long fuzz run
# (FUZZ_EXAMPLES per fuzz test); `make bench`, the benchmark against PyTorch (writes
# benchmarks/RESULTS.md and benchmarks/results.png; BENCH_ARGS=--quick for a short check).
# All install what they need into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install -qq --disable-pip-version-check

.PHONY: demo test fuzz bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package and its runtime dependencies (NumPy, numba, ml_dtypes, click, rich).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) -e .
	touch $@

# Plus what the tests need: pytest, hypothesis, matplotlib and PyTorch 2.13.0 (CPU) as an oracle,
# JAX and scikit-learn for the framework tests and the digits example.
$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PIP) -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/convgrad demo

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 -q

FUZZ_EXAMPLES ?= 5000
fuzz: $(VENV)/.installed-test
	CONVGRAD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 2 -q --hypothesis-show-statistics \
		tests/test_*fuzz*.py

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
