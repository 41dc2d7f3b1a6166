"""Engines implement the three canonical problems; this module holds their interface and registry.

An engine receives canonical views (data ``(N, *X, C)``, weights ``(*K, ICg, OC)``) in the
inputs' dtype, never writes to them, and returns a canonical result in its accumulation dtype
(f32 or f64). Rounding to the output dtype and the user's layout happen in the API layer, so a new
engine (GPU, distributed) needs only these three methods.

An engine whose ``rounds`` attribute is true also takes ``out_dtype=`` (bf16/f16, or None): where
given, nothing is added to its result before it is rounded, and the engine may return the result
rounded once (to nearest even) to ``out_dtype`` itself, as its kernels store it, instead of the
accumulation dtype; the API rounds whatever comes back in the accumulation dtype.

An engine may also have ``workspace_bytes(g, task, dtype) -> int``: the peak bytes one call of
``task`` allocates, its result included. The memory guard (:mod:`convgrad.limits`) uses it before
the engine runs, and a conservative estimate for engines without it. It must be a closed form of
the sizes (no loop over taps, rows or elements), so that an absurd problem fails at once.

An engine may also have ``weights_in_format(array, weights_format) -> np.ndarray``: its canonical
weights result as :func:`convgrad.layout.weights_in_format` returns it (the API calls it instead).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..environment import env
from ..errors import EngineError
from ..problem import ConvGeometry

__all__ = ["Engine", "register", "get_engine", "available_engines", "set_default_engine", "default_engine_name"]


class Engine(Protocol):
    """The three canonical convolution problems (see :mod:`convgrad.problem`)."""

    name: str

    def forward(self, g: ConvGeometry, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """y (N, *O, OC) = conv(x (N, *I, IC), w (*K, ICg, OC))."""

    def backward_data(self, g: ConvGeometry, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        """dx (N, *I, IC) = d<conv(x, w), dy>/dx."""

    def backward_weights(self, g: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """dw (*K, ICg, OC) = d<conv(x, w), dy>/dw."""


_ENGINES: dict[str, Engine] = {}
_default: list[str] = []


def register(engine: Engine, default: bool = False) -> Engine:
    """Add an engine to the registry (optionally making it the default)."""
    _ENGINES[engine.name] = engine
    if default or not _default:
        _default[:] = [engine.name]
    return engine


def available_engines() -> list[str]:
    """Names of the registered engines."""
    return sorted(_ENGINES)


def default_engine_name() -> str:
    """The engine used when none is named: ``CONVGRAD_ENGINE`` if set, else the registry default."""
    return env("CONVGRAD_ENGINE") or _default[0]


def set_default_engine(name: str) -> None:
    """Make ``name`` the engine used when none is named."""
    get_engine(name)
    _default[:] = [name]


def get_engine(name: str | Engine | None = None) -> Engine:
    """The engine called ``name`` (an engine object passes through; ``None`` is the default)."""
    if name is None:
        name = default_engine_name()
    if not isinstance(name, str):
        if all(callable(getattr(name, m, None)) for m in ("forward", "backward_data", "backward_weights")):
            return name
        raise EngineError(None, f"engine {name!r} is neither a name nor an engine object: expected one of "
                          + ", ".join(available_engines()))
    engine = _ENGINES.get(name)
    if engine is None:
        raise EngineError(None, f"unknown engine {name!r}: expected one of " + ", ".join(available_engines()))
    return engine


from . import reference  # noqa: E402,F401  (registers itself)
from . import fast  # noqa: E402,F401  (registers itself as the default)
