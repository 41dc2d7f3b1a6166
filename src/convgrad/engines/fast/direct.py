"""The ``direct`` strategy: compiled loops over the data as it lies (no frame, no GEMM calls).

Two loop nests (numba), for problems where a GEMM path's fixed per-call costs (planning, copies,
Python-level GEMM calls) would dominate, or where there is no GEMM at all (plan parameter
``loops``):

- ``general`` (small problems; serial: waking threads would cost more than the work). With ``G``
  groups of ``I`` input and ``J`` output channels per tap and every array seen as 3-D spatial
  (missing axes of size 1), one loop nest over the outputs ``o`` and taps ``k`` serves all
  three problems::

    y[n, o, g, j]            += sum_i x[n, tap(o, k), g, i] * w[k, g, i, j]   (forward: a gather)
    dx[n, tap(o, k), g, i]   += sum_j dy[n, o, g, j] * w[k, g, i, j]          (backward data: a scatter)
    dw[k, g, i, j]           += sum_{n, o} x[n, tap(o, k), g, i] * dy[n, o, g, j]  (backward weights)

  where ``tap(o, k) = o*S + k*D - PB`` is the input under output o (a tap in the padding is
  skipped): the loops' work is exactly the FLOPs.
- ``flat`` (stride 1): the same sums along the flat frame of the padded input, so that the
  innermost loop runs over positions, not over a few channels (:mod:`.direct_flat`);
- ``depthwise`` (ICg = OCg = 1): the same sums vectorised over the channels and parallel over
  rows (:mod:`.depthwise`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numba
import numpy as np

from ... import casts, kernel_cache
from ...casts import narrowed, widened
from ...dtypes import compute_dtype
from ...problem import ConvGeometry
from . import depthwise, direct_flat, microkernel, pool
from .depthwise import FASTMATH
from .features import Features
from .geometry import params, spatial, tap, tap_weights
from .tuning import TUNING

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["applies", "bind", "loop_shapes", "complete", "options", "run", "serial", "workspace_bytes", "forward", "backward_data",
           "backward_weights"]

LOOPS = ("general", "flat", "depthwise")
#: The loops that run on the calling thread alone (no pool, no workspace).
SERIAL = ("general", "flat")


def serial(plan: Plan) -> bool:
    """Whether ``plan`` runs serially: a warm call runs it outside the pool (:mod:`.pool`)."""
    return plan.strategy == "direct" and plan.param("loops") in SERIAL


def applies(f: Features, plan: Plan | None = None) -> bool:
    """Any non-empty problem; the ``flat`` loops stride-1 ones, the ``depthwise`` loops depthwise ones."""
    if f.n == 0:
        return False
    loops = plan.param("loops") if plan is not None else "general"
    return loops == "general" or loops == "flat" and direct_flat.applies(f.geometry) or \
        loops == "depthwise" and f.depthwise


def complete(f: Features, params: dict) -> dict:
    """``params`` with ``loops`` defaulted: ``depthwise`` for depthwise problems, else ``flat``
    where it applies and its frames waste little (:func:`.direct_flat.waste` at most
    ``TUNING.flat_waste``, half that where the general loops' innermost channels fill a vector:
    ``TUNING.flat_channels``; weights gradients of that many output channels per group never),
    else ``general``."""
    g = f.geometry
    inner = g.icg if f.task == "backward_data" else g.ocg
    narrow = inner < TUNING.flat_channels
    if f.depthwise:
        loops = "depthwise"
    elif direct_flat.applies(g) and (narrow or f.task != "backward_weights") \
            and direct_flat.waste(g, f.task) <= TUNING.flat_waste / (1 if narrow else 2):
        loops = "flat"
    else:
        loops = "general"
    return {"loops": loops, **params}


def options(f: Features) -> list[dict]:
    """The loops worth timing: the depthwise ones where they apply, the general and flat ones
    on small problems (up to 4x ``TUNING.direct_flops``)."""
    small = f.flops <= 4 * TUNING.direct_flops
    return ([{"loops": "depthwise"}] if f.depthwise else []) + ([{"loops": "general"}] if small else []) + \
        ([{"loops": "flat"}] if small and direct_flat.applies(f.geometry) else [])


def run(plan: Plan, g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, rounded: bool = False) -> np.ndarray:
    """``task`` on its two canonical inputs, result in the accumulation dtype, or with
    ``rounded`` (a result in the data's dtype allowed) in the data's dtype where the loops
    round as they store (the depthwise kernels; the general loops' data results, image by image)."""
    return bind(plan, g, task, a.dtype, rounded)(a, b)


def bind(plan: Plan, g: ConvGeometry, task: str, dtype: np.dtype,
         rounded: bool = False) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """:func:`run` of ``plan`` on ``g`` for inputs of ``dtype``, as a function of the two
    canonical inputs (what a repeated call keeps: :meth:`.FastEngine.bind`)."""
    acc = compute_dtype(dtype)
    loops = plan.param("loops")
    if loops == "depthwise":
        return lambda a, b: depthwise.run(g, a, b, task, acc, rounded)
    if loops == "flat":
        return _flat(g, task, acc, rounded)
    if task == "backward_weights":
        return lambda a, b: backward_weights(g, a, b, acc)
    loop = forward if task == "forward" else backward_data
    return lambda a, b: loop(g, a, b, acc, rounded)


def workspace_bytes(f: Features, plan: Plan) -> int:
    """Extra bytes beyond the result: contiguous accumulation-dtype copies of the inputs (the
    weights regrouped; the depthwise loops copy only the weights and inputs not in that dtype),
    for backward weights the (K, G, ICg, OCg) sums (depthwise: the parallel partial sums, a
    scratch row each, and their total), and for bf16/f16 the accumulation-dtype result the API
    rounds; plus 4 KiB for parameters and views."""
    g, acc = f.geometry, f.acc
    x, y, w = (math.prod(s) for s in (g.x_shape, g.y_shape, g.w_shape))
    copies, result = {"forward": (x + w, y), "backward_data": (y + w, x), "backward_weights": (x + y + w, w)}[f.task]
    if plan.param("loops") == "flat":  # contiguous inputs, frames, row, weights (or dw before regrouping)
        inputs = {"forward": x, "backward_data": y, "backward_weights": x + y}[f.task]
        copies = inputs + direct_flat.workspace_items(g, f.task)
    if plan.param("loops") == "depthwise":
        inputs = {"forward": x, "backward_data": y, "backward_weights": x + y}[f.task]
        copies = (inputs if f.data_dtype != acc else 0) + w
        if f.task == "backward_weights":  # the partial sums (a scratch row each) and their sum
            copies += depthwise.parts(g) * (w + g.ic) + w
    return (copies + (result if f.data_dtype != acc else 0)) * acc.itemsize + 4096


FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS = 0, 1, 2


@microkernel.cached_njit(fastmath=FASTMATH)    # its disk cache also keyed on casts' source (widened, narrowed)
def _loops(src, grid, other, out, rounded, stride, dilation, pad, problem, kind):  # pragma: no cover - compiled
    """Over every output position o of ``grid`` (the shape (N, O0, O1, O2, G, J)) and tap k, with
    ``b = tap(o, k)`` in ``src`` (forward, backward weights) or ``out`` (backward data)::

        FORWARD:           out[n, o, g, j] += src[n, b, g, i] * other[k, g, i, j]
        BACKWARD_DATA:     out[n, b, g, i] += src[n, o, g, j] * other[k, g, j, i]
        BACKWARD_WEIGHTS:  out[k, g, i, j] += src[n, b, g, i] * other[n, o, g, j]

    ``src`` (and the weights gradient's ``other``, dy) may hold 16-bit float bits of ``kind``
    (:func:`convgrad.casts.widened`), widened as they are read. With ``rounded`` not empty (a
    data result of such data), ``out`` holds the sums of one image (first axis 1), and image n
    is rounded once into ``rounded[n]`` (bits of ``kind``, :func:`convgrad.casts.narrowed`) when
    its sums are done: f32 sums for one image at a time, not for the whole result."""
    n_, o0_, o1_, o2_ = grid[:4]
    _, s0_, s1_, s2_ = out.shape[:4] if problem == BACKWARD_DATA else src.shape[:4]
    g_, i_ = src.shape[4:]
    k0_, k1_, k2_ = out.shape[:3] if problem == BACKWARD_WEIGHTS else other.shape[:3]
    j_ = out.shape[5]
    by_image = rounded.size > 0
    sums = out.reshape(-1)
    out[...] = 0
    for n in range(n_):
        m = 0 if by_image else n
        for o0 in range(o0_):
            for o1 in range(o1_):
                for o2 in range(o2_):
                    for k0 in range(k0_):
                        b0 = tap(o0, k0, stride[0], dilation[0], pad[0], s0_, False)
                        if b0 < 0:
                            continue
                        for k1 in range(k1_):
                            b1 = tap(o1, k1, stride[1], dilation[1], pad[1], s1_, False)
                            if b1 < 0:
                                continue
                            for k2 in range(k2_):
                                b2 = tap(o2, k2, stride[2], dilation[2], pad[2], s2_, False)
                                if b2 < 0:
                                    continue
                                for g in range(g_):
                                    for i in range(i_):
                                        if problem == FORWARD:
                                            v = widened(src[n, b0, b1, b2, g, i], kind)
                                            for j in range(j_):
                                                out[m, o0, o1, o2, g, j] += v * other[k0, k1, k2, g, i, j]
                                        elif problem == BACKWARD_DATA:
                                            v = widened(src[n, o0, o1, o2, g, i], kind)
                                            for j in range(j_):
                                                out[m, b0, b1, b2, g, j] += v * other[k0, k1, k2, g, i, j]
                                        else:
                                            v = widened(src[n, b0, b1, b2, g, i], kind)
                                            for j in range(j_):
                                                d = widened(other[n, o0, o1, o2, g, j], kind)
                                                out[k0, k1, k2, g, i, j] += v * d
        if by_image:
            image = rounded[n].reshape(-1)
            for e in range(sums.size):
                image[e] = narrowed(sums[e], kind)
            sums[:] = 0


@functools.lru_cache(maxsize=256)
def loop_shapes(g: ConvGeometry) -> tuple[tuple[int, ...], ...]:
    """The loops' views: x and y as (N, X0, X1, X2, G, C/G), weights as (K0, K1, K2, G, ICg,
    OCg) and, transposed, (..., G, OCg, ICg) (remembered per geometry)."""
    def grouped(shape: tuple[int, ...], channels: int) -> tuple[int, ...]:
        return (shape[0], *spatial(shape[1:-1], 1), g.groups, channels)
    kernel = spatial(g.kernel, 1)
    return (grouped(g.x_shape, g.icg), grouped(g.y_shape, g.ocg), (*kernel, g.groups, g.icg, g.ocg),
            (*kernel, g.groups, g.ocg, g.icg))


def _data(arrays: tuple[np.ndarray, ...], dtype: np.dtype) -> tuple[list[np.ndarray], int]:
    """Contiguous data arrays for the loops, and their :func:`convgrad.casts.widened` kind:
    16-bit floats as their bits where the loops widen them as they read them (no f32 copy: the
    bf16 dilated layers took 2.0-2.7x their inputs and output in copies), else in ``dtype``."""
    if arrays[0].dtype != dtype and len({a.dtype for a in arrays}) == 1:
        bits = [casts.in_place(np.ascontiguousarray(a)) for a in arrays]
        if all(b is not None for b in bits):
            return [v for v, _ in bits], bits[0][1]
    return [np.ascontiguousarray(a, dtype) for a in arrays], 0


_UNROUNDED = np.empty((0,) * 6, np.uint16)   # the loops' ``rounded`` where they sum into the whole result


def _outputs(shape: tuple[int, ...], grouped: tuple[int, ...], dtype: np.dtype, kind: int, rounded: bool,
             data_dtype: np.dtype, image: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the loops' sums, their ``rounded`` target, the result): with ``rounded`` and 16-bit data
    read as bits (``kind``), the result in the data's dtype (the loops round into it) and one
    image of ``dtype`` sums (``image``; else none); else the whole result in ``dtype``."""
    if rounded and kind:
        result = np.empty(shape, data_dtype)
        return np.empty((1, *grouped[1:]) if image else (0,) * 6, dtype), result.view(np.uint16).reshape(grouped), result
    result = np.empty(shape, dtype)
    return result.reshape(grouped), _UNROUNDED, result


#: Per dtype, the exponent field of four (16-bit) or two (f32) values in a 64-bit word, and the
#: value that carries an all-ones field into each value's sign bit (:func:`_exponents_full`).
EXPONENT_WORDS: dict[np.dtype, tuple[np.uint64, np.uint64, np.uint64]] = {
    dtype: (np.uint64(field * repeat), np.uint64(carry * repeat), np.uint64(sign * repeat))
    for dtype, field, carry, sign, repeat in (
        (np.dtype(np.float32), 0x7F800000, 0x00800000, 0x80000000, 0x100000001),
        (casts.BFLOAT16, 0x7F80, 0x0080, 0x8000, 0x0001000100010001),
        (np.dtype(np.float16), 0x7C00, 0x0400, 0x8000, 0x0001000100010001))}


@kernel_cache.njit()
def _exponents_full(words, field, carry):  # pragma: no cover - compiled
    """The OR over 64-bit ``words`` of ``(word & field) + carry``: a value's sign bit is set in it
    where some value's exponent field is all ones (Inf or NaN); lanes never carry into each other."""
    acc = np.uint64(0)
    for i in range(words.shape[0]):
        acc |= (words[i] & field) + carry
    return acc


#: 64-bit words per part of :func:`_exponents_parts` (256 KiB): a larger array's scan in parallel.
_SCAN_WORDS = 1 << 15


@kernel_cache.njit(parallel=True)
def _exponents_parts(words, field, carry, out):  # pragma: no cover - compiled
    """:func:`_exponents_full` of each :data:`_SCAN_WORDS` part of ``words`` into ``out``, the
    parts in parallel."""
    for p in numba.prange(out.shape[0]):
        out[p] = _exponents_full(words[p * _SCAN_WORDS:(p + 1) * _SCAN_WORDS], field, carry)


def finite(values: np.ndarray, acc: np.dtype = np.dtype(np.float32)) -> bool:
    """Whether every value is finite. The GEMM-based paths multiply zeros of padding (and junk
    rows) with the weights, or a weights gradient's dy with x's padding: a NaN or Inf there would
    make outputs NaN that meet it only in padding. f32, bf16 and f16 in one block of memory: their
    exponent bits, 64 bits at a time (ResNet-50's 64-channel 56x56 data gradient at mb 16, a Zen
    5: bf16 0.57 -> 0.06 ms, f32 0.40 -> 0.14, the bf16 call's tenth before); else one sum (one
    that overflows counts as not finite, which only sends a problem to this module's exact loops)."""
    words = EXPONENT_WORDS.get(values.dtype)
    flat = values.ravel(order="K") if words is not None and (values.flags.c_contiguous or values.flags.f_contiguous) \
        else None
    if flat is None or not flat.size:
        with np.errstate(invalid="ignore", over="ignore"):      # Inf - Inf: a NaN is the answer, not a warning
            return math.isfinite(float(np.add.reduce(values, axis=None, dtype=acc)))
    per = 8 // flat.itemsize
    head = min(flat.size, -flat.ctypes.data % 8 // flat.itemsize)     # values before the first whole word
    body = (flat.size - head) // per * per
    ends = np.concatenate((flat[:head], flat[head + body:]))
    field, carry, sign = words
    scan = flat[head:head + body].view(np.uint64)
    if scan.size > 2 * _SCAN_WORDS and pool.threads() > 1:   # 6.4 MB of bf16 x: 0.2 -> 0.1 ms
        parts = np.empty(-(-scan.size // _SCAN_WORDS), np.uint64)
        _exponents_parts(scan, field, carry, parts)
        full = np.bitwise_or.reduce(parts)
    else:
        full = _exponents_full(scan, field, carry)
    return bool(np.isfinite(ends.astype(np.float32)).all()) and not (full & sign)


def forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray, dtype: np.dtype, rounded: bool = False) -> np.ndarray:
    """y = conv(x, w) in ``dtype`` (or, ``rounded``, in x's 16-bit dtype: :func:`_outputs`),
    canonical (N, *O, OC)."""
    xs, ys, ws, _ = loop_shapes(g)
    taps = np.ascontiguousarray(tap_weights(g, w), dtype).reshape(ws)
    (src,), kind = _data((x,), dtype)
    sums, bits, y = _outputs(g.y_shape, ys, dtype, kind, rounded, x.dtype)
    _loops(src.reshape(xs), ys, taps, sums, bits, *params(g), FORWARD, kind)
    return y


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dtype: np.dtype, rounded: bool = False) -> np.ndarray:
    """dx in ``dtype`` (or, ``rounded``, in dy's 16-bit dtype: :func:`_outputs`), canonical (N, *I, IC)."""
    xs, ys, _, wt = loop_shapes(g)
    taps = np.ascontiguousarray(tap_weights(g, w, True), dtype).reshape(wt)
    (src,), kind = _data((dy,), dtype)
    sums, bits, dx = _outputs(g.x_shape, xs, dtype, kind, rounded, dy.dtype)
    _loops(src.reshape(ys), ys, taps, sums, bits, *params(g), BACKWARD_DATA, kind)
    return dx


def _flat(g: ConvGeometry, task: str, dtype: np.dtype, rounded: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``task`` on the :mod:`.direct_flat` loops as a function of the two canonical inputs, result
    in ``dtype`` (canonical), or with ``rounded`` a data result of 16-bit data in the data's dtype,
    each value rounded as stored."""
    xs, ys, ws, _ = loop_shapes(g)
    loops = direct_flat.bind(g, task)
    if task == "backward_weights":
        def weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            (x, dy), kind = _data((a, b), dtype)
            dw = np.empty(ws, dtype)
            loops(x.reshape(xs), kind, dy.reshape(ys), dw, _UNROUNDED)
            return np.ascontiguousarray(dw.transpose(0, 1, 2, 4, 3, 5)).reshape(g.w_shape)
        return weights
    forward = task == "forward"
    src_shape, out_shape, grouped = (xs, g.y_shape, ys) if forward else (ys, g.x_shape, xs)
    as_lies = g.groups == 1  # canonical (*K, ICg, OC) is (*K, 1, ICg, OCg) as it lies

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if as_lies and b.dtype == dtype and b.flags.c_contiguous:
            w = b.reshape(ws)
        else:
            w = np.ascontiguousarray(tap_weights(g, b), dtype).reshape(ws)
        (src,), kind = _data((a,), dtype)
        sums, bits, result = _outputs(out_shape, grouped, dtype, kind, rounded, a.dtype, image=False)
        loops(src.reshape(src_shape), kind, w, sums, bits)
        return result
    return run


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """dw in ``dtype``, canonical (*K, ICg, OC)."""
    xs, ys, ws, _ = loop_shapes(g)
    dw = np.empty((*ws[:3], g.groups, g.icg, g.ocg), dtype)
    (src, dys), kind = _data((x, dy), dtype)
    _loops(src.reshape(xs), ys, dys.reshape(ys), dw, _UNROUNDED, *params(g), BACKWARD_WEIGHTS, kind)
    return np.ascontiguousarray(dw.transpose(0, 1, 2, 4, 3, 5)).reshape(g.w_shape)
