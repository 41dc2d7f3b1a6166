"""Shared test helpers: fresh random data per case, PyTorch float64 autograd as outside oracle."""

from __future__ import annotations

import os

import numpy as np
import pytest

# A developer's own tuned plans (convgrad tune) must not change what the tests run; the plan
# cache's own tests turn it back on with a cache of their own.
os.environ["CONVGRAD_PLANS"] = "off"
os.environ.pop("CONVGRAD_AUTOTUNE", None)


#: Seconds of the slowest test files in a cold ``make test`` (Zen 3, shared, 2 cores, a fresh
#: clone at de49c94, 2026-11-27; the rest take under 15 s). ``make test`` hands whole files to its
#: two workers in collection order (see :func:`pytest_xdist_make_scheduler`); the longest start
#: first, so that the short ones fill the end and neither worker is left alone with a long file
#: (xdist's own order, most tests first, left files of few long tests such as the fuzz and
#: property tests for the end).
COLD_SECONDS = {
    "test_depthwise.py": 253, "test_fast_engine.py": 164, "test_kernels.py": 99, "test_reliability_fuzz.py": 74,
    "test_torch_convert.py": 64, "test_tiles.py": 110, "test_conv_driver.py": 63, "test_blis.py": 63, "test_guarantees.py": 41,
    "test_reliability.py": 38, "test_pool.py": 38, "test_engine_plans.py": 30, "test_dask_arrays.py": 29,
    "test_strategies.py": 29, "test_jit_engine.py": 28, "test_fuzz_cli.py": 26, "test_properties.py": 25,
    "test_readme.py": 23, "test_jax_interop.py": 21, "test_reference_check.py": 20, "test_plan_cache.py": 19,
    "test_hostile_cli.py": 17,
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` in the collection's order (:data:`COLD_SECONDS`), not xdist's (most
    tests first)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def schedule(self) -> None:
            self.config.option.loadscopereorder = False
            super().schedule()

    return LongestFirst(config, log)


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`COLD_SECONDS`). Cases marked ``exhaustive`` (the rest of a
    cross product of kernel variants, whose code paths the default suite runs with fewer compiled
    kernels: each variant costs seconds of numba compilation on a fresh checkout) run only with
    ``CONVGRAD_EXHAUSTIVE=1`` (``make test-all``); the default suite deselects them."""
    items.sort(key=lambda item: -COLD_SECONDS.get(item.path.name, 0))
    if os.environ.get("CONVGRAD_EXHAUSTIVE") == "1":
        return
    kept = [item for item in items if item.get_closest_marker("exhaustive") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("exhaustive")])
        items[:] = kept


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, unseeded generator per test (random non-zero inputs, fresh per case)."""
    return np.random.default_rng()


@pytest.fixture
def poisoned_empty(monkeypatch):
    """convgrad's ``np.empty`` allocations (outputs, workspaces) NaN-filled for the test, so that a
    missing write shows in the result (see poison.py)."""
    from poison import poison
    poison(monkeypatch.setattr)

