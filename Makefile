# `make demo` runs the main job, `make test` the tests. Also: `make fuzz`, the long fuzz run
# (FUZZ_EXAMPLES per fuzz test); `make bench`, the benchmark against PyTorch (writes
# benchmarks/RESULTS.md and benchmarks/results.png; BENCH_ARGS=--quick for a short check).
# `make test-all`, the tests with every case of the kernels' cross products (CONVGRAD_EXHAUSTIVE=1:
# the cases marked `exhaustive`, which `make test` leaves out to stay within ~10 minutes).
# `make mutate`, mutation testing (mutmut) of the modules in MUTATE_MODULES (docs/testing.md).
# All install what they need into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install -qq --disable-pip-version-check

.PHONY: demo test test-all fuzz bench mutate install clean

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
	$(BIN)/python -m pytest -n 2 --dist loadfile -q

test-all: $(VENV)/.installed-test
	CONVGRAD_EXHAUSTIVE=1 $(BIN)/python -m pytest -n 2 --dist loadfile -q

FUZZ_EXAMPLES ?= 5000
fuzz: $(VENV)/.installed-test
	CONVGRAD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 2 -q --hypothesis-show-statistics \
		tests/test_*fuzz*.py

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# Mutation testing (issue 26, docs/testing.md): mutmut (pinned, the `mutate` extra) mutates the
# modules below (paths under src/convgrad/, without .py) one change at a time and runs, for each
# mutant, the tests among MUTATE_TESTS that reach the mutated function; survivors are printed.
# Not part of `make test`. Run it before an engine change lands, one area at a time (the runs
# of record in docs/testing.md, on 2 cores: 8, 2, 2 and 27 minutes):
#   make mutate MUTATE_MODULES=problem MUTATE_TESTS="$(PROBLEM_TESTS)"
#   make mutate MUTATE_MODULES=layout MUTATE_TESTS=tests/test_layout.py
#   make mutate MUTATE_MODULES=limits MUTATE_TESTS="tests/test_limits.py tests/test_reference_check.py"
#   make mutate MUTATE_MODULES="$(ENGINE_MODULES)" MUTATE_TESTS="$(ENGINE_TESTS)" MUTATE_SAMPLE=20
# MUTATE_SELECT: mutant names to run (e.g. "convgrad.engines.fast.plan.*"; default all).
# MUTATE_SAMPLE=K: about one mutant in K of every function (at least one each), seeded by
# MUTATE_SEED (tests/mutation_sample.py); the engine's run of docs/testing.md is K=10.
PROBLEM_TESTS := tests/test_problem.py tests/test_transpose_sizes.py tests/test_errors.py tests/test_grid.py \
	tests/test_api.py
ENGINE_MODULES := engines/fast/__init__ engines/fast/plan engines/fast/features engines/fast/geometry \
	engines/fast/gemm engines/fast/frame engines/fast/kernels engines/fast/output_rows engines/fast/pointwise \
	engines/fast/columns engines/fast/direct engines/fast/depthwise engines/fast/jit engines/fast/plan_cache
ENGINE_TESTS := tests/test_strategies.py tests/test_engine_plans.py tests/test_plan_cache.py \
	tests/test_jit_engine.py tests/test_fast_engine.py \
	tests/test_guarantees.py::test_a_nonfinite_weight_or_gradient_next_to_padding
MUTATE_MODULES ?= problem layout limits $(ENGINE_MODULES)
MUTATE_TESTS ?= $(PROBLEM_TESTS) tests/test_limits.py tests/test_layout.py $(ENGINE_TESTS)
MUTATE_SELECT ?=
# MUTATE_DESELECT: a pytest -k expression of tests to leave out (default none). The allocation
# bounds run too, with MUTATION_SLACK (tests/engine_support.py) for mutmut's own allocations.
MUTATE_DESELECT ?=
MUTATE_CHILDREN ?= 2
MUTATE_SAMPLE ?=
MUTATE_SEED ?= 0

$(VENV)/.installed-mutate: pyproject.toml $(VENV)/.installed-test
	$(PIP) -e '.[mutate]'
	touch $@

# mutmut reads its settings from setup.cfg (generated here from the variables above; ignored by git).
# It forks each mutant's test run from a process that has run convolutions: numba's default OpenMP
# threading layer terminates such a child ("fork() called from a process already using GNU
# OpenMP"), so mutation runs use numba's fork-safe workqueue layer.
mutate: export NUMBA_THREADING_LAYER = workqueue
mutate: $(VENV)/.installed-mutate
	rm -rf mutants
	{ echo '[mutmut]'; echo 'source_paths=src/'; echo 'only_mutate='; \
	  for m in $(MUTATE_MODULES); do echo "    src/convgrad/$$m.py"; done; \
	  echo 'pytest_add_cli_args_test_selection='; for t in $(MUTATE_TESTS); do echo "    $$t"; done; \
	  $(if $(MUTATE_DESELECT),echo 'pytest_add_cli_args='; echo '    -k'; echo '    $(MUTATE_DESELECT)';) } > setup.cfg
ifdef MUTATE_SAMPLE
	@echo "generating the mutants and mapping the tests to functions (a run that names no mutant)"; mkdir -p mutants
	$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) no-mutant-generate-only > mutants/generate.log 2>&1 || true
	$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) \
	  $$($(BIN)/python tests/mutation_sample.py $(MUTATE_SAMPLE) $(MUTATE_SEED)) || true
else
	$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) $(MUTATE_SELECT) || true
endif
	$(BIN)/mutmut results | grep -v ': not checked$$' || true
	$(BIN)/mutmut results --all true | awk -F': ' '{n[$$2]++} END {for (s in n) print n[s], s}'

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis mutants setup.cfg
