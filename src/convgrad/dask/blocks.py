"""How a convolution splits into blocks along a spatial axis: pure arithmetic, no dask.

Per spatial axis: input size I (x), output size O (y), stride S, pads PB, effective kernel
EK = (K-1)*D + 1. Output position o reads the window ``x[o*S - PB, o*S - PB + EK)`` (positions
outside ``[0, I)`` are padding). A split is a list of output boundaries
``0 = o_0 < o_1 < ... < o_m = O`` and the input boundaries ``i_j = o_j*S - PB`` (``i_0 = 0``,
``i_m = I``), both strictly inside their axes: x block ``j = [i_j, i_{j+1})`` holds the window
starts of y block ``j = [o_j, o_{j+1})``, so chunk boundaries are aligned to the stride.

- y block j (forward, and its share of the weights gradient) reads
  ``x[o_j*S - PB, (o_{j+1}-1)*S - PB + EK)``: its own x block and the first ``EK - S`` elements of
  the next one (a right halo; none when EK <= S, when the block reads less than it holds).
- x block j (data gradient) receives from ``y[o_j - floor((EK-1)/S), o_{j+1})``: its own y block and
  ``floor((EK-1)/S)`` elements of the previous one (a left halo).

A block is itself a convolution on its window range ``[lo, hi)``, ``lo = oa*S - PB``,
``hi = (ob-1)*S - PB + EK``, over ``x[max(lo, 0), min(hi, I))`` with pads ``max(0, -lo)`` and
``max(0, hi - I)``: ``floor((hi - lo - EK)/S) + 1 = ob - oa`` outputs, exactly those of the block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Window", "AxisSplit", "split_axis", "boundaries"]


@dataclass(frozen=True)
class Window:
    """The sub-convolution of the outputs ``[oa, ob)``: it reads ``x[a, b)`` with pads ``pb``, ``pe``."""

    oa: int
    ob: int
    a: int
    b: int
    pb: int
    pe: int

    @property
    def empty(self) -> bool:
        """Whether the windows read only padding (their outputs are 0)."""
        return self.a == self.b


@dataclass(frozen=True)
class AxisSplit:
    """One spatial axis split into aligned blocks (see the module docstring)."""

    o: tuple[int, ...]  # output boundaries, 0 ... O
    i: tuple[int, ...]  # input boundaries, 0 ... I
    stride: int
    pad_begin: int
    eff_kernel: int
    in_size: int

    @property
    def blocks(self) -> int:
        return len(self.o) - 1

    @property
    def right_halo(self) -> int:
        """x elements a y block reads from the next x block."""
        return max(0, self.eff_kernel - self.stride)

    @property
    def left_halo(self) -> int:
        """y elements an x block receives from the previous y block."""
        return (self.eff_kernel - 1) // self.stride

    def o_sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.o, self.o[1:]))

    def i_sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.i, self.i[1:]))

    def window(self, oa: int, ob: int) -> Window:
        """The sub-convolution of outputs ``[oa, ob)``."""
        lo = oa * self.stride - self.pad_begin
        hi = (ob - 1) * self.stride - self.pad_begin + self.eff_kernel
        a = max(lo, 0)
        b = max(a, min(hi, self.in_size))  # a == b: the windows lie in the padding
        return Window(oa, ob, a, b, a - lo, hi - b)

    def output_window(self, j: int) -> Window:
        """What y block j reads (forward, weights gradient)."""
        return self.window(self.o[j], self.o[j + 1])

    def data_window(self, j: int) -> Window:
        """The y range x block j receives from (with the left halo), as a window."""
        start = self.o[j] - self.left_halo if j else 0
        return self.window(start, self.o[j + 1])


def boundaries(chunks: Sequence[int]) -> tuple[int, ...]:
    """The internal boundaries of a dask chunk tuple: ``(2, 3, 4) -> (2, 5)``."""
    return tuple(accumulate(chunks))[:-1]


def split_axis(cuts: Sequence[int], *, in_size: int, out_size: int, stride: int, pad_begin: int,
               eff_kernel: int, cuts_in: str, halo: str) -> AxisSplit:
    """An aligned split of one axis near the internal boundaries ``cuts`` of the input chunks
    (``cuts_in="x"``: input boundary c becomes output boundary ``c // S``, so input chunks that are
    multiples of the stride give regular output chunks, and input boundary ``(c // S)*S - PB``)
    or of the output chunks (``cuts_in="y"``). Boundaries that would leave the axis or make a block smaller than its halo
    (``halo="right"``: x blocks at least EK - S; ``"left"``: y blocks at least floor((EK-1)/S))
    are dropped, merging blocks: a neighbour holds all of every halo."""
    s, pb = stride, pad_begin
    outs = sorted({c // s if cuts_in == "x" else c for c in cuts})
    outs = [o for o in outs if 0 < o < out_size and 0 < o * s - pb < in_size]
    trial = AxisSplit((0, *outs, out_size), (0, *(o * s - pb for o in outs), in_size), s, pb, eff_kernel, in_size)
    need = trial.right_halo if halo == "right" else trial.left_halo
    edges = trial.i if halo == "right" else trial.o
    kept: list[int] = []  # indices into outs
    last = 0
    for index, o in enumerate(outs):
        if edges[index + 1] - edges[last] >= need:
            kept.append(index)
            last = index + 1
    if kept and edges[-1] - edges[kept[-1] + 1] < need:
        kept.pop()
    outs = [outs[k] for k in kept]
    return AxisSplit((0, *outs, out_size), (0, *(o * s - pb for o in outs), in_size), s, pb, eff_kernel, in_size)
