# `make demo` runs the main job, `make test` the tests, `make fuzz` the long fuzz run (FUZZ_EXAMPLES
# per fuzz test); all install what they need into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test fuzz install bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/convgrad demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

FUZZ_EXAMPLES ?= 5000
fuzz: $(STAMP)
	CONVGRAD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 2 -q --hypothesis-show-statistics \
		tests/test_reliability_fuzz.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
