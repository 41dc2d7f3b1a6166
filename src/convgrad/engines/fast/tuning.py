"""The fast engine's tuning table: every threshold of the ``jit`` strategy and of its selection,
in one place, with the measurements behind it (docs/engine.md has the tables)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Tuning", "TUNING"]


@dataclass(frozen=True)
class Tuning:
    """Thresholds of the jit strategy (see :mod:`.jit` and :func:`convgrad.engines.fast._algorithm`)."""

    #: Bytes of operands meant to stay in the (per-core L2) cache: the weights gradient reduces
    #: over chunks of output rows whose x and dy rows take about this much (all taps and channel
    #: blocks run per chunk); forward and backward data loop over the channel blocks outermost
    #: where the packed weights take more (Zen 3: 512 KiB L2 per core).
    cache_bytes: int = 256 << 10
    #: The weights gradient splits dw's blocks among the threads (each over all positions, no
    #: partial sums) where dw has more than this times the values of x and dy together (small
    #: images, many channels: ResNet-50's res4/res5), else the positions (partial dw per thread).
    weights_split: float = 0.25
    #: The jit strategy is selected for kernels of several taps with at most this many channels
    #: per group (either side), per task.
    jit_channels: dict[str, int] = field(default_factory=lambda: {
        "forward": 256, "backward_data": 256, "backward_weights": 256})
    #: ... and for backward data with at least this many input channels per group.
    jit_min_data_channels: int = 8


TUNING = Tuning()
