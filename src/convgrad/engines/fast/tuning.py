"""The fast engine's tuning table: every threshold of the ``jit`` strategy and of its selection,
in one place, with the measurements behind it (docs/engine.md has the tables)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Tuning", "TUNING"]


@dataclass(frozen=True)
class Tuning:
    """Thresholds of the jit strategy (see :mod:`.jit` and :func:`convgrad.engines.fast._algorithm`)."""

    #: Output positions per chunk of the weights gradient's reduction (all taps and channel
    #: blocks run per chunk while its rows of x and dy are in cache).
    weights_positions: int = 512


TUNING = Tuning()
