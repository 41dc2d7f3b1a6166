"""The ``direct`` strategy's ``flat`` loops: small stride-1 convolutions, vectorised along a flat frame.

With stride 1 on every axis, tap k of output o reads the padded input at ``p = o + k*D``. In the
flat frame of the padded input (sizes ``P = I + PB + PE``, index ``f(p) = (p0*P1 + p1)*P2 + p2``)
that is one offset per tap, ``s_k = f(k*D)``, for every output placed at ``m = f(o)``. With ``xf``
the padded input channel by channel, ``dyf`` dy channel by channel at the frame indices of its
positions (zeros between them) and ``L = f(O - 1) + 1``::

    y[o, g, j]     = sum_{k, i} w[k, g, i, j] * xf[g, i, s_k + f(o)]
    dxf[g, i, :]  += w[k, g, i, j] * dyf[g, j, 0:L]          (at s_k, over k and j; dx = dxf at f(PB + b))
    dw[k, g, i, j] = sum_{n, m < L} xf[n, g, i, s_k + m] * dyf[n, g, j, m]

so every inner loop runs along ``L`` contiguous values (a few vectors) instead of the ``J``
channels of one position: small channel counts no longer leave the loops scalar. The frame
positions between outputs (``o >= O`` on an inner axis) are computed and dropped (forward), or
hold zeros (the gradients). Frames are in the accumulation dtype; 16-bit data is widened as it is
copied in (:func:`convgrad.casts.widened`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numba
import numpy as np

from ... import addresses
from ...casts import narrowed, widened
from ...problem import ConvGeometry
from . import microkernel
from .depthwise import FASTMATH
from .geometry import spatial

__all__ = ["applies", "waste", "bind", "workspace_items", "at_params", "input_sizes", "run_at"]


def applies(g: ConvGeometry) -> bool:
    """Stride 1 on every axis."""
    return all(s == 1 for s in g.strides)


def waste(g: ConvGeometry, task: str = "forward") -> float:
    """Frame values the loops compute for ``task`` per product it needs: ``T * L`` over the
    (tap, output) pairs whose tap is inside the input, of ``g`` or, for the data gradient, of
    its :func:`_adjoint` (large pads and dilations on small images leave most of a frame to
    padding)."""
    if task == "backward_data":
        g = _adjoint(g)
    needed = 1
    for i, o, k, d, pb in zip(g.in_size, g.out_size, g.kernel, g.dilations, g.pads_begin):
        needed *= sum(max(0, min(o, i + pb - t * d) - max(0, pb - t * d)) for t in range(k))
    return math.prod(g.kernel) * _sizes(g)[2] / needed if needed else math.inf


def _sizes(g: ConvGeometry) -> tuple[tuple[int, int, int], int, int]:
    """(padded sizes P as 3-D, frame size F, span L)."""
    p = spatial(g.padded_size, 1)
    o = spatial(g.out_size, 1)
    return p, p[0] * p[1] * p[2], ((o[0] - 1) * p[1] + o[1] - 1) * p[2] + o[2]


def workspace_items(g: ConvGeometry, task: str) -> int:
    """Accumulation-dtype values of one image's frames, the row and the loops' weights (the
    result not included)."""
    weights = math.prod(g.w_shape)
    if task == "backward_data":
        g = _adjoint(g)
    _, f, span = _sizes(g)
    return g.ic * f + (g.oc * span if task == "backward_weights" else span) + weights


@microkernel.cached_njit(fastmath=FASTMATH)
def _frame(src, kind, out, lo, pitch):  # pragma: no cover - compiled
    """out[g, c, f(x + lo)] = src[x, g, c] (one image, widened) for x + lo inside the frame;
    the rest of ``out`` is left as it is (zeros, the same for every image); ``pitch`` the
    frame's sizes (P0, P1, P2)."""
    x0_, x1_, x2_, g_, c_ = src.shape
    for x0 in range(x0_):
        p0 = x0 + lo[0]
        if p0 < 0 or p0 >= pitch[0]:
            continue
        for x1 in range(x1_):
            p1 = x1 + lo[1]
            if p1 < 0 or p1 >= pitch[1]:
                continue
            for x2 in range(x2_):
                p2 = x2 + lo[2]
                if p2 < 0 or p2 >= pitch[2]:
                    continue
                m = (p0 * pitch[1] + p1) * pitch[2] + p2
                for g in range(g_):
                    for c in range(c_):
                        out[g, c, m] = widened(src[x0, x1, x2, g, c], kind)


@microkernel.cached_njit(fastmath=FASTMATH)
def _shift(k0, k1, k2, dilation, pitch):  # pragma: no cover - compiled
    return ((k0 * dilation[0]) * pitch[1] + k1 * dilation[1]) * pitch[2] + k2 * dilation[2]


@microkernel.cached_njit(fastmath=FASTMATH)
def _forward(x, kind, w, flip, y, bits, xf, row, tables):  # pragma: no cover - compiled
    """y (N, O0, O1, O2, G, J) from x (N, X0, X1, X2, G, I) and w (K0, K1, K2, G, I, J) (with
    ``flip``, w (K0, K1, K2, G, J, I) read with the kernel flipped: the data gradient's loops),
    image by image through the zeroed frame xf (G, I, F) and a row of L values (``tables``: F, L,
    the begin pads, dilations and frame sizes P, three each); with ``bits`` not empty (16-bit
    data of ``kind``), each value rounded once into ``bits`` (y's shape) instead."""
    n_, o0_, o1_, o2_, g_, j_ = bits.shape if bits.size > 0 else y.shape
    k0_, k1_, k2_ = w.shape[:3]
    i_ = w.shape[5] if flip else w.shape[4]
    span = tables[1]
    lo, dilation, pitch = tables[2:5], tables[5:8], tables[8:11]
    for n in range(n_):
        _frame(x[n], kind, xf, lo, pitch)
        for g in range(g_):
            for j in range(j_):
                row[:] = 0
                for k0 in range(k0_):
                    for k1 in range(k1_):
                        for k2 in range(k2_):
                            s = _shift(k0, k1, k2, dilation, pitch)
                            for i in range(i_):
                                if flip:
                                    c = w[k0_ - 1 - k0, k1_ - 1 - k1, k2_ - 1 - k2, g, j, i]
                                else:
                                    c = w[k0, k1, k2, g, i, j]
                                src = xf[g, i, s:s + span]  # a view from s: indices >= 0 (vectorised)
                                for m in range(span):
                                    row[m] += c * src[m]
                for o0 in range(o0_):
                    for o1 in range(o1_):
                        base = (o0 * pitch[1] + o1) * pitch[2]
                        for o2 in range(o2_):
                            if bits.size > 0:
                                bits[n, o0, o1, o2, g, j] = narrowed(row[base + o2], kind)
                            else:
                                y[n, o0, o1, o2, g, j] = row[base + o2]


@microkernel.cached_njit(fastmath=FASTMATH)
def _backward_weights(x, kind, dy, dw, xf, dyf, tables):  # pragma: no cover - compiled
    """dw (K0, K1, K2, G, I, J) from x (N, X0, X1, X2, G, I) and dy (N, O0, O1, O2, G, J), image
    by image through the zeroed frames xf (G, I, F) and dyf (G, J, L) (``tables`` as :func:`_forward`'s)."""
    k0_, k1_, k2_, g_, i_, j_ = dw.shape
    span = tables[1]
    lo, dilation, pitch = tables[2:5], tables[5:8], tables[8:11]
    dw[...] = 0
    for n in range(x.shape[0]):
        _frame(x[n], kind, xf, lo, pitch)
        _frame(dy[n], kind, dyf, lo * 0, pitch)
        for k0 in range(k0_):
            for k1 in range(k1_):
                for k2 in range(k2_):
                    s = _shift(k0, k1, k2, dilation, pitch)
                    for g in range(g_):
                        for i in range(i_):
                            a = xf[g, i, s:s + span]
                            for j in range(j_):
                                b = dyf[g, j]
                                acc = dw[k0, k1, k2, g, i, j]
                                for m in range(span):
                                    acc += a[m] * b[m]
                                dw[k0, k1, k2, g, i, j] = acc


@functools.lru_cache(maxsize=256)
def _tables(g: ConvGeometry) -> np.ndarray:
    """The loops' tables: F, L, the begin pads, dilations and frame sizes P (three each), as
    int64, remembered per geometry (shared: not to be written)."""
    pitch, f, span = _sizes(g)
    return np.array([f, span, *spatial(g.pads_begin, 0), *spatial(g.dilations, 1), *pitch], np.int64)


def bind(g: ConvGeometry, task: str) -> Callable[[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray], None]:
    """The loops of ``task`` on ``g`` as a function ``run(a, kind, b, out, bits)`` (sizes and
    tables made once: a repeated call keeps it):

    - forward: out (N, O0, O1, O2, G, J) = conv(a (N, X0, X1, X2, G, I), b = w (K0, K1, K2, G, I, J));
    - backward_data: out = dx (N, X0, X1, X2, G, I) from a = dy (N, O0, O1, O2, G, J) and the
      same w: the forward loops on dy padded by ``(K-1)*D - PB`` and ``(K-1)*D - PE``
      (:func:`_adjoint`), reading the kernel flipped and each group's weights transposed;
    - backward_weights: out = dw (K0, K1, K2, G, I, J) from a = x and b = dy (``bits`` unused).

    a (and b) may hold 16-bit bits of ``kind``; for the forward and the data gradient, with
    ``bits`` not empty (out's shape) the result is rounded into them (``out`` unused)."""
    flip = task == "backward_data"
    if flip:
        g = _adjoint(g)
    tables = _tables(g)
    span = int(tables[1])
    # the frames come from NumPy, not the compiled loops: tracemalloc (the memory tests, the benchmarks) sees them
    frame, dy_frame = (g.groups, g.icg, int(tables[0])), (g.groups, g.ocg, span)
    if task == "backward_weights":
        def weights(x: np.ndarray, kind: int, dy: np.ndarray, dw: np.ndarray, bits: np.ndarray) -> None:
            _backward_weights(x, kind, dy, dw, np.zeros(frame, dw.dtype), np.zeros(dy_frame, dw.dtype), tables)
        return weights

    def run(src: np.ndarray, kind: int, w: np.ndarray, out: np.ndarray, bits: np.ndarray) -> None:
        _forward(src, kind, w, flip, out, bits, np.zeros(frame, w.dtype), np.empty(span, w.dtype), tables)
    return run


@functools.lru_cache(maxsize=256)
def _adjoint(g: ConvGeometry) -> ConvGeometry:
    """The stride-1 convolution whose forward is ``g``'s data gradient: input and output (and
    their channels) swapped, dy padded by ``(K-1)*D - PB`` before and after by what brings its
    output to the input's size: ``(K-1)*D - PE``, plus the input positions no output reads (a
    transposed convolution's output_padding), whose gradient is zero."""
    full = [(k - 1) * d for k, d in zip(g.kernel, g.dilations)]
    begin = tuple(f - b for f, b in zip(full, g.pads_begin))
    end = tuple(i + f - o - b for i, f, o, b in zip(g.in_size, full, g.out_size, begin))
    return ConvGeometry(g.n, g.groups, g.oc, g.ic, g.out_size, g.in_size, g.kernel, g.strides, g.dilations,
                        begin, end)


#: Tasks of :func:`run_at`'s parameters.
_TASKS = {"forward": 0, "backward_data": 1, "backward_weights": 2}


def at_params(g: ConvGeometry, task: str, shapes: tuple[tuple[int, ...], ...]) -> np.ndarray | None:
    """:func:`run_at`'s parameters (int32: JAX's default integers) for ``task`` on ``g`` (one
    group, f32): the task, the 6-D shapes of its two inputs and result (``shapes``: the loops'
    views of x, y and w), the frames' sizes and the tables (:func:`bind`'s); None where a value
    needs more than 31 bits."""
    xs, ys, ws = shapes
    inputs = {"forward": (xs, ws, ys), "backward_data": (ys, ws, xs), "backward_weights": (xs, ys, ws)}[task]
    loops = _adjoint(g) if task == "backward_data" else g
    tables = _tables(loops)
    frame = (loops.groups, loops.icg, int(tables[0]))
    other = (loops.groups, loops.ocg, int(tables[1])) if task == "backward_weights" else (int(tables[1]), 1, 1)
    values = [_TASKS[task], *(v for shape in inputs for v in shape), *frame, *other, *(int(t) for t in tables)]
    return np.array(values, np.int32) if max(values) < 2 ** 31 else None


def input_sizes(params: np.ndarray) -> tuple[int, int]:
    """The values :func:`run_at` reads from each input under :func:`at_params`' ``params``."""
    return math.prod(params[1:7].tolist()), math.prod(params[7:13].tolist())


@microkernel.cached_njit(fastmath=FASTMATH)
def run_at(a, b, out, params):  # pragma: no cover - compiled
    """:func:`bind`'s loops on f32 memory at addresses (``a``, ``b``: the task's inputs, ``out``
    its result, canonical, one group) with :func:`at_params`' parameters at ``params``: what a
    compiled caller runs without Python (an XLA custom call: :mod:`convgrad.xla_ffi`)."""
    p = numba.carray(addresses.i32_at(params), 36).astype(np.int64)
    src = numba.carray(addresses.f32_at(a), (p[1], p[2], p[3], p[4], p[5], p[6]))
    other = numba.carray(addresses.f32_at(b), (p[7], p[8], p[9], p[10], p[11], p[12]))
    result = numba.carray(addresses.f32_at(out), (p[13], p[14], p[15], p[16], p[17], p[18]))
    frame = np.zeros((p[19], p[20], p[21]), np.float32)
    tables = p[25:36]
    if p[0] == 2:
        _backward_weights(src, 0, other, result, frame, np.zeros((p[22], p[23], p[24]), np.float32), tables)
    else:
        _forward(src, 0, other, p[0] == 1, result, np.empty((0, 0, 0, 0, 0, 0), np.uint16), frame,
                 np.empty(p[22], np.float32), tables)
