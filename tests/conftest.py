"""Shared test helpers: fresh random data per case, PyTorch float64 autograd as outside oracle."""

from __future__ import annotations

import numpy as np
import pytest


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

