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
    #: per group on either side (per task). ResNet-50 3x3 layers, mb 16, f32 NXC, AVX2 (Zen 3),
    #: jit time / today's BLAS-based path, at 1 thread | 2 threads (shared, loaded machine):
    #: 64 ch: data 1.17 | 3.75, weights 1.19 | 1.53, forward 1.40 | 4.33;
    #: 128 ch: 1.03 | 4.29, 0.94 | 1.33, 1.29 | 3.48; 256 ch: 0.87 | 1.42, 0.80 | 1.06, 0.94 | 1.57;
    #: 512 ch: 0.70 | 0.93, 0.66 | 0.74, 0.87 | 0.89 (speed-ups; below 1 today's path is faster).
    #: Quieter re-run (load 2-3): 128 ch 0.93 | 1.85, 0.97 | 1.27, 1.12 | 2.39 (docs/engine.md).
    #: Those 2-thread figures alternated strategies call by call, which slows OpenBLAS's spinning
    #: threads; timed each in its own block after a pause (quiet machine, 2 threads, GFLOP/s jit vs
    #: best other): 64 ch data 83 / 61, weights 102 / 98, forward 113 / 74; 128 ch data 62 / 76,
    #: weights 75 / 80, forward 87 / 72; dilated 64->128 (11x11, D 3) data 26 / 56, weights 48 / 54.
    jit_channels: dict[str, int] = field(default_factory=lambda: {
        "forward": 128, "backward_data": 64, "backward_weights": 64})
    #: ... and for the gradients at least this many input channels per group (the lanes of
    #: backward data's vectors, the rows of the weights gradient's blocks): ResNet-50's 3-channel
    #: conv1 ran at 0.47 | 0.65 (data) and 0.70 | 2.24 (weights), its forward 1.61 | 5.87.
    jit_min_input_channels: int = 8
    #: Kernel families on which the rule selects the jit strategy at all: every family with JIT
    #: kernels (``portable`` has none).
    jit_families: tuple[str, ...] = ("avx512_bf16", "avx512", "avx2")

TUNING = Tuning()
