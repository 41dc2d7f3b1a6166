"""Shared test helpers: fresh random data per case, PyTorch float64 autograd as outside oracle."""

from __future__ import annotations

import os

import numpy as np
import pytest

# A developer's own tuned plans (convgrad tune) must not change what the tests run; the plan
# cache's own tests turn it back on with a cache of their own.
os.environ["CONVGRAD_PLANS"] = "off"
os.environ.pop("CONVGRAD_AUTOTUNE", None)


def pytest_collection_modifyitems(config, items):
    """Cases marked ``exhaustive`` (the rest of a cross product of kernel variants, whose code
    paths the default suite runs with fewer compiled kernels: each variant costs seconds of
    numba compilation on a fresh checkout) run only with ``CONVGRAD_EXHAUSTIVE=1`` (``make
    test-all``); the default suite deselects them."""
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

