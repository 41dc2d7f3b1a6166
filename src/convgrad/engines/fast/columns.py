"""Compiled tap gathers and scatters over output rows: of the output-row GEMMs
(:mod:`.output_rows`), and between blocks of output rows and the frame's channel-major phase
buffers (:func:`gather_phases`, :func:`scatter_phases`: the narrow-channel gradients).

With every array seen as 3-D spatial (missing leading axes of size 1), an input ``X``
(n, I0, I1, I2, G, C) and the tap ``k`` of output ``o`` at ``p = o*S + k*D - PB``, over a run of
the flat output rows ``r = (n, o)``:

- :func:`scatter` (col2im): ``X[n, p, g, c] += Z[g, r, k - k0, c]`` for every tap inside X of a
  block of taps ``k0 <= k < k0 + Z.shape[2]``;
- :func:`gather`  (im2col): ``Z[r, g, k, c] = X[n, p, g, c]``, or 0 where p lies in the padding.

The padding is never stored: no padded copy of the input, no cropping copy of the gradient.

One pass over Z with the channels innermost (contiguous on both sides; columns in (channels,
taps) order, for OIX weights, are read or written with a stride of prod(K)). NumPy's strided
``+=``/copy per tap runs a short inner loop per output row instead. Serial on purpose, as
:mod:`convgrad.casts` explains.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from ... import kernel_cache
from ...problem import ConvGeometry
from .geometry import params, spatial, spatial3, tap

__all__ = ["Grid", "scatter", "gather", "gather_phases", "scatter_phases"]

#: Where outputs sit in a frame: (rows per image, O, rows per step of each axis), as
#: :meth:`.frame.Frame.output_grid` gives it.
Grid = tuple[int, tuple[int, ...], tuple[int, ...]]


@numba.njit(inline="always")
def _position(r, out):  # pragma: no cover - compiled
    """(image, o0, o1, o2) of flat output row r of (n, *out) rows."""
    image, rest = divmod(r, out[0] * out[1] * out[2])
    o0, rest = divmod(rest, out[1] * out[2])
    o1, o2 = divmod(rest, out[2])
    return image, o0, o1, o2


@kernel_cache.njit()
def _columns(data, z, first, lo, out, kernel, dilations, strides, pads, scatter):  # pragma: no cover - compiled
    """``scatter``: data[tap] += z[g, r, k - lo] for taps lo <= k < hi; else z[r, g, k] = data[tap],
    0 in the padding."""
    hi = lo + z.shape[2]
    _, i0_, i1_, i2_, g_, c_ = data.shape
    for r in range(z.shape[1] if scatter else z.shape[0]):
        image, o0, o1, o2 = _position(first + r, out)
        t = 0
        for k0 in range(kernel[0]):
            p0 = tap(o0, k0, strides[0], dilations[0], pads[0], i0_, False)
            for k1 in range(kernel[1]):
                p1 = tap(o1, k1, strides[1], dilations[1], pads[1], i1_, False)
                for k2 in range(kernel[2]):
                    p2 = tap(o2, k2, strides[2], dilations[2], pads[2], i2_, False)
                    inside = p0 >= 0 and p1 >= 0 and p2 >= 0
                    for g in range(g_):
                        if scatter:
                            if inside and lo <= t < hi:
                                for c in range(c_):
                                    data[image, p0, p1, p2, g, c] += z[g, r, t - lo, c]
                        elif inside:
                            for c in range(c_):
                                z[r, g, t, c] = data[image, p0, p1, p2, g, c]
                        else:
                            for c in range(c_):
                                z[r, g, t, c] = 0
                    t += 1


def _run(data: np.ndarray, z: np.ndarray, g: ConvGeometry, first: int, k0: int, taps_inner: bool,
         scatter: bool) -> None:
    """The loops on (n, *I, G*ICg) ``data`` seen as 3-D spatial and ``z`` as per-tap columns
    (``taps_inner``: z's columns of a group are (ICg, taps) in memory, seen as (taps, ICg))."""
    out, kernel = (np.array(spatial(v, 1), np.int64) for v in (g.out_size, g.kernel))
    strides, dilations, pads = params(g)
    grid = spatial3(data)
    columns = z.reshape(*z.shape[:2], g.icg, -1).swapaxes(2, 3) if taps_inner else z.reshape(*z.shape[:2], -1, g.icg)
    _columns(grid.reshape(*grid.shape[:-1], g.groups, g.icg), columns, first, k0, out, kernel, dilations, strides,
             pads, scatter)


def scatter(z: np.ndarray, dx: np.ndarray, g: ConvGeometry, first: int, k0: int = 0, taps_inner: bool = False) -> None:
    """col2im of the output rows ``first, first + 1, ...`` of the images of ``dx`` (n, *I, IC):
    ``dx += `` the taps ``k0, k0 + 1, ...`` of ``z`` (G, rows, taps*ICg, or ICg*taps with
    ``taps_inner``) that land inside it; both contiguous."""
    _run(dx, z, g, first, k0, taps_inner, scatter=True)


def gather(x: np.ndarray, z: np.ndarray, g: ConvGeometry, first: int, taps_inner: bool = False) -> None:
    """im2col of the output rows ``first, first + 1, ...`` of the images of ``x`` (n, *I, IC)
    into ``z`` (rows, G, prod(K)*ICg, or ICg*prod(K) with ``taps_inner``), zeros for taps in the
    padding; both contiguous."""
    _run(x, z, g, first, 0, taps_inner, scatter=False)


@kernel_cache.njit()
def _phase_columns(phases, block, first, out, strides, image, phase_of, shift_of, scatter):  # pragma: no cover - compiled
    """block[g, t*C + c, r - first] = phases[phase_of[t], g*C + c, row(r) + shift_of[t]], or
    with ``scatter`` phases[...] += block[...], for the output rows r = first, first + 1, ...
    with ``row(r)`` the frame row of output r: run by run along the last axis (found once per
    block), each a contiguous stretch on both sides but for 1-D frames with the batch inside,
    whose one axis steps over the images."""
    groups, depth, count = block.shape
    width = depth // phase_of.shape[0]
    starts = np.empty(count // out[2] + 2, np.int64)
    lengths = np.empty_like(starts)
    runs, r = 0, first
    while r < first + count:
        n, o0, o1, o2 = _position(r, out)
        lengths[runs] = min(out[2] - o2, first + count - r)
        starts[runs] = n * image + o0 * strides[0] + o1 * strides[1] + o2 * strides[2]
        r += lengths[runs]
        runs += 1
    step = strides[2]
    for t in range(phase_of.shape[0]):
        for g in range(groups):
            for c in range(width):
                frame = phases[phase_of[t], g * width + c]
                rows = block[g, t * width + c]
                at = 0
                for j in range(runs):
                    start, length = starts[j] + shift_of[t], lengths[j]
                    run = rows[at:at + length]  # slices: their loop indices are known non-negative
                    seg = frame[start:start + (length - 1) * step + 1]
                    if scatter and step == 1:
                        for i in range(length):
                            seg[i] += run[i]
                    elif scatter:
                        for i in range(length):
                            seg[i * step] += run[i]
                    elif step == 1:
                        for i in range(length):
                            run[i] = seg[i]
                    else:
                        for i in range(length):
                            run[i] = seg[i * step]
                    at += length


def _phases_run(phases: np.ndarray, block: np.ndarray, first: int, grid: Grid,
                taps: Sequence[tuple[int, int]], scatter: bool) -> None:
    image, out, strides = grid
    _phase_columns(np.swapaxes(phases, 1, 2), block, first, np.array(spatial(out, 1), np.int64),
                   np.array(spatial(strides, 0), np.int64), image,
                   np.array([p for p, _ in taps], np.int64), np.array([s for _, s in taps], np.int64), scatter)


def gather_phases(phases: np.ndarray, block: np.ndarray, first: int, grid: Grid,
                  taps: Sequence[tuple[int, int]]) -> None:
    """im2col of output rows from channel-major phase buffers: ``block`` (G, len(taps)*Cg, B)
    gets, for the output rows ``first .. first + B`` (in (n, *O) order), the frame rows that
    each tap (phase, row shift) reads; ``phases`` (P, rows, G*Cg) stored channel by channel and
    ``grid`` places the outputs in the frame."""
    _phases_run(phases, block, first, grid, taps, scatter=False)


def scatter_phases(block: np.ndarray, phases: np.ndarray, first: int,
                   grid: Grid, taps: Sequence[tuple[int, int]]) -> None:
    """col2im of output rows into channel-major phase buffers, the reverse of
    :func:`gather_phases`: each tap's rows of ``block`` are added at the frame rows it reads."""
    _phases_run(phases, block, first, grid, taps, scatter=True)
