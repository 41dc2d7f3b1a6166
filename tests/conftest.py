"""Shared test helpers: fresh random data per case, PyTorch float64 autograd as outside oracle."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, unseeded generator per test (random non-zero inputs, fresh per case)."""
    return np.random.default_rng()
