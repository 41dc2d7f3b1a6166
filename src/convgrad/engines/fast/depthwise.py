"""Depthwise convolutions (one input and one output channel per group): the ``direct`` strategy's
vectorised loops (its ``loops`` = ``depthwise``).

With ``C`` channels and a per-channel kernel ``w[k, c]`` there is no GEMM to hand to BLAS: each
output is a short dot product along the kernel. The loops below read the data where it lies (no
padded frame copy: a tap outside the input is skipped), run vectorised over the channels of a
channels-last row and in parallel over rows, and are compiled by numba::

    y[n, o, c]  = sum_k x[n, o*S + k*D - PB, c] * w[k, c]                   (forward)
    dx[n, i, c] = sum_{k, o: o*S + k*D - PB = i} dy[n, o, c] * w[k, c]      (backward data)
    dw[k, c]    = sum_{n, o} x[n, o*S + k*D - PB, c] * dy[n, o, c]          (backward weights)

Every array is seen as 3-D spatial (missing axes of size 1; :mod:`.geometry`). NXC data
(C-contiguous) on a JIT kernel family run the register-blocked kernels of
:mod:`.depthwise_kernels`: f32 data, and bf16/f16 data read where it lies (widened in the
registers, f32 sums; a data result rounded once as it is stored, or left in f32); NCX data, f64
and the portable family the numba loops here (16-bit data widened to f32 once).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ... import casts
from ...problem import ConvGeometry
from . import depthwise_kernels as kernels
from . import isa, microkernel, pool, workspace
from .frame import empty_like_data
from .geometry import params, spatial, spatial3, tap
from .tuning import TUNING

__all__ = ["FASTMATH", "run", "parts", "forward", "backward_data", "backward_weights"]

FASTMATH = {"reassoc", "contract"}  # vectorised sums and fused multiply-adds; IEEE NaN/inf kept


def _gather_row(row, src, w, out, stride, dilation, pad, transposed):  # pragma: no cover - compiled
    """Row ``row`` (image, a0, a1) of ``out[n, a, c] = sum_k src[n, tap(a, k), c] * w[k, c]`` (forward,
    or backward data if transposed)."""
    n_, a0_, a1_, a2_, c_ = out.shape
    _, s0_, s1_, s2_, _ = src.shape
    k0_, k1_, k2_, _ = w.shape
    n, a0, a1 = row // (a0_ * a1_), row // a1_ % a0_, row % a1_
    for a2 in range(a2_):
        for c in range(c_):
            out[n, a0, a1, a2, c] = 0
        for k0 in range(k0_):
            b0 = tap(a0, k0, stride[0], dilation[0], pad[0], s0_, transposed)
            if b0 < 0:
                continue
            for k1 in range(k1_):
                b1 = tap(a1, k1, stride[1], dilation[1], pad[1], s1_, transposed)
                if b1 < 0:
                    continue
                for k2 in range(k2_):
                    b2 = tap(a2, k2, stride[2], dilation[2], pad[2], s2_, transposed)
                    if b2 < 0:
                        continue
                    for c in range(c_):
                        out[n, a0, a1, a2, c] += src[n, b0, b1, b2, c] * w[k0, k1, k2, c]


def _weights_part(part, x, dy, acc, stride, dilation, pad, parts):  # pragma: no cover - compiled
    """``acc[part][k, c] = sum_{n, o} x[n, tap(o, k), c] * dy[n, o, c]`` over part ``part`` of
    ``parts`` of the output rows."""
    n_, o0_, o1_, o2_, c_ = dy.shape
    _, i0_, i1_, i2_, _ = x.shape
    k0_, k1_, k2_, _ = acc.shape[1:]
    rows = n_ * o0_ * o1_
    for row in range(part * rows // parts, (part + 1) * rows // parts):
        n, o0, o1 = row // (o0_ * o1_), row // o1_ % o0_, row % o1_
        for k0 in range(k0_):
            i0 = tap(o0, k0, stride[0], dilation[0], pad[0], i0_, False)
            if i0 < 0:
                continue
            for k1 in range(k1_):
                i1 = tap(o1, k1, stride[1], dilation[1], pad[1], i1_, False)
                if i1 < 0:
                    continue
                for o2 in range(o2_):  # the row of outputs innermost but one: dy stays in cache
                    for k2 in range(k2_):
                        i2 = tap(o2, k2, stride[2], dilation[2], pad[2], i2_, False)
                        if i2 < 0:
                            continue
                        for c in range(c_):
                            acc[part, k0, k1, k2, c] += x[n, i0, i1, i2, c] * dy[n, o0, o1, o2, c]


#: The loops where the register-blocked kernels do not apply (f64, 16-bit data of two dtypes,
#: strided data), each a serial body run by :class:`.microkernel.parallel_items`: compiled per
#: dtypes and C-contiguity without numba's parallel-loop passes (5-11 s a variant with its own
#: ``prange``, one per array layout).
_gather = microkernel.parallel_items(_gather_row, fastmath=FASTMATH)
_weights_parts = microkernel.parallel_items(_weights_part, fastmath=FASTMATH)


def _weights(g: ConvGeometry, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Canonical (*K, 1, C) weights as a contiguous (K0, K1, K2, C) array in ``dtype``."""
    return np.ascontiguousarray(w.reshape(*spatial(g.kernel, 1), g.ic), dtype=dtype)


def _gather_into(g: ConvGeometry, src: np.ndarray, w: np.ndarray, out: np.ndarray, transposed: bool,
                 head: int | None = None) -> None:
    """``out`` = the forward convolution of ``src`` (or with ``transposed`` the data gradient of
    ``dy`` = ``src``): the register-blocked kernels where they apply (``head``: the caller's
    :func:`_gather_head`), else :func:`_gather`."""
    src3, out3 = spatial3(src), spatial3(out)
    kernel = _kernel(src, out)
    if kernel is None:
        _gather(math.prod(out3.shape[:3]), src3, _weights(g, w, out.dtype), out3, *params(g), transposed)
        return
    width, kind = kernel
    taps = _weights(g, w, np.dtype(np.float32))
    key, outer0, outer1, phases, spread = _gather_plan(g, transposed, width)
    head = _gather_head(g, src, transposed, width) if head is None else head
    block = spread[2]
    if block < g.ic:     # (K, C) as (C / block, K, block): a block's weights together
        flat = taps.reshape(-1, g.ic // block, block).transpose(1, 0, 2)
        taps = np.ascontiguousarray(flat).reshape(taps.shape)
    chunks = _chunks(out3.shape[0] * out3.shape[1] * out3.shape[2])
    drive = kernels.gather_driver(width, kind, *key, head > 0, _streams(out, head, width, key[1]))
    drive(chunks, chunks, casts.bits(src3).reshape(-1), taps.reshape(-1), casts.bits(out3).reshape(-1),
          np.array(src3.shape, np.int64), np.array(out3.shape, np.int64), np.array(taps.shape[:3], np.int64),
          outer0, outer1, phases, spread, head)


def _streams(out: np.ndarray, head: int, width: int, vecs: int) -> bool:
    """Whether the forward and data-gradient kernels, ``vecs`` vectors a block, store ``out`` past
    the caches: where a block's vectors of a position are whole cache lines, on a line boundary
    (C a multiple of them, channel ``head`` on a boundary), from ``TUNING.depthwise_stream_l3``
    of the L3 cache's bytes (a result that would not stay there: its lines are not read in
    before they are written)."""
    run = width * vecs * out.dtype.itemsize
    return run % workspace.ALIGN == 0 and out.shape[-1] % (width * vecs) == 0 and \
        (out.ctypes.data + head * out.dtype.itemsize) % workspace.ALIGN == 0 and \
        out.nbytes >= TUNING.depthwise_stream_l3 * isa.cache_sizes()[2]


def _gather_head(g: ConvGeometry, src: np.ndarray, transposed: bool, width: int) -> int:
    """The channels a forward (data gradient, ``transposed``) kernel runs before its blocks
    (:func:`_aligns`, :func:`_head`), where a vector is a cache line (bf16 data: no gain)."""
    if not _aligns(g.ic, width) or width * src.dtype.itemsize != workspace.ALIGN:
        return 0
    key, *_, spread = _gather_plan(g, transposed, width)
    return _head(src, width) if _aligns(g.ic, width, key[1], spread[0]) else 0


def _aligns(channels: int, width: int, vecs: int = 1, phases: int = 1) -> bool:
    """Whether a depthwise kernel starts its blocks on the data's vector boundary (:func:`_head`):
    from ``TUNING.depthwise_align_vectors`` vectors of channels; a forward or data-gradient
    kernel only of one-vector blocks and one phase (the strided data gradients ran slower)."""
    return vecs == 1 and phases == 1 and channels >= TUNING.depthwise_align_vectors * width


@functools.lru_cache(maxsize=256)
def _gather_plan(g: ConvGeometry, transposed: bool, width: int) -> tuple:
    """(driver key, outer0, outer1, phases, spread) of :func:`.depthwise_kernels.gather_driver`
    for ``g`` (the source: x, or dy with ``transposed``; remembered per geometry: shared, never
    written); ``spread``'s last value is the weights' block of channels: a one-position block's
    vectors (the weights blocked by them, as oneDNN's ``Goihw8g``: with 1024 channels the taps
    of a vector lay 4 KB apart, in one L1 set; blocked, the 7x7 and 14x14 layers' data gradients
    ran 1.2-1.5x faster on a Zen 3), else all the channels (plain)."""
    out_size = spatial(g.in_size if transposed else g.out_size, 1)
    src_size = spatial(g.out_size if transposed else g.in_size, 1)
    (s0, s1, s2), (d0, d1, d2), (p0, p1, p2) = (spatial(v, f) for v, f in ((g.strides, 1), (g.dilations, 1),
                                                                             (g.pads_begin, 0)))
    kernel = spatial(g.kernel, 1)
    outer = [kernels.axis_taps(out_size[a], kernel[a], s, d, p, src_size[a], transposed)
             for a, s, d, p in ((0, s0, d0, p0), (1, s1, d1, p1))]
    phases, step, mul, period, spread = kernels.gather_phases(out_size[2], kernel[2], s2, d2, p2, transposed)
    taps = tuple(sorted(set(phases[:, 2].tolist())))
    rows, vecs = kernels.gather_block(int(phases[:, 4].max()), taps[-1], width, g.ic)
    block = width * vecs if rows == 1 and vecs > 1 else g.ic
    return (rows, vecs, taps, step, mul), *outer, phases, np.array([spread, period, block], np.int64)


def forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
    """Fill ``y`` (N, *O, C) with the depthwise convolution of ``x`` (in ``y``'s dtype)."""
    _gather_into(g, x, w, y, False)


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dx: np.ndarray) -> None:
    """Fill ``dx`` (N, *I, C) with the data gradient."""
    _gather_into(g, dy, w, dx, True)


def _chunks(rows: int, per_thread: int | None = None) -> int:
    """Parallel chunks of ``rows`` rows: ``per_thread`` (``TUNING.depthwise_chunks_per_thread``)
    per thread, at most one per row."""
    return max(1, min((per_thread or TUNING.depthwise_chunks_per_thread) * pool.threads(), rows))


def parts(g: ConvGeometry) -> int:
    """Parallel partial sums of the weights gradient: ``TUNING.depthwise_parts_per_thread`` chunks of
    output rows per thread (:func:`_chunks`)."""
    return _chunks(g.n * math.prod(g.out_size[:-1]), TUNING.depthwise_parts_per_thread)


def _kernel(*arrays: np.ndarray) -> tuple[int, int] | None:
    """(vector width, element kind) of the register-blocked kernels (:mod:`.depthwise_kernels`)
    for these data arrays: C-contiguous (NXC: the channels contiguous), f32 or one 16-bit dtype
    (its kind; the others f32), on a JIT kernel family; else None."""
    kinds = {casts.KINDS.get(a.dtype, -1) for a in arrays}
    if isa.family() not in isa.WIDTH or -1 in kinds or len(kinds - {casts.F32_VALUES}) > 1 or \
            not all(a.flags.c_contiguous for a in arrays):
        return None
    return isa.WIDTH[isa.family()], max(kinds)


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> None:
    """Add the weights gradient to ``dw`` (*K, 1, C)."""
    x3, dy3, kernel, count = spatial3(x), spatial3(dy), spatial(g.kernel, 1), parts(g)
    native = _kernel(x, dy) if x.dtype == dy.dtype else None
    if native is None:
        acc = np.zeros((count, *kernel, g.ic), dw.dtype)   # the parts' partial sums, added in order
        _weights_parts(count, x3, dy3, acc, *params(g), count)
        view = dw.reshape(*kernel, g.ic)
        for part in acc:
            view += part
        return
    width, kind = native
    drive, shapes, aligned = _weights_plan(g, width, kind, count)
    taps = math.prod(kernel)
    head = _head(x, width) if aligned else 0
    # per part, row ``taps`` the scratch row of taps in the padding; channel ``head``'s sums on a line
    acc = workspace.result((count, taps + 1, g.ic), np.float32, fill=True, offset=-4 * head % workspace.ALIGN)
    drive(count, casts.bits(x3).reshape(-1), casts.bits(dy3).reshape(-1), acc.reshape(-1), *shapes, count, head)
    dw += acc[:, :taps].sum(axis=0).reshape(dw.shape)


@functools.lru_cache(maxsize=256)
def _weights_plan(g: ConvGeometry, width: int, kind: int, count: int) -> tuple[Callable, tuple, bool]:
    """(driver, its shape and geometry arguments, whether its blocks start on the data's vector
    boundary) of the register-blocked weights gradient of ``g`` in ``count`` parts (remembered per
    geometry: shared, never written)."""
    kernel = spatial(g.kernel, 1)
    slide = spatial(g.strides, 1)[2] == 1 and spatial(g.dilations, 1)[2] == 1
    aligned = _aligns(g.ic, width)
    drive = kernels.weights_driver(width, kind, *kernels.reduce_block(kernel, g.ic, width, slide), aligned)
    shapes = (np.array((g.n, *spatial(g.in_size, 1), g.ic), np.int64), np.array((g.n, *spatial(g.out_size, 1), g.oc),
                                                                                 np.int64), np.array(kernel, np.int64))
    return drive, (*shapes, *params(g)), aligned


def _head(data: np.ndarray, width: int) -> int:
    """The channels of NXC ``data`` before the first on a boundary of ``width``-lane vectors,
    where every position's channels start alike (C a multiple of the lanes; else 0): the
    kernels start their blocks there, so that each vector load touches one cache line,
    not two (NumPy's large arrays start 16 bytes past a page: every 64-byte load of f32
    channels from channel 0 crossed a line)."""
    size = data.dtype.itemsize
    miss = -data.ctypes.data % (width * size)
    return miss // size if miss % size == 0 and data.shape[-1] % width == 0 else 0


def run(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, acc: np.dtype, rounded: bool = False) -> np.ndarray:
    """``task`` on its canonical inputs, result in ``acc``: data results in the memory order of
    the data, and with ``rounded`` in the data's dtype where the kernels read 16-bit data as it
    lies (each value rounded once); data the kernels cannot read is converted to ``acc`` first."""
    data = (a, b) if task == "backward_weights" else (a,)
    native = _kernel(*data) is not None and len({v.dtype for v in data}) == 1
    if not native:
        a, b = casts.astype(a, acc), (casts.astype(b, acc) if task == "backward_weights" else b)
    if task == "backward_weights":
        dw = np.zeros((math.prod(g.kernel), 1, g.oc), acc)
        backward_weights(g, a, b, dw)
        return dw.reshape(g.w_shape)
    dtype = np.dtype(a.dtype if rounded and native else acc)
    width = isa.WIDTH.get(isa.family(), 1)
    head = _gather_head(g, a, task != "forward", width) if native else 0
    out = empty_like_data(g.y_shape if task == "forward" else g.x_shape, dtype, a,   # channel ``head`` on a
                          offset=-head * dtype.itemsize % (width * dtype.itemsize))  # vector boundary too
    _gather_into(g, a, b, out, task != "forward", head)
    return out
