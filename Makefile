# `make demo` runs the main job, `make test` the tests; both install what they need into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/convgrad demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
