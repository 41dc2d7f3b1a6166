"""Convolution geometry shared by the fast engine's strategies, written once: 3-D spatial views,
the taps of an output, stride phases, weights regrouped per tap and group, zero-padded copies.

Every strategy sees a convolution of rank 1-3 as 3-D spatial: missing *leading* spatial axes of
size 1 (kernel 1, stride 1, dilation 1, no padding). Along one axis (input size I, output O,
kernel K, stride S, dilation D, begin pad PB) tap ``k`` of output ``o`` reads the input at
``i = o*S + k*D - PB`` (nothing where that lies in the padding).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from ... import kernel_cache
from ...problem import ConvGeometry
from . import microkernel, workspace
from .tuning import TUNING

__all__ = ["spatial", "spatial3", "params", "tap", "stride_phase", "phase_taps", "tap_weights", "padded", "fill_line",
           "flat", "sampled", "spread"]


def spatial(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    """Per-axis ``values`` of rank 1-3 as 3 values, the missing leading axes ``fill``."""
    return (fill,) * (3 - len(values)) + tuple(values)


def has_padding(g: ConvGeometry) -> bool:
    """Whether any axis is padded (zeros that a NaN or Inf must not meet: docs/guarantees.md)."""
    return any(g.pads_begin) or any(g.pads_end)


def pointwise(g: ConvGeometry) -> bool:
    """A 1x1 kernel without padding and with one group (any stride): one GEMM."""
    return math.prod(g.kernel) == 1 and g.groups == 1 and not has_padding(g)


def spatial3(a: np.ndarray) -> np.ndarray:
    """(N, *X, C) as (N, X0, X1, X2, C), missing leading spatial axes of size 1 (a view)."""
    return a.reshape(a.shape[0], *(1,) * (5 - a.ndim), *a.shape[1:])


@functools.lru_cache(maxsize=256)
def params(g: ConvGeometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Strides, dilations and begin pads of the 3-D spatial view, as int64 arrays for numba
    (remembered per geometry: shared, never written)."""
    return (np.array(spatial(g.strides, 1), np.int64), np.array(spatial(g.dilations, 1), np.int64),
            np.array(spatial(g.pads_begin, 0), np.int64))


@numba.njit(inline="always")
def tap(a, k, stride, dilation, pad, size, transposed):  # pragma: no cover - compiled
    """Where tap k of position a reads, or -1 if nowhere: the input under output a
    (``a*S + k*D - PB``), or with ``transposed`` the output whose tap k covers input a."""
    if transposed:
        t = a + pad - k * dilation
        return t // stride if t >= 0 and t % stride == 0 and t // stride < size else -1
    i = a * stride + k * dilation - pad
    return i if 0 <= i < size else -1


def stride_phase(j: int, d: int, s: int, pb: int = 0) -> tuple[int, int]:
    """The stride-phase split along one axis: tap ``j`` of output ``o`` reads the input at
    ``o*S + j*D - PB = S*(o + q) + r`` with ``(q, r) = divmod(j*D - PB, S)``, i.e. phase ``r``
    (positions ``S*m + r``) at ``m = o + q``; (r, q). With ``PB = 0``: the phases of a padded
    input (:mod:`.frame`)."""
    q, r = divmod(j * d - pb, s)
    return r, q


def phase_taps(r: int, k: int, s: int, d: int, pb: int) -> list[tuple[int, int]]:
    """Backward data per stride phase along one axis: the input positions ``i = m*S + r`` get
    ``dy[m + c]`` through the taps ``j`` of phase ``r`` (:func:`stride_phase`), ``c = -q``:
    (tap j, offset c) of each."""
    return [(j, -q) for j in range(k) for rj, q in [stride_phase(j, d, s, pb)] if rj == r]


def tap_weights(g: ConvGeometry, w: np.ndarray, transpose: bool = False) -> np.ndarray:
    """Canonical (*K, ICg, G*OCg) weights as a (T, G, ICg, OCg) view, or (T, G, OCg, ICg) with
    ``transpose`` (T = prod(K), taps in C order)."""
    taps = w.reshape(math.prod(g.kernel), g.icg, g.groups, g.ocg)
    return taps.transpose(0, 2, 3, 1) if transpose else taps.transpose(0, 2, 1, 3)


def padded(a: np.ndarray, lo: tuple[int, ...], size: tuple[int, ...], dtype: np.dtype, slack: int = 0) -> np.ndarray:
    """Canonical (N, *X, C) data as a zeroed ``dtype`` (N, P0, P1, P2, C) array (``size`` = P,
    3-D) holding ``a`` at offsets ``lo``, on a flat buffer with ``slack`` zeroed values after it
    (:func:`flat` gives that buffer). Same-dtype data is copied by a parallel loop that writes
    every value once (NumPy's strided copy into a zeroed buffer is one thread and two passes)."""
    a3 = spatial3(a)
    shape = (a3.shape[0], *size, a3.shape[-1])
    count = math.prod(shape)
    if a3.dtype != dtype:
        buffer = workspace.zeros(count + slack, dtype)
        out = buffer[:count].reshape(shape)
        out[(slice(None), *(slice(b, b + n) for b, n in zip(lo, a3.shape[1:4])), slice(None))] = a3
        return out
    buffer = workspace.empty(count + slack, dtype)
    buffer[count:] = 0
    out = buffer[:count].reshape(shape)
    src, dst = a3, out
    if dtype.itemsize == 2 and a3.shape[-1] % 2 == 0 and a3.strides[-1] == 2 and \
            all(s % 4 == 0 for s in a3.strides[:-1]) and a3.ctypes.data % 4 == 0:
        src, dst = a3.view(np.uint32), out.view(np.uint32)          # 16-bit values two at a time
    _fill_padded(out.shape[0] * out.shape[1], src, dst, *lo)
    return out


@kernel_cache.njit(inline="always")
def fill_line(a3, n, out, p0, p1, lo0, lo1, lo2):  # pragma: no cover - compiled
    """``out[p0, p1, p2] = a3[n, p0 - lo0, p1 - lo1, p2 - lo2]`` where that lies in ``a3``, else
    0, for the line (p0, p1) of one padded image ``out`` (P0, P1, P2, C): every value written
    once."""
    p2_, c_ = out.shape[2], out.shape[3]
    i0, i1, i2_ = p0 - lo0, p1 - lo1, a3.shape[3]
    first, stop = min(max(lo2, 0), p2_), max(min(lo2 + i2_, p2_), 0)   # the positions of a3 along axis 2
    dst = out[p0, p1]
    if not (0 <= i0 < a3.shape[1] and 0 <= i1 < a3.shape[2]):
        first, stop = p2_, p2_
    for p2 in range(first):                   # loops over channels, not slices: 3x the speed (L2)
        for c in range(c_):
            dst[p2, c] = 0
    if first < stop:
        src = a3[n, i0, i1]
        for p2 in range(first, stop):
            for c in range(c_):
                dst[p2, c] = src[p2 - lo2, c]
    for p2 in range(stop, p2_):
        for c in range(c_):
            dst[p2, c] = 0


def _fill_row(row, a3, out, lo0, lo1, lo2):  # pragma: no cover - compiled
    """:func:`fill_line` for the lines of row ``row`` = (n, p0) of ``out`` (N, P0, P1, P2, C)
    (:data:`_fill_padded` runs the rows in parallel)."""
    p0_ = out.shape[1]
    n, p0 = row // p0_, row % p0_
    for p1 in range(out.shape[2]):
        fill_line(a3, n, out[n], p0, p1, lo0, lo1, lo2)


_fill_padded = microkernel.parallel_items(_fill_row)


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as unsigned integers of its item size (numba copies bits of any dtype)."""
    return a.view(f"u{a.itemsize}")


def sampled(a: np.ndarray, strides: tuple[int, ...], out_size: tuple[int, ...]) -> np.ndarray:
    """The positions a strided 1x1 convolution reads, ``a[:, ::S0, ::S1, ::S2][:, :O0, :O1, :O2]``
    of canonical (N, *X, C) data, as a C-contiguous (N, *O, C) array (of the engine's cache: a
    fresh one faults its pages in each call), copied by a parallel loop (NumPy's is one thread)."""
    a3, o = spatial3(a), spatial(out_size, 1)
    out = workspace.empty(a3.shape[0] * math.prod(o) * a3.shape[-1], a.dtype)
    _sample(_bits(a3), *spatial(strides, 1), _bits(out).reshape(a3.shape[0], *o, a3.shape[-1]))
    return out.reshape(a.shape[0], *out_size, a.shape[-1])


@kernel_cache.njit(parallel=True)
def _sample(a3, s0, s1, s2, out):  # pragma: no cover - compiled
    """``out[n, i0, i1, i2] = a3[n, i0*S0, i1*S1, i2*S2]``, rows (n, i0) in parallel."""
    n_, o0_, o1_, o2_ = out.shape[:4]
    for row in numba.prange(n_ * o0_):
        n, i0 = row // o0_, row % o0_
        for i1 in range(o1_):
            for i2 in range(o2_):
                out[n, i0, i1, i2, :] = a3[n, i0 * s0, i1 * s1, i2 * s2, :]


def spread(rows: np.ndarray, strides: tuple[int, ...], out: np.ndarray) -> np.ndarray:
    """``out`` (canonical (N, *X, C), NXC memory) holding ``rows`` (N, *O, C) at the positions a
    strided 1x1 convolution reads (:func:`sampled`) and zero elsewhere: every value written once,
    in parallel (a zeroing pass and NumPy's strided assignment were two passes of one thread);
    from ``TUNING.spread_stream_bytes``, where a position's channels are whole cache lines, past
    the caches (:func:`.microkernel.stream_line`: a line written is not read in first)."""
    r3, o3 = spatial3(rows), spatial3(out)
    stream = out.nbytes >= TUNING.spread_stream_bytes and o3.shape[-1] * o3.itemsize % workspace.ALIGN == 0 \
        and out.flags.c_contiguous and rows.flags.c_contiguous and workspace.address(_bits(out)) % workspace.ALIGN == 0
    r8, out8 = (r3.reshape(-1).view(np.uint8), o3.reshape(-1).view(np.uint8)) if stream else (_NO_BYTES, _NO_BYTES)
    _spread(_bits(r3), *spatial(strides, 1), _bits(o3), r8, out8)
    return out


_NO_BYTES = np.empty(0, np.uint8)


def spread_planes(rows: np.ndarray, strides: tuple[int, ...], out: np.ndarray) -> np.ndarray:
    """:func:`spread` of NCX memory: ``out`` (A, B, *X), C-contiguous, holding ``rows`` (A, B, *O),
    any strides (the transposition of a channel-major result, say), at the positions the strides
    keep and zero elsewhere (with strides 1 and X = O: a parallel copy), lines of the planes in
    parallel, each zeroed and then written at its kept positions while in cache (a plane of one
    channel through :func:`spread`'s loop: 4x slower; NumPy's copy of a transposed view: one
    thread)."""
    lead = rows.shape[:2]
    r3 = rows.reshape(*lead, *spatial(rows.shape[2:], 1))
    o3 = out.reshape(*lead, *spatial(out.shape[2:], 1))
    _spread_planes(_bits(r3), *spatial(strides, 1), _bits(o3))
    return out


@kernel_cache.njit(parallel=True)
def _spread_planes(r3, s0, s1, s2, out):  # pragma: no cover - compiled
    """``out[a, b, x0, x1, x2] = r3[a, b, x0/S0, x1/S1, x2/S2]`` where every ``x`` is a multiple of
    its stride within ``r3``, else 0; lines (a, b, x0, x1) in parallel."""
    a_, b_, x0_, x1_, x2_ = out.shape
    o0_, o1_, o2_ = r3.shape[2], r3.shape[3], r3.shape[4]
    zero = out.dtype.type(0)
    dense = s2 == 1 and o2_ >= x2_
    for line in numba.prange(a_ * b_ * x0_ * x1_):
        x1, x0, ab = line % x1_, line // x1_ % x0_, line // (x0_ * x1_)
        dst = out[ab // b_, ab % b_, x0, x1]
        i0, i1 = x0 // s0, x1 // s1
        kept = x0 % s0 == 0 and x1 % s1 == 0 and i0 < o0_ and i1 < o1_
        if not (kept and dense):
            for x2 in range(x2_):
                dst[x2] = zero
        if kept:
            src = r3[ab // b_, ab % b_, i0, i1]
            for i2 in range(min(o2_, (x2_ + s2 - 1) // s2)):
                dst[i2 * s2] = src[i2]


@kernel_cache.njit(parallel=True)
def _spread(r3, s0, s1, s2, out, r8, out8):  # pragma: no cover - compiled
    """``out[n, p0, p1, p2] = r3[n, p0/S0, p1/S1, p2/S2]`` where every ``p`` is a multiple of its
    stride within ``r3``, else 0; rows (n, p0) in parallel. Non-empty ``r8`` and ``out8`` (the
    two as flat bytes, a position's channels whole lines): every line stored non-temporally, each
    row ended by a fence."""
    n_, p0_, p1_, p2_ = out.shape[:4]
    o0_, o1_, o2_ = r3.shape[1], r3.shape[2], r3.shape[3]
    line = out.shape[4] * out.itemsize if out8.size else 0
    for row in numba.prange(n_ * p0_):
        n, p0 = row // p0_, row % p0_
        i0 = p0 // s0
        row_kept = p0 % s0 == 0 and i0 < o0_
        for p1 in range(p1_):
            i1 = p1 // s1
            kept = row_kept and p1 % s1 == 0 and i1 < o1_
            for p2 in range(p2_):
                i2 = p2 // s2
                keep = kept and p2 % s2 == 0 and i2 < o2_
                if line:
                    at = ((row * p1_ + p1) * p2_ + p2) * line
                    src = (((n * o0_ + i0) * o1_ + i1) * o2_ + i2) * line
                    for j in range(0, line, 64):
                        if keep:
                            microkernel.stream_line(out8, at + j, r8, src + j)
                        else:
                            microkernel.stream_line(out8, at + j, None, 0)
                elif keep:
                    out[n, p0, p1, p2, :] = r3[n, i0, i1, i2, :]
                else:
                    out[n, p0, p1, p2, :] = 0
        if line:
            microkernel.store_fence()


def flat(a: np.ndarray) -> np.ndarray:
    """The flat buffer under an array made by :func:`padded` (its slack included, and for a block
    of the engine's :mod:`.workspace` what follows it there): its base, the one array NumPy
    records under every view of it, from ``a``'s first value, in ``a``'s dtype."""
    base = a.base.view(np.uint8)
    start = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return base[start:start + (base.nbytes - start) // a.itemsize * a.itemsize].view(a.dtype)
