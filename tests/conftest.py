"""Shared test helpers: fresh random data per case, PyTorch float64 autograd as outside oracle."""

from __future__ import annotations

import os

import numpy as np
import pytest

# A developer's own tuned plans (convgrad tune) must not change what the tests run; the plan
# cache's own tests turn it back on with a cache of their own.
os.environ["CONVGRAD_PLANS"] = "off"
os.environ.pop("CONVGRAD_AUTOTUNE", None)


#: Seconds of the slowest test files in a cold run (Zen 3, shared, one worker, the numba cache
#: empty, 2026-11-27, before the cuts of that day's second table in docs/testing.md; the rest take
#: under 15 s). ``make test`` hands whole files to its two workers in collection order (see
#: :func:`pytest_xdist_make_scheduler`); the longest start first, so that the short ones fill the
#: end and neither worker is left alone with a long file (xdist's own order, most tests first,
#: left files of few long tests such as the fuzz and property tests for the end).
COLD_SECONDS = {
    "test_depthwise.py": 256, "test_fast_engine.py": 181, "test_kernels.py": 116, "test_torch_convert.py": 111,
    "test_guarantees.py": 74, "test_conv_driver.py": 61, "test_reliability_fuzz.py": 59, "test_blis.py": 57,
    "test_strategies.py": 53, "test_plan_cache.py": 46, "test_engine_plans.py": 44, "test_reference_check.py": 32,
    "test_dask_arrays.py": 31, "test_reliability.py": 30, "test_jit_engine.py": 27, "test_fuzz_cli.py": 25,
    "test_pool.py": 23, "test_dask_cluster.py": 20, "test_readme.py": 19, "test_first_contact.py": 18,
    "test_properties.py": 16, "test_hostile_cli.py": 15,
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

