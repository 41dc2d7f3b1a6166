"""Comparing a result with the reference engine in bounded memory.

A convolution is checked slab by slab: the reference engine runs on sub-problems of a few images
or a few rows of the first spatial axis, and each slab's reference is compared as it comes, so a
case needs the graph's own tensors plus about :data:`SLAB_BYTES`, whatever its size (a 853M-value
depthwise layer runs in 7 GiB instead of 40). Each slab is an exact part of the problem:

- forward: output rows ``[o0, o1)`` read the padded input rows ``[o0*S, (o1-1)*S + (K-1)*D + 1)``;
  the slab is the convolution of that window (the part of it outside the input is its padding);
- backward_weights: the same windows; dw is the sum of the slabs' weight gradients;
- backward_data: input rows ``[i0, i1)`` receive only from the output rows whose windows reach
  them, ``[ceil((i0 + PB - (K-1)*D) / S), floor((i1 - 1 + PB) / S) + 1)``; the slab is the data
  gradient of those outputs' window, cropped to ``[i0, i1)`` (rows it does not reach are 0).

The error is ``max |got - want| / max |want|`` over the finite reference values (NaN, a failure,
where a non-finite value disagrees: NaN against NaN and an infinity against the same one agree),
accumulated over the slabs (:class:`ErrorMeter`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from ..engines.reference import ReferenceEngine
from ..execution import round_result
from ..limits import memory_budget
from ..layout import data_to_canonical, weights_to_canonical
from ..problem import ConvGeometry, Problem

__all__ = ["SLAB_BYTES", "blocks", "ErrorMeter", "slab_bytes", "relative_error", "convolution_error", "check_bytes"]

#: Reference workspace aimed at per slab, at most (a slab of one row of one image may need more).
SLAB_BYTES = 256 * 2**20
#: ... and at most this fraction of the memory budget.
_BUDGET_SHARE = 16
#: Values converted to float64 at once when comparing.
_BLOCK_VALUES = 2**22
_REFERENCE = ReferenceEngine()


def blocks(shape: tuple[int, ...], limit: int = _BLOCK_VALUES) -> Iterator[tuple[int | slice, ...]]:
    """Indices that split an array of ``shape`` along its leading axes into blocks of at most
    ``limit`` values (or single rows of the innermost axis)."""
    if math.prod(shape) <= limit or len(shape) <= 1:
        yield ()
        return
    inner = math.prod(shape[1:])
    if inner <= limit:
        step = limit // inner
        for start in range(0, shape[0], step):
            yield (slice(start, start + step),)
        return
    for i in range(shape[0]):
        for rest in blocks(shape[1:], limit):
            yield (i, *rest)


@dataclass
class ErrorMeter:
    """``max |got - want| / max |want|`` over the finite values of ``want``, accumulated over pieces."""

    difference: float = 0.0
    scale: float = 0.0
    disagree: bool = False

    def add(self, got: np.ndarray, want: np.ndarray) -> None:
        """Compare one piece (any float dtypes; converted to float64 a block at a time)."""
        for index in blocks(want.shape):
            g, w = np.asarray(got[index], np.float64), np.asarray(want[index], np.float64)
            finite = np.isfinite(w)
            agree = np.where(finite, np.isfinite(g), (g == w) | (np.isnan(g) & np.isnan(w)))
            self.disagree |= not bool(np.all(agree))
            if finite.any():
                self.scale = max(self.scale, float(np.max(np.abs(w[finite]))))
                self.difference = max(self.difference, float(np.max(np.abs(g[finite] - w[finite]))))

    @property
    def value(self) -> float:
        return math.nan if self.disagree else self.difference / (self.scale or 1.0)


def slab_bytes() -> int:
    """The reference workspace aimed at per slab: :data:`SLAB_BYTES`, or 1/16 of a smaller budget."""
    return max(1, min(SLAB_BYTES, memory_budget() // _BUDGET_SHARE))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over the finite reference values; NaN (a failure) where a
    non-finite value disagrees (NaN against NaN and an infinity against the same one agree)."""
    meter = ErrorMeter()
    meter.add(got, want)
    return meter.value


@dataclass(frozen=True)
class _Slab:
    """One sub-problem: its geometry (None: no output reaches these rows), the images it covers,
    the rows of x and y it reads or writes, and the rows of the result it gives (y rows forward,
    x rows backward_data)."""

    geometry: ConvGeometry | None
    images: slice
    x_rows: slice
    y_rows: slice
    rows: slice


def _window(g: ConvGeometry, images: slice, o0: int, o1: int) -> tuple[ConvGeometry, slice]:
    """The sub-problem of output rows ``[o0, o1)`` (first spatial axis) of ``images``, and the
    input rows it covers."""
    s, d, k, pb, size = g.strides[0], g.dilations[0], g.kernel[0], g.pads_begin[0], g.in_size[0]
    start, end = o0 * s, (o1 - 1) * s + (k - 1) * d + 1  # padded rows the outputs read
    low = min(max(start, pb), end)
    high = max(low, min(end, pb + size))
    first = min(max(low - pb, 0), size)
    sub = replace(g, n=images.stop - images.start, in_size=(high - low, *g.in_size[1:]),
                  out_size=(o1 - o0, *g.out_size[1:]), pads_begin=(low - start, *g.pads_begin[1:]),
                  pads_end=(end - high, *g.pads_end[1:]))
    return sub, slice(first, first + high - low)


def _reaching(g: ConvGeometry, i0: int, i1: int) -> tuple[int, int]:
    """Output rows whose windows reach input rows ``[i0, i1)``."""
    s, d, k, pb = g.strides[0], g.dilations[0], g.kernel[0], g.pads_begin[0]
    first = max(0, -((-(i0 + pb - (k - 1) * d)) // s))
    return first, min(g.out_size[0], (i1 - 1 + pb) // s + 1)


def _ranges(g: ConvGeometry, rows: int, slab_bytes: int) -> Iterator[tuple[slice, slice]]:
    """(images, rows) ranges of about ``slab_bytes`` of reference workspace each."""
    if g.n == 0 or rows == 0:
        return
    per_image = max(_REFERENCE.workspace_bytes(replace(g, n=1), "", np.dtype(np.float64)), 1)
    if per_image <= slab_bytes:
        step = slab_bytes // per_image
        for n0 in range(0, g.n, step):
            yield slice(n0, min(g.n, n0 + step)), slice(0, rows)
        return
    step = max(1, slab_bytes * rows // per_image)
    for n0 in range(g.n):
        for r0 in range(0, rows, step):
            yield slice(n0, n0 + 1), slice(r0, min(rows, r0 + step))


def _slabs(g: ConvGeometry, task: str, slab_bytes: int) -> Iterator[_Slab]:
    """The problem as slabs (see the module docstring)."""
    if task != "backward_data":
        for images, rows in _ranges(g, g.out_size[0], slab_bytes):
            sub, x_rows = _window(g, images, rows.start, rows.stop)
            yield _Slab(sub, images, x_rows, rows, rows)
        return
    for images, rows in _ranges(g, g.in_size[0], slab_bytes):
        o0, o1 = _reaching(g, rows.start, rows.stop)
        if o0 >= o1:
            yield _Slab(None, images, rows, slice(0, 0), rows)
            continue
        sub, x_rows = _window(g, images, o0, o1)
        yield _Slab(sub, images, x_rows, slice(o0, o1), rows)


def check_bytes(problem: Problem, slab_size: int | None = None) -> int:
    """Bytes :func:`convolution_error` allocates at most besides its inputs: the largest slab's
    reference workspace and its result twice more (rounded, then compared in float64), and for
    the weights gradient the float64 sum and its rounding. The first slabs are the largest (the
    others repeat them, or are the last and smaller), so this costs the same for any size."""
    g, task = problem.geometry, problem.task
    first = list(itertools.islice(_slabs(g, task, slab_size or slab_bytes()), 3))
    workspace = max((_REFERENCE.workspace_bytes(s.geometry, task, np.dtype(np.float64))
                     for s in first if s.geometry), default=0)
    if task == "backward_weights":
        return workspace + 8 * 2 * math.prod(g.w_shape)
    row = math.prod(g.out_size[1:]) * g.oc if task == "forward" else math.prod(g.in_size[1:]) * g.ic
    result = max(((s.images.stop - s.images.start) * (s.rows.stop - s.rows.start) for s in first), default=0)
    return workspace + 8 * 3 * result * row


def convolution_error(problem: Problem, arrays: dict[str, np.ndarray], got: np.ndarray,
                      out_dtype: np.dtype | None = None, slab_size: int | None = None) -> float:
    """The error of ``got`` (the op's output, in the user's layout) against the reference engine
    on the same inputs (``arrays`` by role, as :meth:`convgrad.Op.prepare` gives them) rounded to
    the problem's dtype (then to ``out_dtype``, a graph's declared output type), in slabs of about
    ``slab_size`` bytes of reference workspace (default :func:`slab_bytes`)."""
    g, task = problem.geometry, problem.task
    fmt, wfmt = problem.data_format, problem.weights_format
    x, y, w = (None if role not in arrays else weights_to_canonical(arrays[role], wfmt) if role == "w"
               else data_to_canonical(arrays[role], fmt) for role in ("x", "y", "w"))
    slabs = _slabs(g, task, slab_size or slab_bytes())
    meter = ErrorMeter()
    with np.errstate(all="ignore"):
        if task == "backward_weights":
            dw = np.zeros(g.w_shape, np.float64)
            for s in slabs:
                dw += _REFERENCE.backward_weights(s.geometry, x[s.images, s.x_rows], y[s.images, s.y_rows])
            meter.add(weights_to_canonical(got, wfmt), round_result(problem, dw, out_dtype=out_dtype))
            return meter.value
        out = data_to_canonical(got, fmt)
        for s in slabs:
            if task == "forward":
                want = _REFERENCE.forward(s.geometry, x[s.images, s.x_rows], w)
            else:
                want = np.zeros((s.images.stop - s.images.start, s.rows.stop - s.rows.start, *g.in_size[1:], g.ic))
                low, high = max(s.rows.start, s.x_rows.start), min(s.rows.stop, s.x_rows.stop)
                if s.geometry is not None and low < high:
                    part = _REFERENCE.backward_data(s.geometry, y[s.images, s.y_rows], w)
                    want[:, low - s.rows.start:high - s.rows.start] = part[:, low - s.x_rows.start:high - s.x_rows.start]
            meter.add(out[s.images, s.rows], round_result(problem, want, arrays.get("bias"), out_dtype))
    return meter.value
