"""The ``jit`` strategy: implicit-GEMM convolutions on our own micro-kernels (:mod:`.microkernel`).

The oneDNN way, on channels-last (NXC) data seen as 3-D spatial (missing axes of size 1), f32
accumulation (bf16/f16 data widened to f32 in the copies below; bf16 forward and backward data on
the ``avx512_bf16`` family read bf16 channel pairs instead, on the dot-product kernel), ``W`` = the
family's vector width, per group ``g``:

- forward: ``y[n, o, oc] = sum_{k, ic} xp[n, o*S + k*D, ic] * w[k, ic, oc]`` with ``xp`` the
  zero-padded copy of x. A register block is ``R`` consecutive outputs along the last spatial
  axis x ``V`` vectors of ``W`` output channels (weights packed as ``(G, OC blocks, K, ICg, V*W)``,
  zero past OCg); its reduction loops over the taps ``k`` (outer) and the input channels ``ic``
  (inner), reading ``xp`` where it lies (never an im2col buffer).
- backward data: split dx into the ``prod(S)`` stride phases ``i = q*S + r``; phase ``r`` is a
  stride-1 convolution of the padded dy with the taps whose ``(r + PB - k*D)`` is a multiple of
  ``S`` (offsets ``c_k = (r + PB - k*D) / S``) and the transposed weights ``w[k]^T`` (oneDNN's
  skipping of non-dividing taps, per phase); a phase without taps is written as zeros.
- backward weights: ``dw[k, ic, oc] = sum_{n, o} xp[n, o*S + k*D, ic] * dy[n, o, oc]``: blocks of
  ``R`` adjacent input channels (broadcast, from the zero-padded copy of x, as the forward
  reads it) x ``V`` vectors of output channels, the reduction over the
  positions of a chunk of output rows (about the plan's ``cache_bytes`` of x and dy), every tap and
  channel block run per chunk; each thread sums its share of the rows into its own partial dw,
  then the partials are added (or, with the plan's ``split`` "blocks", each thread owns a share of
  dw's blocks over all positions).

Threads: numba ``prange`` over (image, output row, group, channel block) items (forward, data)
or over shares of the output rows or of dw's blocks (weights). The source copies carry a zeroed tail so that
the rows of a block past the end of an output row read in bounds (their results are dropped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numba
import numpy as np

from ... import casts, kernel_cache, layout
from ...casts import F16_BITS, narrowed
from ...dtypes import bfloat16
from ...problem import ConvGeometry
from . import blis, direct, geometry, isa, microkernel, pool, tap_gemm, tiles, workspace
from .features import Features
from .frame import empty_like_data
from .geometry import padded, phase_taps, spatial, spatial3, tap_weights
from .tuning import TUNING, remembered

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["applies", "complete", "options", "run", "workspace_bytes", "forward", "backward_data",
           "backward_weights"]

F32 = np.dtype(np.float32)
#: Remembered per arguments and this module's tuning table (:func:`.tuning.remembered`).
_remembered = remembered(lambda: TUNING)
#: Plan parameters: ``block`` the register block "RxV" (:data:`.microkernel.BLOCKS` of the
#: family's width), ``cache_bytes`` (see :class:`.tuning.Tuning`), and for the weights gradient
#: ``split``: the threads share the output positions ("rows") or dw's blocks ("blocks"), or, bf16
#: on AMX tiles, one deep GEMM per tap ("taps", :mod:`.tap_gemm`).
SPLITS = ("rows", "blocks", "taps")


def applies(f: Features, plan: Plan | None = None) -> bool:
    """Whether the jit kernels can run ``f`` (with ``plan``): an f32-accumulating problem
    (f32/bf16/f16 data), not depthwise, on a host family with JIT kernels (not ``portable``)."""
    if not (f.acc == F32 and isa.family() in isa.WIDTH and not f.depthwise and f.n > 0):
        return False
    tile_blocks = on_tiles(f) or f.pointwise or taps_on_tiles(f)    # the latter two: blocks our GEMMs pick
    return plan is None or (_block_of(plan.param("block"), tile_blocks) is not None and plan.param("split") in SPLITS
                            and (plan.param("split") != "taps" or taps_on_tiles(f))
                            and isinstance(plan.param("cache_bytes"), int) and plan.param("cache_bytes") > 0)


def _block_of(name: object, tile_blocks: bool = True) -> tuple[int, int] | None:
    """The (rows R, vectors V) of a block named "RxV" among the family's blocks (and, with
    ``tile_blocks``, on the ``amx_bf16`` family, its tile blocks), or None."""
    blocks = microkernel.BLOCKS[_width()] + (tiles.TILE_BLOCKS if tile_blocks and isa.family() == "amx_bf16" else ())
    return next(((r, v) for r, v in blocks if f"{r}x{v}" == name), None)


def taps_on_tiles(f: Features) -> bool:
    """Whether ``f`` can run as one GEMM per tap on AMX tiles (:mod:`.tap_gemm`): a bf16
    weights gradient of one group on the ``amx_bf16`` family."""
    return f.task == "backward_weights" and f.dtype == "bfloat16" and f.family == "amx_bf16" and f.groups == 1


def on_tiles(f: Features) -> bool:
    """Whether ``f``'s blocks may be AMX tile blocks: bf16 forward and backward data on the
    ``amx_bf16`` family (the weights gradient's operand pairs lie along positions, not in a
    tile's rows; pointwise problems: our GEMM picks)."""
    return on_dot_product(f) and f.family == "amx_bf16" and f.task != "backward_weights"


def complete(f: Features, params: dict) -> dict:
    """``params`` with the missing ones defaulted for ``f``: the block with the fewest idle lanes
    (and, for the weights gradient, rows) over the channels (:func:`.microkernel.block_for`; a
    pointwise problem: the GEMM's, :func:`.blis.register_block`), ``cache_bytes`` (the weights
    gradient's ``TUNING.cache_bytes``; forward and backward data keep every channel block's
    packed weights in the loop while they fit the host's L2), and the weights gradient's split by
    dw's size next to x and dy (``TUNING.weights_split``), or by blocks where a partial dw per
    thread would take more than ``TUNING.junk_memory`` times the inputs and output (dilated_conv:24:
    2.15x by rows, 1.96x by blocks, as fast)."""
    g = f.geometry
    channels = g.icg if f.task == "backward_data" else g.ocg
    if f.pointwise:        # one GEMM over the positions: our GEMM's block for its M x N
        positions = g.n * math.prod(g.out_size)
        m, k = {"forward": (positions, g.icg), "backward_data": (positions, g.ocg),
                "backward_weights": (g.icg, positions)}[f.task]
        rows, vecs = blis.register_block(channels, _width(), m, 4 // _depth(f.data_dtype), k)
    elif on_tiles(f):
        rows, vecs = microkernel.tile_block_for(channels)
    else:
        weights = f.task == "backward_weights"       # rows over input channels: weighed as our GEMM's
        rows, vecs = microkernel.block_for(channels, _width(), input_rows(f) if weights else None,
                                           _computed(g, f.task), TUNING.gemm_loads_weight if weights else None)
    by_blocks = math.prod(g.w_shape) > TUNING.weights_split * (math.prod(g.x_shape) + math.prod(g.y_shape))
    cache = TUNING.cache_bytes if f.task == "backward_weights" else max(TUNING.cache_bytes, isa.cache_sizes()[1])
    split = "taps" if taps_on_tiles(f) else "blocks" if f.task == "backward_weights" and by_blocks else "rows"
    full = {"block": f"{rows}x{vecs}", "cache_bytes": cache, "split": split, **params}
    if full["split"] == "rows" and "split" not in params and f.task == "backward_weights":
        from .plan import Plan     # partial sums per thread over TUNING.junk_memory x the data: one dw
        if workspace_bytes(f, Plan.of("jit", **full)) > TUNING.junk_memory * f.io_bytes:
            full["split"] = "blocks"
    return full


def folds(g: ConvGeometry, depth: int) -> int:
    """How many taps of the last kernel axis a weights gradient of ``g`` (values ``depth`` per
    reduction step) reads as input channels: ``K2`` where there is one group of fewer than
    ``TUNING.fold_channels`` channels, dilation 1 along that axis and no bf16 pairs, else 1. In
    NXC memory the padded ``x[.., p*S + k, c]`` lies at ``p*S*C + (k*C + c)``: the ``K2*C``
    channels ``j = k*C + c`` of a position are adjacent, so ``dw[.., k, c, :]`` is a block row
    ``j`` of the (K0, K1) tap's GEMM, and a first layer's 3 channels fill 3*K2 rows."""
    k2, d2 = spatial(g.kernel, 1)[2], spatial(g.dilations, 1)[2]
    return k2 if depth == 1 and g.groups == 1 and d2 == 1 and g.icg < TUNING.fold_channels else 1


def input_rows(f: Features) -> int:
    """The rows over which a weights gradient's register blocks run: ICg, times :func:`folds`."""
    return f.geometry.icg * folds(f.geometry, 2 if weights_in_pairs(f) else 1)


def idle(f: Features) -> float:
    """FMAs the register block :func:`complete` picks for ``f`` computes per one kept (idle
    lanes, and for the weights gradient idle rows of input channels)."""
    block = _block_of(complete(f, {})["block"], on_tiles(f))
    assert block is not None
    channels = f.geometry.icg if f.task == "backward_data" else f.geometry.ocg
    return microkernel.idle(block, channels, _width(), input_rows(f) if f.task == "backward_weights" else None)


def _computed(g: ConvGeometry, task: str) -> Callable[[int], float] | None:
    """For forward and backward data of stride 1 along the last two axes: the positions the
    driver computes per position kept, for blocks of R rows (:func:`_run_outputs`: the rows
    flattened with the padded source's width, or cut at each row end, whichever computes fewer);
    None elsewhere."""
    if task == "backward_weights" or spatial(g.strides, 1)[1:] != (1, 1):
        return None
    q1, q2 = spatial(g.out_size if task == "forward" else g.in_size, 1)[1:]
    pitch = q2 + spatial(g.effective_kernel, 1)[2] - 1

    def computed(r: int) -> float:
        return min(-(-((q1 - 1) * pitch + q2) // r) * r, q1 * -(-q2 // r) * r) / (q1 * q2)
    return computed


def options(f: Features) -> list[dict]:
    """Parameter sets worth timing: each register block of the family (and for the weights
    gradient, each split)."""
    splits = tuple(s for s in SPLITS if s != "taps" or taps_on_tiles(f)) if f.task == "backward_weights" else ("rows",)
    blocks = microkernel.BLOCKS[_width()] + (tiles.TILE_BLOCKS if on_tiles(f) else ())
    return [{"block": f"{r}x{v}", "split": s} for r, v in blocks for s in splits]


def _plan(g: ConvGeometry, task: str, plan: Plan | None) -> Plan:
    """``plan``, or the default plan of f32 NXC data for ``task`` on ``g``."""
    from .plan import Plan
    if plan is not None:
        return plan
    f = Features.of(g, task, F32, False)
    return Plan.of("jit", **complete(f, {}))


def run(plan: Plan, g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, rounded: bool = False) -> np.ndarray:
    """``task`` on its two canonical inputs, f32 result: a pointwise problem (1x1, unpadded, one
    group) as one GEMM (:func:`pointwise`), the others by their drivers. With ``rounded``, a
    16-bit result where the driver stores each value once, rounded as it stores it: bf16 on the
    dot product (the GEMM's, forward and data gradient), any bf16/f16 data's forward and
    data gradient of several taps (:func:`_rounding`), and a bf16 weights gradient run a few
    taps at a time (:func:`_tap_slab`). Padded problems with a NaN or Inf weight (forward, data
    gradient) or in dy (weights gradient), where the result is not finite either (the smaller of
    the two looked at first: 0.74 ms for ResNet-50's largest weights was 30 % of an mb-1 call;
    the weights as the packing of forward and data gradient saw them: 18-24 µs of an mb-1 3x3
    call), run again on :mod:`.direct`'s exact loops: padding is not part of the sums
    (docs/guarantees.md). NCX data's f32 forward and data gradient come back in NCX memory
    (:func:`_in_memory_of`)."""
    if geometry.pointwise(g):
        return pointwise(g, a, b, task, plan, rounded)
    if task == "backward_weights":
        result, checked = backward_weights(g, a, b, plan, rounded), []
    else:           # each packing of w says whether its values were finite: then no pass over w
        checked = []
        result = (forward if task == "forward" else backward_data)(g, a, b, plan, rounded, checked)
    if not geometry.has_padding(g) or checked and all(finite is True for finite in checked) \
            or not _nonfinite(result, b):
        return result if task == "backward_weights" else _in_memory_of(result, a)
    if task == "backward_weights":                  # padding zeros times NaN/Inf: the exact loops
        return direct.backward_weights(g, a, b, F32)
    return (direct.forward if task == "forward" else direct.backward_data)(g, a, b, F32, rounded)


def _in_memory_of(result: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A forward or data gradient's NXC ``result`` (f32, or 16-bit rounded) in NCX memory where
    the data ``a`` is (a canonical view: the API's copy into NCX memory is then none),
    transposed in parallel."""
    if result.ndim < 3 or result.dtype.itemsize not in (2, 4) or not layout.channels_first(a) \
            or not result.flags.c_contiguous:
        return result
    images = blis.transposed_images(result.reshape(result.shape[0], -1, result.shape[-1]))
    return np.moveaxis(images.reshape(result.shape[0], result.shape[-1], *result.shape[1:-1]), 1, -1)


def _nonfinite(*arrays: np.ndarray) -> bool:
    """Whether every one of ``arrays`` holds a NaN or Inf, the smallest looked at first (one
    finite array settles it). A NaN/Inf weight (dy, for the weights gradient) that meets
    padding makes the result non-finite, so both must be for the padding to matter."""
    return all(not direct.finite(a) for a in sorted(arrays, key=lambda a: a.size))


def _operand(a: np.ndarray) -> np.ndarray:
    """``a`` as the GEMM reads it: bf16 bits (uint16) on a family of bf16 pairs, else f32."""
    return a.view(np.uint16) if _depth(a.dtype) == 2 else a.astype(F32, copy=False)


def pointwise(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, plan: Plan | None = None,
              rounded: bool = False) -> np.ndarray:
    """A 1x1 unpadded one-group convolution as GEMMs of :func:`.blis.gemm` over the positions
    ``x_s = x[:, ::S...]`` the strides keep (M of them): forward ``y = x_s @ w`` (M x IC x OC),
    backward data ``dx_s = dy @ w^T`` (zero elsewhere), backward weights ``dw = x_s^T @ dy``
    (IC x M x OC: reduced over the positions, bf16 packed in pairs of positions). NCX data runs
    one GEMM per image with the roles exchanged (:func:`_pointwise_ncx`), results in NCX memory.
    16-bit data the kernels read as f32 runs in chunks (:func:`_widened_gemm`). With
    ``rounded``, 16-bit NXC data gives its dtype's result, each value rounded once."""
    if layout.channels_first(a):
        return _pointwise_ncx(g, a, b, task, plan, rounded)
    block = _block(plan)[:2] if plan is not None else None
    widened = a.dtype != F32 and _depth(a.dtype) == 1      # f16, or bf16 off the dot product: f32 per chunk
    out = a.dtype if rounded and (widened or _depth(a.dtype) == 2) else F32

    def gemm(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        if widened:
            return _widened_gemm(lhs, rhs, block, out)
        result = blis.gemm(lhs, rhs, block, out != F32)
        return result.view(out) if out != F32 else result

    operand = (lambda v: v) if widened else _operand
    if task == "backward_data":
        rows = gemm(operand(a).reshape(-1, g.oc), operand(b).reshape(g.ic, g.oc).T)
        if all(s == 1 for s in g.strides):      # every position kept (1x1, unpadded: O = I)
            return np.ascontiguousarray(rows).reshape(g.x_shape)
        return geometry.spread(rows.reshape(g.y_shape[:-1] + (g.ic,)), g.strides,
                               empty_like_data(g.x_shape, out, a))
    if task == "backward_weights" and _depth(a.dtype) == 2 and isa.bf16_kernel() >= microkernel.TILES_STANDIN:
        return tap_gemm.run(g, a, b, out != F32, check=False)[0]   # AMX: x^T in tile rows (1x1 unpadded: no junk)
    xs = _positions(operand(a), g)
    if task == "forward":
        return np.ascontiguousarray(gemm(xs, operand(b).reshape(g.ic, g.oc))).reshape(g.y_shape)
    return np.ascontiguousarray(gemm(xs.T, operand(b).reshape(-1, g.oc))).reshape(g.w_shape)


def _positions(a: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """The positions of canonical ``a`` that a 1x1 convolution of ``g`` reads, as (M, IC) rows:
    a view where they are evenly spaced (every position, or a stride along one axis only), else a
    parallel copy (:func:`.geometry.sampled`)."""
    kept = a[(slice(None), *(slice(None, o * s, s) for o, s in zip(g.out_size, g.strides)), slice(None))]
    try:
        return np.reshape(kept, (-1, g.ic), copy=False)
    except ValueError:
        return geometry.sampled(a, g.strides, g.out_size).reshape(-1, g.ic)


#: Chunks of a widened 16-bit pointwise GEMM (:func:`_widened_gemm`).
WIDENED_CHUNKS = 4


def _widened_gemm(a: np.ndarray, b: np.ndarray, block: tuple[int, int] | None, dtype: np.dtype) -> np.ndarray:
    """``a @ b`` of 16-bit operands the kernels read as f32 (f16; bf16 off the dot product), in
    ``dtype`` (the data's, each value rounded once, or f32), in :data:`WIDENED_CHUNKS` chunks,
    each chunk of an operand widened just before its GEMM and its result stored at once: f32
    copies of a chunk, never of a whole operand, and no f32 result where ``dtype`` is 16-bit
    (whole f32 copies and the f32 result took 2.3-3.1x the inputs and output on ResNet-50's f16
    1x1 layers). A deep reduction (:func:`.blis.deep`: a weights gradient over many positions)
    is chunked along K, its chunks' products summed; others along the larger of M and N."""
    m, k = a.shape
    n = b.shape[1]
    if blis.deep(m, k, n):
        step = max(1, -(-k // WIDENED_CHUNKS))
        total = np.zeros((m, n), F32)
        for lo in range(0, k, step):
            total += blis.gemm(_f32(a[:, lo:lo + step]), _f32(b[lo:lo + step]), block)
        return total if dtype == F32 else casts.from_f32(total, dtype)
    out = workspace.result((m, n), dtype)
    if m >= n:
        whole, step = _f32(b), max(1, -(-m // WIDENED_CHUNKS))
        for lo in range(0, m, step):
            casts.copy_into(out[lo:lo + step], blis.gemm(_f32(a[lo:lo + step]), whole, block))
    else:
        whole, step = _f32(a), max(1, -(-n // WIDENED_CHUNKS))
        for lo in range(0, n, step):
            casts.copy_into(out[:, lo:lo + step], blis.gemm(whole, _f32(b[:, lo:lo + step]), block))
    return out


def _f32(a: np.ndarray) -> np.ndarray:
    """A 16-bit matrix (or a strided chunk of one) widened to f32 along its memory (rows, or
    columns of a transposed one)."""
    if a.T.flags.c_contiguous and not a.flags.c_contiguous:
        return casts.astype(a.T, F32).T
    return casts.astype(np.ascontiguousarray(a), F32)


def _pointwise_ncx(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, plan: Plan | None,
                   rounded: bool = False) -> np.ndarray:
    """:func:`pointwise` on NCX data. Where :func:`ncx_transposes`, on NXC copies of the data
    (:func:`_pointwise_transposed`); else image by image, each image's (channels, positions)
    matrix read where it lies: forward ``y_n = w^T @ x_n`` (OC x IC x P), backward data ``dx_n
    = w @ dy_n`` (IC x OC x P), the kernels storing into the result's image; backward weights
    ``dw = sum_n x_n @ dy_n^T`` (IC x P x OC). A strided data gradient's rows are spread to its
    positions. With ``rounded``, bf16 pairs give a bf16 forward or data gradient, rounded as the
    kernels store it."""
    if ncx_transposes(g, task, a.dtype):
        return _pointwise_transposed(g, a, b, task, plan, rounded)
    block = _block(plan)[:2] if plan is not None else None
    keep = (slice(None), slice(None), *(slice(None, o * s, s) for o, s in zip(g.out_size, g.strides)))
    first = np.moveaxis(_operand(a), -1, 1)                          # (N, C, *X): its NCX memory
    positions = math.prod(g.out_size)
    if task == "backward_weights":                                   # a is x, b is dy
        x_s, dy = first[keep], np.moveaxis(_operand(b), -1, 1)
        if not x_s.flags.c_contiguous:                               # strided: the kept positions, in parallel
            x_s = _compact(x_s)
        dw = np.zeros((g.ic, g.oc), F32)
        for n in range(g.n):
            dw += blis.gemm(x_s[n].reshape(g.ic, -1), dy[n].reshape(g.oc, -1).T, block)
        return dw.reshape(g.w_shape)
    w2 = _operand(b).reshape(g.ic, g.oc)
    lhs = np.ascontiguousarray(w2.T) if task == "forward" else w2     # A read in place, rows adjacent
    src = first[keep] if task == "forward" else first
    out_c, spread = (g.oc, False) if task == "forward" else (g.ic, g.in_size != g.out_size)
    rounding = rounded and _depth(a.dtype) == 2
    kind = np.dtype(np.uint16) if rounding else F32                  # bf16 bits, rounded as stored
    shape = (g.n, out_c, positions)            # the kernels store into the image (no padded result, no copy)
    rows = workspace.empty(math.prod(shape), kind).reshape(shape) if spread else workspace.result(shape, kind)
    for n in range(g.n):
        blis.gemm(lhs, src[n].reshape(src.shape[1], -1), block, rounding, into=rows[n])
    rows = rows.reshape(g.n, out_c, *g.out_size)
    if spread:
        out = workspace.result((g.n, out_c, *g.in_size), kind)
        rows = geometry.spread_planes(rows, g.strides, out)         # zero where the strides skip
    return np.moveaxis(rows.view(a.dtype) if rounding else rows, 1, -1)


def ncx_transposes(g: ConvGeometry, task: str, dtype: np.dtype) -> bool:
    """Whether an NCX 1x1 ``task`` on ``g`` runs on NXC copies (:func:`_pointwise_transposed`):
    where the data it copies (x; dy for a data gradient) holds fewer positions per image than
    ``TUNING.ncx_transposed_positions`` for its item size, or a weights gradient's N partial dw
    would move more than copies of x and dy (IC*OC > (IC + OC)*P). Per-image GEMMs of few
    positions pack the weights (or sum a partial dw) an image at a time."""
    positions = math.prod(g.out_size if task == "backward_data" else g.in_size)
    return positions < TUNING.ncx_transposed_positions.get(np.dtype(dtype).itemsize, 0) or \
        task == "backward_weights" and g.ic * g.oc > (g.ic + g.oc) * math.prod(g.out_size)


def _pointwise_transposed(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, plan: Plan | None,
                          rounded: bool = False) -> np.ndarray:
    """:func:`pointwise` of NCX ``a`` (and dy, for the weights gradient) on NXC copies, each
    image transposed in register tiles (:func:`.blis.channels_last`), a forward or data
    gradient's NXC result transposed back into NCX memory (:func:`_in_memory_of`)."""
    nxc = blis.channels_last
    result = pointwise(g, nxc(a), nxc(b) if task == "backward_weights" else b, task, plan, rounded)
    return result if task == "backward_weights" else _in_memory_of(result, a)


def _compact(v: np.ndarray) -> np.ndarray:
    """A view ``v`` (A, B, *O), any strides, copied in parallel into a C-contiguous array of the
    engine's cache (:func:`.geometry.spread_planes` with strides 1)."""
    return geometry.spread_planes(v, (1,) * (v.ndim - 2), workspace.empty(v.size, v.dtype).reshape(v.shape))


def _block(plan: Plan) -> tuple[int, int, int]:
    """(rows R, vectors V, lanes V*W) of ``plan``'s register block."""
    return _block_on(plan.param("block"), isa.family())


@_remembered
def _block_on(name: str, family: str) -> tuple[int, int, int]:
    """:func:`_block` of the block ``name`` on the kernel ``family`` (remembered: a call's Python)."""
    rows, vecs = _block_of(name)
    return rows, vecs, vecs * _width()


def workspace_bytes(f: Features, plan: Plan) -> int:
    """Upper estimate of the extra bytes ``task`` allocates (f32 values; for bf16/f16 ``dtype``
    the f32 result the API rounds included): the padded copy of x (forward, weights gradient)
    or dy (data) with its slack (f32 and bf16 pairs: at most the inputs + output or one image,
    :func:`_chunks`), the packed weights (forward, data), or for the weights gradient the packed dy,
    the partial sums of every share (at most the threads) and their total; plus 64 KiB of tables and
    per-thread accumulator blocks."""
    g, task = f.geometry, f.task
    rows, _, vw = _block(plan)
    if f.pointwise and f.channels_first and ncx_transposes(g, task, f.data_dtype):   # NXC copies (each
        copied = math.prod(g.y_shape) if task == "backward_data" else math.prod(g.x_shape) + (   # maybe compacted
            math.prod(g.y_shape) if task == "backward_weights" else 0)          # first), the NXC run, its result
        return workspace_bytes(dataclasses.replace(f, channels_first=False), plan) + 4 * (   # transposed back
            2 * copied + math.prod(f.result_shape))
    if f.pointwise:    # the GEMM's workspace, x_s (strided or widened), a zeroed dx, the f32 result
        m = g.n * math.prod(g.out_size)
        k, n = {"forward": (g.ic, g.oc), "backward_data": (g.oc, g.ic), "backward_weights": (m, g.oc)}[task]
        rows_ = g.ic if task == "backward_weights" else m
        tap = tap_gemm.workspace_bytes(m, g.ic, g.oc, 1, 0) + 2 * m * g.ic if taps_on_tiles(f) else 0
        gemm = blis.workspace_bytes(rows_, k, n, 4)
        if f.channels_first and task != "backward_weights":
            # NCX: the data is B (its panels; strided images copied), the weights A (transposed)
            gemm = max(gemm, blis.workspace_bytes(n, k, m, 4)) + 4 * (m * k + k * n)
        return max(tap, gemm) + 4 * (m * g.ic + math.prod(g.x_shape)
                                     + math.prod(f.result_shape)) + (64 << 10)
    if task == "backward_weights" and plan.param("split") == "taps":    # padded x and dy, their tiles, dw in f32
        return tap_gemm.conv_workspace_bytes(g) + 4 * math.prod(g.w_shape)
    folded = _folded_data(g, f.data_dtype) if task == "backward_data" else None
    if folded is not None:   # a chunk's folded f32 dx and workspace, dx in f32 (a bound)
        from .plan import Plan
        fg, per = folded
        ff = Features.of(dataclasses.replace(fg, n=min(per, g.n)), task, f.data_dtype, f.channels_first)
        return 4 * (math.prod(ff.geometry.x_shape) + math.prod(g.x_shape)) + \
            workspace_bytes(ff, Plan.of("jit", **complete(ff, {})))
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    taps, o = math.prod(g.kernel), spatial(g.out_size, 1)
    if task == "backward_data":
        sizes = [max(o[a], -(-spatial(g.in_size, 1)[a] // s[a])) + 2 * ((kernel[a] - 1) * d[a] // s[a] + 1)
                 + spatial(g.pads_begin, 0)[a] + 1 for a in range(3)]
        tail = rows * (g.oc + g.groups + 1) + 64
        source = g.n * math.prod(sizes) * (g.oc + g.groups) + tail
        other = g.groups * taps * (g.ocg + 1) * -(-g.icg // vw) * vw
    else:
        tail = rows * (s[2] * (g.ic + g.groups) + 2) + 64
        source = g.n * math.prod(g.padded_size) * (g.ic + g.groups) + tail
        other = g.groups * taps * (g.icg + 1) * -(-g.ocg // vw) * vw
        if task == "backward_weights":   # x zero-padded, with a block's slack after it
            source = g.n * math.prod(g.padded_size) * g.ic + rows
            fold = folds(g, 1)    # the sums' rows, the taps of the last axis folded or not (bf16 pairs)
            block = g.groups * max(taps * -(-g.icg // rows), taps // fold * -(-g.icg * fold // rows)) * rows \
                * -(-g.ocg // vw) * vw
            shares = 1 if plan.param("split") == "blocks" else pool.threads()
            lanes = g.groups * -(-g.ocg // vw) * vw    # dy in lanes (read in place: NXC f32 filling them,
            rows_total = g.n * math.prod(o[:2])        # C-contiguous as the API passes it), each item's
            chunk = min(rows_total, max(1, plan.param("cache_bytes") // (4 * o[2] * (g.ic + g.oc))))   # chunk
            stage = pool.threads() * (chunk * o[2] * g.groups * vw + 32)                  # of a block of it
            in_place = f.data_dtype == F32 and not f.channels_first and g.ocg % vw == 0
            other = (0 if in_place else g.n * math.prod(o) * lanes) + stage \
                + (shares + 1) * block + (math.prod(g.w_shape) if g.groups > 1 else 0)   # groups: dw copied out
            if weights_in_pairs(f):  # bf16 pairs of a few images (the f32 copies where not exact: as many
                lanes = -(-g.ocg // vw) * vw                     # bytes, _unpaired_images), the partial sums,
                source = _pair_images(g, rows, lanes)[0] * _pair_image_bytes(g, rows, lanes) // 4   # the total
                other = shares * block + stage + (math.prod(g.w_shape) if g.groups > 1 else 0)   # the first: no result
                return 4 * (source + other) + (64 << 10)
    if task != "backward_weights" and (f.data_dtype == F32 or on_dot_product(f)):   # images in chunks (_chunks),
        source = min(source, max(-(-f.io_bytes // 4), source // g.n))
        if _stages(g, task, f.data_dtype, 2 if on_dot_product(f) else 1):     # or an image a thread (_Staged)
            size, channels = _source_image(g, task)
            source = pool.threads() * (math.prod(size) * channels + tail)
    result = 0 if f.data_dtype == F32 else math.prod({"forward": g.y_shape, "backward_data": g.x_shape,
                                                      "backward_weights": g.w_shape}[task])
    if f.channels_first and task != "backward_weights":   # the f32 result's NCX copy (_in_memory_of)
        result += math.prod(f.result_shape)
    return 4 * (source + other + result) + (64 << 10)


def _width() -> int:
    return isa.WIDTH[isa.family()]


def _tail(rows: int, row: int) -> int:
    """Zeroed slack after a flat source: the ``rows`` of a last block past its output row."""
    return rows * (row + 1) + 64


def _depth(dtype: np.dtype) -> int:
    """Reduction values per kernel step: 2 for bf16 data on the families of bf16 pairs (the bf16
    dot-product kernel or AMX tiles on channel pairs), else 1 (f32 values; bf16/f16 widened)."""
    return 2 if dtype == bfloat16 and isa.pairs() else 1


def _rounding(dtype: np.dtype, rounded: bool) -> int:
    """The :func:`convgrad.casts.narrowed` kind a driver rounds its result to as it stores it:
    with ``rounded``, :func:`convgrad.casts.bits_kind` of the data (bf16; f16 where the CPU
    converts halves); else 0 (an f32 result)."""
    return casts.bits_kind(dtype) if rounded else casts.F32_VALUES


@dataclasses.dataclass(frozen=True)
class _Staged:
    """Canonical data a driver pads one image at a time, each thread into a buffer of its own
    (:func:`_outputs`): ``data`` (N, I0, I1, I2, C) in the kernel's dtype (f32, or bf16 bits),
    the padded image's leading pads ``lo`` and ``size``, and the ``slack`` a buffer has after it."""

    data: np.ndarray
    lo: tuple[int, ...]
    size: tuple[int, ...]
    slack: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the padded copy it stands for (N, P0, P1, P2, C)."""
        return (self.data.shape[0], *self.size, self.data.shape[-1])

    def padded(self) -> np.ndarray:
        """The padded copy of every image at once (:func:`.geometry.padded`)."""
        return padded(self.data, self.lo, self.size, self.data.dtype, self.slack)


def _source_image(g: ConvGeometry, task: str) -> tuple[tuple[int, ...], int]:
    """(padded size, channels) of an image of the source ``task`` reads: x (forward) or dy (data
    gradient, :func:`_data_phases`)."""
    return (spatial(g.padded_size, 1), g.ic) if task == "forward" else (_data_phases(g)[2], g.oc)


def _stages(g: ConvGeometry, task: str, dtype: np.dtype, depth: int) -> bool:
    """Whether ``task`` (forward or data gradient) pads its source one image at a time, each
    thread into a buffer of its own (:class:`_Staged`: written and read while in its caches, not
    all of it written to memory first): data of the kernel's dtype (f32, whole bf16 pairs), one
    stride phase (the data gradient), at least an image per thread, and the threads' padded
    images within the op's inputs + output (the bound of a whole padded copy's chunks)."""
    size, channels = _source_image(g, task)
    io = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * dtype.itemsize
    return (dtype == F32 or (depth == 2 and channels // g.groups % 2 == 0)) and g.n >= pool.threads() and \
        (task == "forward" or all(v == 1 for v in g.strides)) and \
        pool.threads() * math.prod(size) * channels * dtype.itemsize <= io


def _source(a: np.ndarray, lo: tuple[int, ...], size: tuple[int, ...], slack: int, groups: int = 1,
            depth: int = 1, stage: bool = False) -> np.ndarray | _Staged:
    """The zero-padded copy of canonical (N, *X, C) data a driver reads (:func:`.geometry.padded`):
    f32 values, or for ``depth`` 2 the bf16 bits (uint16) with each group's channels padded to
    pairs (``groups`` x the even channel count). With ``stage`` (:func:`_stages`), left to the
    driver to pad an image at a time into each thread's buffer (:class:`_Staged`)."""
    a3 = spatial3(a)
    cg = a3.shape[-1] // groups
    kept = a3.view(np.uint16) if depth == 2 else a3
    if stage:
        return _Staged(kept, tuple(lo), tuple(size), slack)
    if depth == 1:
        return padded(a, lo, size, F32, slack)
    cpad = -(-cg // depth) * depth
    if cpad == cg:                                                    # whole pairs already
        return padded(kept, lo, size, np.uint16, slack)
    shape = (a3.shape[0], *size, groups, cpad)
    buffer = workspace.zeros(math.prod(shape) + slack, np.uint16)
    out = buffer[:math.prod(shape)].reshape(shape)
    values = a3.reshape(*a3.shape[:-1], groups, cg)
    out[(slice(None), *(slice(b, b + n) for b, n in zip(lo, a3.shape[1:4])), slice(None), slice(0, cg))] = \
        values.view(np.uint16)
    return out.reshape(*shape[:4], groups * cpad)


@kernel_cache.njit(inline="always")
def _reads_data(tap_rows, rows_in, t, q0, q1):  # pragma: no cover - compiled
    """Whether tap ``t`` reads a row of data (not of padding) at outer positions (q0, q1)
    (:func:`_outputs`' ``tap_rows`` and ``rows_in``)."""
    r0 = q0 * tap_rows[t, 0] + tap_rows[t, 1]
    r1 = q1 * tap_rows[t, 2] + tap_rows[t, 3]
    return rows_in[0] <= r0 < rows_in[1] and rows_in[2] <= r1 < rows_in[3]


@kernel_cache.njit(inline="always")
def _stage_image(raw, n, stage, dims):  # pragma: no cover - compiled
    """Pad image ``n`` of ``raw`` (N, I0, I1, I2, C) into a thread's ``stage`` (as
    :func:`.geometry.fill_line`, every line; ``dims``: P0, P1, P2, C in ``raw``'s units, and the
    leading pads)."""
    image = stage.view(raw.dtype)[:dims[0] * dims[1] * dims[2] * dims[3]].reshape((dims[0], dims[1], dims[2], dims[3]))
    for line in range(dims[0] * dims[1]):
        geometry.fill_line(raw, n, image, line // dims[1], line % dims[1], dims[4], dims[5], dims[6])


@functools.cache
def _outputs(width: int, rows: int, vecs: int, native: int, bits: bool) -> Callable:
    """The driver of forward and backward data for one kernel variant, run for each item in the
    pool (:class:`.microkernel.parallel_items`; compiled for it alone; ``native``:
    :func:`.microkernel.run`'s flag; ``bits``: the kernel stores bf16 bits into ``out16``, a
    constant, so that the driver compiles one kernel: each call site inlines a whole one)."""
    def outputs(item, src, steps, taps_a, out, out16, kind, out_base, out_steps, out_grid, pitch, valid, wp, per_block,
                taps_b, groups, kred, depth, channels, blocks_outer, parts, tap_rows, rows_in, raw, stage, staged,
                stage_dims):  # pragma: no cover
        """``out[out_base + n*os0 + q0*os1 + (m // pitch)*os2 + (m % pitch)*os3 + g*channels + j] =
        sum over taps t and i < kred*depth of src[n*s0 + q0*s1 + q1*s2 + m*s3 + ta[t] + g*kred*depth + i]
        * wp[(g*NB + nb)*per_block + tb[t] + i*VW + j]`` (``depth`` 2: bf16 pairs, ``wp``'s pairs
        interleaved) over the grid ``out_grid`` = (N, Q0, Q1, M), for ``m % pitch < valid``
        (``pitch`` > ``valid``: rows of a source flattened with their padding columns, computed and
        dropped). Items (n, q0, q1, part, g, nb) run in parallel, channel blocks innermost, or
        outermost with ``blocks_outer`` (each block's weights then stay in cache while the rows
        stream by); ``parts`` cut each row of M into that many runs of whole register blocks.
        A non-empty ``out16`` takes the sums instead, as 16-bit bits of ``kind`` (bf16 or f16:
        :func:`convgrad.casts.narrowed`) rounded as they are stored. The kernel stores a whole
        tile (its rows one output row's, every lane a channel) in place, bf16 rounded in
        registers; the others, and f16, go through a tile in L1. Taps that read a source row
        outside ``rows_in`` (lo0, hi0, lo1, hi1) at this item's (q0, q1) are skipped (rows of
        padding: ``tap_rows[t]`` = (a0, b0, a1, b1), the source row of axis i is ``q_i*a_i + b_i``;
        a flattened axis 1 has ``a1`` = 0 and its whole window).
        A non-empty ``stage`` (threads, padded image + slack) stands for ``src``: each thread
        pads image n of ``raw`` (N, I0, I1, I2, C) into its row when its item's image is not the
        one there (``staged[thread]``; :func:`_stage_image`) and reads it there (``steps[0]``
        unused)."""
        vw = vecs * width
        rounding = out16.shape[0] > 0
        nblocks = -(-channels // vw)
        n_, q0_, q1_, m_ = out_grid[0], out_grid[1], out_grid[2], out_grid[3]
        ntaps = taps_a.shape[0]
        places = n_ * q0_ * q1_ * parts
        per_part = -(-(-(-m_ // rows)) // parts) * rows
        if blocks_outer:
            place = item % places
            nb = item // places % nblocks
            g = item // (places * nblocks)
        else:
            nb = item % nblocks
            g = item // nblocks % groups
            place = item // (nblocks * groups)
        part = place % parts
        place //= parts
        q1 = place % q1_
        q0 = place // q1_ % q0_
        n = place // (q1_ * q0_)
        c = workspace.line_empty(rows * vw, np.float32)
        c16 = workspace.line_empty(rows * vw, np.uint16)
        live = 0
        for t in range(ntaps):
            live += _reads_data(tap_rows, rows_in, t, q0, q1)
        ta, tb = taps_a, taps_b
        if live < ntaps:                           # an output row at a border: its taps compacted
            ta, tb = np.empty(live, np.int64), np.empty(live, np.int64)
            live = 0
            for t in range(ntaps):
                if _reads_data(tap_rows, rows_in, t, q0, q1):
                    ta[live], tb[live] = taps_a[t], taps_b[t]
                    live += 1
        lanes = min(vw, channels - nb * vw)
        boff = (g * nblocks + nb) * per_block
        source, src_row = src, n * steps[0] + q0 * steps[1] + q1 * steps[2] + g * kred * depth
        if stage.shape[0] > 0:
            thread = numba.get_thread_id()
            if staged[thread] != n:
                _stage_image(raw, n, stage[thread], stage_dims)
                staged[thread] = n
            source, src_row = stage[thread], src_row - n * steps[0]
        base = out_base + n * out_steps[0] + q0 * out_steps[1] + q1 * out_steps[2] + g * channels + nb * vw
        for m in range(part * per_part, min(m_, (part + 1) * per_part), rows):
            a1 = m // pitch
            a2 = m - a1 * pitch
            whole = m + rows <= m_ and a2 + rows <= valid and lanes == vw and kind != F16_BITS
            if whole:                                  # a whole tile: stored in place
                target, target16, at, ld = out, out16, base + a1 * out_steps[2] + a2 * out_steps[3], out_steps[3]
            else:
                target, target16, at, ld = c, c16, 0, vw
            if bits:                                   # bf16: rounded by the kernel
                microkernel.run(width, rows, vecs, native, target16, at, ld, source, src_row + m * steps[3], steps[3],
                                depth, wp, boff, vw * depth, ta, tb, live, kred, 0)
            else:
                microkernel.run(width, rows, vecs, native, target, at, ld, source, src_row + m * steps[3], steps[3],
                                depth, wp, boff, vw * depth, ta, tb, live, kred, 0)
            if whole:
                continue
            for r in range(min(rows, m_ - m)):   # (a1, a2) = divmod(m + r, pitch), stepped
                if r:
                    a2 += 1
                    if a2 == pitch:
                        a1, a2 = a1 + 1, 0
                if a2 < valid:
                    at = base + a1 * out_steps[2] + a2 * out_steps[3]
                    if bits and lanes == vw and vw % 32 == 0:    # whole vectors (no slices: they cost
                        for u in range(0, vw, 32):                    # as much as the kernel here)
                            microkernel.copy32(16, c16, r * vw + u, out16, at + u)
                        continue
                    if not rounding and lanes == vw and vw % 8 == 0:
                        unit = 16 if vw % 16 == 0 else 8
                        for u in range(0, vw, unit):
                            microkernel.copy_units(unit, c, r * vw + u, out, at + u)
                        continue
                    cr, cr16 = c[r * vw:r * vw + lanes], c16[r * vw:r * vw + lanes]
                    if bits:                      # row slices: the copies vectorise
                        o16 = out16[at:at + lanes]
                        for j in range(lanes):
                            o16[j] = cr16[j]
                    elif rounding:
                        o16 = out16[at:at + lanes]
                        for j in range(lanes):
                            o16[j] = narrowed(cr[j], kind)
                    else:
                        o = out[at:at + lanes]
                        for j in range(lanes):
                            o[j] = cr[j]
    return microkernel.parallel_items(outputs)


def _run_outputs(rows: int, vecs: int, src: np.ndarray | _Staged, steps: np.ndarray, taps_a: np.ndarray,
                 out: np.ndarray, out_base: int, out_steps: np.ndarray, grid: tuple[int, ...], wp: np.ndarray, taps: int,
                 taps_b: np.ndarray, groups: int, kred: int, channels: int, cache_bytes: int, tap_rows: np.ndarray,
                 rows_in: tuple[int, int, int, int], kind: int = 0) -> None:
    """:func:`_outputs` on ``src`` (a padded array of :func:`_source`: f32, or bf16 pairs) for the
    output ``grid`` (N, Q0, Q1, Q2), skipping the taps that read rows of padding (``tap_rows``,
    ``rows_in``: see :func:`_outputs`): the last two axes flattened into rows of the source's
    width where the source steps by one position along both and that computes fewer tap-positions
    (junk positions, and no skipping along axis 1) than blocks cut at every output row; the
    channel blocks outermost where the packed weights exceed ``cache_bytes`` (a :class:`_Staged`
    source then padded at once: each block would pad every image again). ``kred``: kernel steps
    per tap (channel pairs for bf16). ``out``: f32, or uint16 for 16-bit bits of ``kind`` rounded
    as they are stored."""
    width = _width()
    blocks_outer = wp.nbytes > cache_bytes
    if isinstance(src, _Staged) and blocks_outer:
        src = src.padded()
    dtype = src.data.dtype if isinstance(src, _Staged) else src.dtype
    vw, depth = vecs * width, 2 if dtype == np.uint16 else 1
    flattens = bool(steps[2] == src.shape[3] * steps[3] and steps[3] == src.shape[4])
    shape, pitch, tap_rows, items, parts, rows_in_a = _row_layout(
        rows, tuple(grid), src.shape[3], flattens, tap_rows.tobytes(), tuple(rows_in),
        groups * -(-channels // vw), pool.threads())
    flat_out = out.reshape(-1)
    f32_out, bits_out = (flat_out, _NONE[np.uint16]) if out.dtype == F32 else (_NONE[np.float32], flat_out)
    units = np.float32 if dtype == F32 else np.uint32               # padded 32 bits at a time where aligned
    if isinstance(src, _Staged):
        image = math.prod(src.shape[1:])
        line = 64 // np.dtype(dtype).itemsize                          # each thread's image on a cache line:
        per = -(-(image + src.slack) // line) * line                   # AMX tile rows 64-byte aligned
        stage = workspace.empty(pool.threads() * per, dtype).reshape(-1, per)
        stage[:, image:] = 0
        raw = spatial3(src.data)
        if raw.dtype.itemsize == 2 and raw.strides[-1] == 2 and all(s % 4 == 0 for s in raw.strides[:-1]) and \
                raw.ctypes.data % 4 == 0:
            raw = raw.view(units)
        flat_src = _NONE[dtype.type]
        stage_dims = np.array([*src.size, raw.shape[-1], *src.lo], np.int64)
        staged = np.full(stage.shape[0], -1, np.int64)
    else:
        stage, raw, flat_src = _NO_STAGE[dtype.type], _NO_RAW[units], geometry.flat(src)
        stage_dims, staged = _NO_STAGE_DIMS, _NONE[np.int64]
    _outputs(width, rows, vecs, isa.bf16_kernel() if depth == 2 else 0, out.dtype != F32 and kind != F16_BITS)(
        items * parts, flat_src, steps, taps_a, f32_out, bits_out, kind, out_base, out_steps, shape, pitch, grid[3], wp,
        taps * kred * depth * vw, taps_b, groups, kred, depth, channels, blocks_outer, parts, tap_rows, rows_in_a, raw,
        stage, staged, stage_dims)


#: Empty arrays for a driver's unused arguments (never written), per dtype: no allocation a call.
_NONE = {t: np.empty(0, t) for t in (np.float32, np.uint16, np.int64)}
_NO_STAGE = {t: np.empty((0, 0), t) for t in (np.float32, np.uint16)}
_NO_RAW = {t: np.empty((0,) * 5, t) for t in (np.float32, np.uint32)}
_NO_STAGE_DIMS = np.zeros(7, np.int64)


@_remembered
def _row_layout(rows: int, grid: tuple[int, ...], src_pitch: int, flattens: bool, tap_rows: bytes,
                rows_in: tuple[int, int, int, int], per_row: int, threads: int
                ) -> tuple[np.ndarray, int, np.ndarray, int, int, np.ndarray]:
    """:func:`_run_outputs`' layout of the output ``grid`` (N, Q0, Q1, Q2) for blocks of ``rows``
    positions: (the grid the driver runs, its pitch, the taps' rows, items of one part, parts of
    each row, ``rows_in``), the last two axes flattened into rows of the source's width
    ``src_pitch`` where the source steps by one position along both (``flattens``) and that
    computes fewer tap-positions than rows cut at every output row; ``per_row`` items (groups x
    channel blocks) per grid row. Remembered: 15-25 µs of NumPy a call."""
    n, q0, q1, q2 = grid
    taps = np.frombuffer(tap_rows, np.int64).reshape(-1, 4).copy()
    along1 = np.arange(q1)[:, None] * taps[:, 2] + taps[:, 3]
    live = int(((along1 >= rows_in[2]) & (along1 < rows_in[3])).sum())       # taps x rows computed when cut
    flat = (q1 - 1) * src_pitch + q2
    if flattens and -(-flat // rows) * rows * len(taps) < -(-q2 // rows) * rows * live:
        shape, pitch = (n, q0, 1, flat), src_pitch
        taps[:, 2], taps[:, 3] = 0, rows_in[2]                            # one flattened row: no skipping
    else:
        shape, pitch = (n, q0, q1, q2), q2
    items = max(1, math.prod(shape[:3]) * per_row)                # a flattened image: few items, so cut its rows
    parts = max(1, min(-(-shape[3] // rows), -(-TUNING.items_per_thread * threads // items)))
    return np.array(shape, np.int64), pitch, taps, math.prod(shape[:3]) * per_row, parts, np.array(rows_in, np.int64)


def _packed_weights(g: ConvGeometry, w: np.ndarray, vw: int, transpose: bool, depth: int = 1,
                    columns: slice = slice(None)) -> tuple[np.ndarray, bool | None]:
    """Canonical (*K, ICg, OC) weights as f32 ``(G, blocks, T, red, vw)``: red = ICg and blocks
    of OCg (forward), or with ``transpose`` red = OCg and blocks of ICg (those of ``columns``
    only); zero past the channels. ``depth`` 2: bf16 bits (uint16) ``(G, blocks, T, red/2, vw,
    2)``, red padded to pairs, each pair of reduction values interleaved per lane. With it,
    whether every value packed is finite, as the compiled packing saw it (None: not looked at,
    16-bit data widened by NumPy): :func:`run`'s padding check then needs no pass over w."""
    t = math.prod(g.kernel)
    taps = tap_weights(g, w, transpose).transpose(1, 0, 2, 3)[..., columns]  # (G, T, red, width), a view
    if depth == 2:
        taps = taps.view(np.uint16)
    red, width = taps.shape[2:]
    blocks, rpad = -(-width // vw), -(-red // depth) * depth
    shape = (g.groups, blocks, t, rpad // depth, vw, depth)
    if taps.dtype == (np.uint16 if depth == 2 else F32):   # every value written once, in parallel
        out = workspace.empty(math.prod(shape), taps.dtype).reshape(shape)
        rows = abs(taps.strides[3]) <= abs(taps.strides[2])      # lanes closer than rows: rows read in turn
        items = g.groups * t * -(-rpad // _PACK_ROWS) if rows else math.prod(out.shape[:3])
        field, carry, sign = direct.EXPONENT_WORDS[bfloat16 if depth == 2 else F32]
        full = np.empty(items, np.uint64)                         # per item: any exponent field all ones
        (_pack_rows if rows else _pack)(items, taps, out, out.reshape(-1), out.reshape(-1).view(np.uint64), full,
                                        field, carry, _width())
        return out, not np.bitwise_or.reduce(full) & sign
    out = workspace.zeros(math.prod(shape), np.uint16 if depth == 2 else F32).reshape(shape)   # aligned: vector loads
    for block in range(blocks):        # written in place (converted as assigned): no second copy
        cols = slice(block * vw, min(width, (block + 1) * vw))
        for d in range(depth):
            out[:, block, :, :len(range(d, red, depth)), :cols.stop - cols.start, d] = taps[:, :, d::depth, cols]
    return out, None


@kernel_cache.njit(inline="always")
def _words_full(words, start, nbytes, field, carry):  # pragma: no cover - compiled
    """:func:`.direct.finite`'s OR of ``(word & field) + carry`` over the 64-bit ``words`` of
    ``nbytes`` bytes from byte ``start`` (both multiples of 8): where a value's exponent field is
    all ones (NaN or Inf), its sign bit set."""
    acc = np.uint64(0)
    for i in range(start // 8, (start + nbytes) // 8):
        acc |= (words[i] & field) + carry
    return acc


def _pack_item(item, taps, out, flat, words, full, field, carry, width):  # pragma: no cover - compiled
    """out[g, b, t, r // D, c, r % D] = taps[g, t, r, b*VW + c] (zero past taps' reduction and
    width) for out (G, blocks, T, R/D, VW, D) and item (g, b, t) (:data:`_pack` runs the items in
    parallel), for taps whose rows lie closer than their lanes (:func:`_pack_rows_item` takes the
    others). A transposed view contiguous along r (the data gradient's weights) is transposed in
    ``width`` x ``width`` tiles of 32-bit units in registers (:func:`.microkernel.transpose32`;
    bf16: a unit is a pair along r), the edges (and other strides) one value at a time (a scalar
    transpose took 2 ms of a 3.6 ms data gradient at mb 1). ``full[item]``: :func:`_words_full`
    of what the item wrote (``words``: ``out`` as 64-bit words; ``flat`` unused)."""
    g_, t_, red, width_ = taps.shape
    blocks, vw, depth = out.shape[1], out.shape[4], out.shape[5]
    rpad = out.shape[3] * depth
    item_t, item_o = taps.itemsize, out.itemsize
    sr, sc = taps.strides[2] // item_t, taps.strides[3] // item_t
    span = width * depth                             # reduction values per tile
    t = item % t_
    b = item // t_ % blocks
    g = item // (t_ * blocks)
    o = out[g, b, t]
    lanes = min(vw, width_ - b * vw)
    base = (g * taps.strides[0] + t * taps.strides[1]) // item_t + b * vw * sc
    obase = (g * out.strides[0] + b * out.strides[1] + t * out.strides[2]) // item_o
    od = out.strides[3] // item_o
    whole = lanes - lanes % width if sr == 1 and sc > 0 else 0
    for r0 in range(0, rpad, span):
        first = 0
        if r0 + span <= red:
            for c0 in range(0, whole, width):
                microkernel.transpose_tile(width, taps, base + r0 + c0 * sc, sc, out,
                                           obase + (r0 // depth) * od + c0 * depth, od)
            first = whole
        for r in range(r0, min(r0 + span, rpad)):
            dst = o[r // depth, :, r % depth]
            for c in range(first, vw):
                dst[c] = taps[g, t, r, b * vw + c] if r < red and c < lanes else 0
    full[item] = _words_full(words, obase * item_o, out.shape[3] * vw * depth * item_o, field, carry)


_pack = microkernel.parallel_items(_pack_item)

#: Reduction rows per item of :func:`_pack_rows_item`.
_PACK_ROWS = 64


def _pack_rows_item(item, taps, out, flat, words, full, field, carry, width):  # pragma: no cover - compiled
    """:func:`_pack_item`'s ``out`` (``flat``: the same, 1-D) from taps whose lanes lie closer
    than their rows (the forward's XIO weights): item (g, t, chunk of :data:`_PACK_ROWS` rows)
    reads each row once, in order, into every block, ``width`` lanes a vector where they are
    adjacent (:func:`.microkernel.copy32`; bf16 row pairs :func:`.microkernel.pairs32`). Items of
    one block and tap, reading a row's 64 bytes 2 KB apart, took 7-16 ms for 3x3 x 512 x 512
    f32 channels on a Zen 3 (past the TLB's reach), this 3-9, a copy 1.4. ``full[item]``:
    :func:`_words_full` of the rows it wrote (``words``: ``out`` as 64-bit words)."""
    g_, t_, red, width_ = taps.shape
    blocks, vw, depth = out.shape[1], out.shape[4], out.shape[5]
    rpad = out.shape[3] * depth
    item_t, item_o = taps.itemsize, out.itemsize
    s0, s1, s2, s3 = (taps.strides[0] // item_t, taps.strides[1] // item_t, taps.strides[2] // item_t,
                      taps.strides[3] // item_t)
    chunks = -(-rpad // _PACK_ROWS)
    ch = item % chunks
    t = item // chunks % t_
    g = item // (chunks * t_)
    per_block, od = out.strides[1] // item_o, out.strides[3] // item_o
    first_row = (g * out.strides[0] + t * out.strides[2]) // item_o
    for r in range(ch * _PACK_ROWS, min(rpad, (ch + 1) * _PACK_ROWS)):
        at = first_row + (r // depth) * od + r % depth
        pair = depth == 2 and r - r % 2 + 2 <= red                 # bf16: both rows of r's pair hold data
        for b in range(blocks):
            o = at + b * per_block
            cols = min(vw, width_ - b * vw)
            if s3 == 1 and cols == vw and (depth == 1 and r < red or pair):      # a whole block: vectors
                at_c = g * s0 + t * s1 + r * s2 + b * vw
                for c0 in range(0, vw if depth == 1 or r % 2 == 0 else 0, width):   # a pair at its first row
                    if depth == 1:
                        microkernel.copy_units(width, taps, at_c + c0, flat, o + c0)
                    else:
                        microkernel.pair_units(width, taps, at_c + c0, at_c + s2 + c0, flat, o + 2 * c0)
                continue
            lanes = cols if r < red else 0
            for c in range(lanes):
                flat[o + c * depth] = taps[g, t, r, b * vw + c]
            for c in range(lanes, vw):
                flat[o + c * depth] = 0
    seen = np.uint64(0)
    r0, r1 = ch * _PACK_ROWS, min(rpad, (ch + 1) * _PACK_ROWS)          # whole pairs: _PACK_ROWS and rpad even
    for b in range(blocks):
        seen |= _words_full(words, (first_row + (r0 // depth) * od + b * per_block) * item_o,
                            (r1 - r0) // depth * od * item_o, field, carry)
    full[item] = seen


_pack_rows = microkernel.parallel_items(_pack_rows_item)


def _strides(shape: tuple[int, ...]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape``."""
    return np.array([math.prod(shape[j + 1:]) for j in range(len(shape))], np.int64)


def forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray, plan: Plan | None = None, rounded: bool = False,
            checked: list[bool | None] | None = None) -> np.ndarray:
    """y (N, *O, OC) in f32 (see the module docstring), by ``plan`` (default: :func:`complete`'s);
    with ``rounded``, 16-bit data gives y in its dtype, each value rounded once as it is stored
    (:func:`_rounding`). ``checked``: each packing of w appends whether its values were finite
    (:func:`_packed_weights`)."""
    plan = _plan(g, "forward", plan)
    rows, vecs, icg, kind, images, channels, stage, pb, size, slack, rows_in = _forward_setup(
        g, x.dtype, plan, rounded, pool.threads(), isa.family())
    depth, taps, vw = _depth(x.dtype), math.prod(g.kernel), vecs * _width()
    y = workspace.result(g.y_shape, np.uint16 if kind else F32)
    s, o = spatial(g.strides, 1), spatial(g.out_size, 1)
    taps_b, (ys, ys4) = _taps_b(taps, icg * vw), _element_steps((g.n, *o, g.oc))
    for n0, n1 in images:
        with workspace.part():
            xp = _source(x[n0:n1], pb, size, slack, g.groups, depth, stage)
            xs, _ = _element_steps(xp.shape)
            taps_a, tap_rows = _tap_tables(g, xs)
            steps = np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64)
            for c0, c1 in channels:
                with workspace.part():
                    wp, finite = _packed_weights(g, w, vw, False, depth, slice(c0, c1))
                    wp = wp.reshape(-1)
                    if checked is not None:
                        checked.append(finite)
                    _run_outputs(rows, vecs, xp, steps, taps_a, y, n0 * ys[0] + c0, ys4, (n1 - n0, *o), wp, taps,
                                 taps_b, g.groups, icg // depth, c1 - c0, plan.param("cache_bytes"), tap_rows, rows_in,
                                 kind)
    return y.view(x.dtype) if kind else y


@_remembered
def _forward_setup(g: ConvGeometry, dtype: np.dtype, plan: Plan, rounded: bool, threads: int, family: str) -> tuple:
    """:func:`forward`'s sizes for ``plan`` on ``g`` (under ``threads`` and the kernel ``family``):
    :func:`_data_setup`'s, for x. Remembered."""
    rows, vecs, vw = _block(plan)
    depth = _depth(dtype)
    s, kernel = spatial(g.strides, 1), spatial(g.kernel, 1)
    size, pb, i_size = spatial(g.padded_size, 1), spatial(g.pads_begin, 0), spatial(g.in_size, 1)
    icg = -(-g.icg // depth) * depth                               # bf16: channels padded to pairs
    images, channels = _chunks(g, dtype, depth, 4 * math.prod(size) * g.ic, 4 * math.prod(kernel) * g.icg, g.ocg, vw)
    stage = _stages(g, "forward", dtype, depth)                    # padded an image at a time: no chunks
    return (rows, vecs, icg, _rounding(dtype, rounded), [(0, g.n)] if stage else images, channels, stage, pb, size,
            _tail(rows, s[2] * g.groups * icg), (pb[0], pb[0] + i_size[0], pb[1], pb[1] + i_size[1]))


@functools.lru_cache(maxsize=256)
def _taps_b(taps: int, step: int) -> np.ndarray:
    """The packed weights' offsets of ``taps`` taps, ``step`` apart."""
    return np.arange(taps, dtype=np.int64) * step


@functools.lru_cache(maxsize=1024)
def _tap_tables(g: ConvGeometry, xs: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The forward's taps read from a padded x of element strides ``xs``: each tap's offset, and
    its rows (:func:`_outputs`' ``tap_rows``); remembered (a small call's Python)."""
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    ks = list(itertools.product(*map(range, kernel)))
    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3] for k0, k1, k2 in ks], np.int64)
    return taps_a, np.array([(s[0], k0 * d[0], s[1], k1 * d[1]) for k0, k1, _ in ks], np.int64)


def _chunks(g: ConvGeometry, dtype: np.dtype, depth: int, image_bytes: int, channel_bytes: int, channels: int,
            vw: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (first, stop) images and output channels a driver runs at a time: all of them where
    the padded source (``image_bytes`` an image in f32) is at most the op's inputs + output, else
    images in chunks of half that (a large dilation pads a small dy to 2-7x its size: the promise
    is 2x the inputs + output); for 16-bit data read as f32 (f16; bf16 off the dot product),
    whose padded f32 copy of the source and f32 packed weights (``channel_bytes`` an output
    channel; one group only) take at most ``TUNING.widened_bytes`` per chunk (at least one image,
    one vector of channels): whole f32 copies took 2.1-2.5x the inputs and output of f16 3x3
    layers (ResNet-50 res4-5)."""
    def cut(total: int, per: int) -> list[tuple[int, int]]:
        return [(lo, min(total, lo + per)) for lo in range(0, total, per)]
    if dtype == F32 or depth == 2:
        io = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * dtype.itemsize
        image = image_bytes // 2 if depth == 2 else image_bytes                # bf16 pairs: 2 bytes a value
        return cut(g.n, g.n if g.n * image <= io else max(1, io // 2 // image)), cut(channels, channels)
    per_channels = channels if g.groups > 1 else max(vw, TUNING.widened_bytes // channel_bytes // vw * vw)
    return cut(g.n, max(1, TUNING.widened_bytes // image_bytes)), cut(channels, per_channels)


def _folded_data(g: ConvGeometry, dtype: np.dtype) -> tuple[ConvGeometry, int] | None:
    """(the folded geometry, :func:`.tap_gemm.folded`, images per chunk) a bf16 data gradient on
    tiles of ``g`` runs as: few input channels (dx's lanes) with the last kernel axis folded into
    them, where an image's f32 folded dx takes at most half the op's inputs + output (the chunks'
    temporaries within them: extra memory under 2x)."""
    fg = tap_gemm.folded(g) if _depth(dtype) == 2 and isa.bf16_kernel() >= microkernel.TILES_STANDIN else None
    if fg is None:
        return None
    image, io = 4 * math.prod(fg.x_shape[1:]), (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * 2
    return (fg, io // 2 // image) if image <= io // 2 else None


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, plan: Plan | None = None,
                  rounded: bool = False, checked: list[bool | None] | None = None) -> np.ndarray:
    """dx (N, *I, IC) in f32: one stride-1 convolution of padded dy per stride phase (each value
    written once: with ``rounded``, 16-bit data gives dx in its dtype, rounded as it is stored,
    :func:`_rounding`). bf16 on tiles with few input channels: the folded geometry's dx (K2 x
    ICg lanes, :func:`_folded_data`) in f32, summed into dx along the last axis (col2im along it
    alone: :func:`_unfold_last_axis`), each value rounded once (ResNet-50's conv1: 3 of a tile's
    16 lanes used, 42 -> 17 ms on the Xeon with AMX). ``checked``: as :func:`forward`'s."""
    folded = _folded_data(g, dy.dtype)
    if folded is not None:
        from .plan import Plan
        fg, per = folded
        kind = _rounding(dy.dtype, rounded)
        dx = workspace.result(g.x_shape, np.uint16 if kind else F32)
        for n0 in range(0, g.n, per):          # chunks of images: their f32 folded dx within the bound
            gc = dataclasses.replace(fg, n=min(per, g.n - n0))
            with workspace.part():
                fplan = Plan.of("jit", **complete(Features.of(gc, "backward_data", dy.dtype, False), {}))
                f3 = spatial3(backward_data(gc, dy[n0:n0 + gc.n], w.reshape(fg.w_shape), fplan, False, checked))
                dx3 = spatial3(dx[n0:n0 + gc.n])
                _unfold_last_axis(f3.reshape(-1, *f3.shape[3:]), dx3.reshape(-1, *dx3.shape[3:]), g.strides[-1],
                                  g.dilations[-1], g.pads_begin[-1], kind)
        return dx.view(dy.dtype) if kind else dx
    plan = _plan(g, "backward_data", plan)
    rows, vecs, ocg, kind, out_steps, images, channels, stage, lo, size, slack, rows_in = _data_setup(
        g, dy.dtype, plan, rounded, pool.threads(), isa.family())
    depth, taps, vw = _depth(dy.dtype), math.prod(g.kernel), vecs * _width()
    dx = workspace.result(g.x_shape, np.uint16 if kind else F32)
    for n0, n1 in images:                                  # f32 chunks of 16-bit data (:func:`_chunks`)
        with workspace.part():
            dyp = _source(dy[n0:n1], lo, size, slack, g.groups, depth, stage)
            ds, steps = _element_steps(dyp.shape)
            for c0, c1 in channels:
                with workspace.part():
                    wp, finite = _packed_weights(g, w, vw, True, depth, slice(c0, c1))
                    wp = wp.reshape(-1)
                    if checked is not None:
                        checked.append(finite)
                    for base, grid, taps_a, taps_b, tap_rows in _phase_tables(g, ocg * vw, ds):
                        _run_outputs(rows, vecs, dyp, steps, taps_a, dx, int(n0 * out_steps[0]) + base + c0, out_steps,
                                     (n1 - n0, *grid), wp, taps, taps_b, g.groups, ocg // depth, c1 - c0,
                                     plan.param("cache_bytes"), tap_rows, rows_in, kind)
    return dx.view(dy.dtype) if kind else dx


@_remembered
def _data_setup(g: ConvGeometry, dtype: np.dtype, plan: Plan, rounded: bool, threads: int, family: str) -> tuple:
    """:func:`backward_data`'s sizes and tables for ``plan`` on ``g`` (under ``threads`` and the
    kernel ``family``, which they depend on): the block's rows and vectors, dy's channels padded to
    pairs, the rounding kind, dx's steps, the chunks of images and channels (:func:`_chunks`),
    whether the driver stages images (:func:`_stages`), the padded dy's lead, size and slack, and
    the rows of data within it. Remembered: 20-30 µs of Python a call."""
    rows, vecs, vw = _block(plan)
    depth = _depth(dtype)
    _, lo, size = _data_phases(g)
    o_size, kernel = spatial(g.out_size, 1), spatial(g.kernel, 1)
    ocg = -(-g.ocg // depth) * depth                               # bf16: channels padded to pairs
    images, channels = _chunks(g, dtype, depth, 4 * math.prod(size) * g.oc, 4 * math.prod(kernel) * g.ocg, g.icg, vw)
    stage = _stages(g, "backward_data", dtype, depth)
    return (rows, vecs, ocg, _rounding(dtype, rounded), _out_steps(g), [(0, g.n)] if stage else images, channels,
            stage, lo, size, _tail(rows, g.groups * ocg), (lo[0], lo[0] + o_size[0], lo[1], lo[1] + o_size[1]))


@functools.lru_cache(maxsize=256)
def _element_steps(shape: tuple[int, ...]) -> tuple[tuple[int, ...], np.ndarray]:
    """Element strides of a C-contiguous array of ``shape``, as a tuple and the first four as an array."""
    ds = tuple(_strides(shape).tolist())
    return ds, np.array(ds[:4], np.int64)


@kernel_cache.njit(parallel=True)
def _unfold_last_axis(folded, out, stride, dilation, pad, kind):  # pragma: no cover - compiled
    """``out[r, i, c] = sum over (p, k) with p stride + k dilation - pad = i of folded[r, p, k C +
    c]`` for ``folded`` (rows, P, K C) f32 and ``out`` (rows, W, C): f32, or 16-bit bits of
    ``kind`` each rounded once (:func:`convgrad.casts.narrowed`); rows in parallel, each summed
    in a row of f32 first."""
    rows, w, c = out.shape
    positions, kc = folded.shape[1], folded.shape[2]
    flat = folded.reshape(-1)
    for r in numba.prange(rows):
        acc = np.zeros(w * c, np.float32)
        for k in range(kc // c):              # the positions p whose tap k lands inside: no tests
            shift = k * dilation - pad
            p0 = max(0, -(shift // stride))
            p1 = min(positions, (w - 1 - shift) // stride + 1)
            a = (p0 * stride + shift) * c
            b = (r * positions + p0) * kc + k * c
            for p in range(p0, p1):
                for i in range(c):
                    acc[a + i] += flat[b + i]
                a += stride * c
                b += kc
        dst = out[r].reshape(w * c)
        if kind:
            for j in range(w * c):
                dst[j] = narrowed(acc[j], kind)
        else:
            for j in range(w * c):
                dst[j] = acc[j]


@functools.lru_cache(maxsize=256)
def _data_phases(g: ConvGeometry) -> tuple[list, tuple[int, int, int], tuple[int, int, int]]:
    """The data gradient's stride phases: per axis, per phase r, the (tap, offset) pairs
    (:func:`.geometry.phase_taps`); the padded dy's leading pad ``lo`` and ``size`` that every
    phase's taps read within."""
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    pb, i_size, o_size = spatial(g.pads_begin, 0), spatial(g.in_size, 1), spatial(g.out_size, 1)
    phases = [[phase_taps(r, kernel[a], s[a], d[a], pb[a]) for r in range(min(s[a], i_size[a]))] for a in range(3)]
    offsets = [[c for taps in axis for _, c in taps] or [0] for axis in phases]
    counts = [-(-i_size[a] // s[a]) for a in range(3)]           # the most q of any phase
    lo = tuple(max(0, -min(offsets[a])) for a in range(3))
    size = tuple(lo[a] + max(o_size[a], counts[a] + max(offsets[a])) for a in range(3))
    return phases, lo, size


@functools.lru_cache(maxsize=256)
def _out_steps(g: ConvGeometry) -> np.ndarray:
    """dx's element steps from one phase position q to the next, per axis (and per image)."""
    s, xs = spatial(g.strides, 1), _strides((g.n, *spatial(g.in_size, 1), g.ic))
    return np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64)


@functools.lru_cache(maxsize=1024)
def _phase_tables(g: ConvGeometry, tap_step: int, ds: tuple[int, ...]) -> list[tuple]:
    """Per stride phase (r0, r1, r2) of the data gradient, read from a padded dy of element
    strides ``ds``: (dx's offset of the phase's first position in an image, its grid of
    positions q, each tap's offset in dy, its packed weights' offset (``tap_step`` apart),
    its rows (:func:`_outputs`' ``tap_rows``)). Remembered: building them took 45-62 µs of
    Python a call (docs/engine-measurements.md, "fixed costs per call")."""
    phases, lo, _ = _data_phases(g)
    s, i_size, kernel = spatial(g.strides, 1), spatial(g.in_size, 1), spatial(g.kernel, 1)
    xs = _strides((g.n, *i_size, g.ic))
    out = []
    for (r0, t0), (r1, t1), (r2, t2) in itertools.product(*(enumerate(axis) for axis in phases)):
        grid = tuple(-(-(i_size[a] - r) // s[a]) for a, r in enumerate((r0, r1, r2)))
        taps = [(a, b, c) for a in t0 for b in t1 for c in t2]
        taps_a = np.array([sum((tap[a][1] + lo[a]) * ds[a + 1] for a in range(3)) for tap in taps], np.int64)
        taps_b = np.array([((a[0] * kernel[1] + b[0]) * kernel[2] + c[0]) * tap_step for a, b, c in taps], np.int64)
        tap_rows = np.array([(1, a[1] + lo[0], 1, b[1] + lo[1]) for a, b, _ in taps], np.int64).reshape(-1, 4)
        out.append((int(r0 * xs[1] + r1 * xs[2] + r2 * xs[3]), grid, taps_a, taps_b, tap_rows))
    return out


@functools.cache
def _weights(width: int, rows: int, vecs: int, native: int) -> Callable:
    """The driver of the weights gradient for one kernel variant, run for each item in the pool
    (:class:`.microkernel.parallel_items`; compiled for it alone)."""
    def weights(item, xb, x_steps, g_step, block_step, taps_a, dyp, dy_row, rows_grid, chunk, parts, shares, split,
                groups, icg, channels, depth, ksteps, stage, fresh):  # pragma: no cover - compiled
        """``parts[p, t, g, ic, oc] += sum_(n, o) x[n, o*S + tap t, g, ic] * dyp[(n, o), g, oc]``
        (``fresh``: ``=``, every value of ``parts`` written), the R channels of block ``ic // R`` of
        group g adjacent from ``g*g_step + (ic // R)*block_step`` of the position in ``xb`` (f32:
        the zero-padded copy of x; ``depth`` 2: bf16 pairs of positions, :func:`_pair_blocks` and
        :func:`_dy_pairs`) over the output rows (n, o0, o1) of ``rows_grid`` = (N, O0, O1, O2),
        ``ksteps`` kernel steps each, in parallel items (p, u): ``shares`` equal shares p of the
        rows (each with its own partial sums ``parts[p]``), each share's (tap, group, channel-row
        block) triples cut into ``split`` parts u. The rows are taken ``chunk`` at a time; per
        chunk and block of output channels, the chunk's dy of the block is copied to the item's
        ``stage`` (positions adjacent, on a line: read in place, every position's vectors lay a
        row of dy apart, 2 KB at 512 channels, a few sets of the L1 for them all) and every
        triple of the item runs on it."""
        vw = vecs * width
        nblocks = -(-channels // vw)
        row_blocks = -(-icg // rows)
        n_, o0_, o1_ = rows_grid[0], rows_grid[1], rows_grid[2]
        total = n_ * o0_ * o1_
        triples = taps_a.shape[0] * groups * row_blocks
        ldc = nblocks * vw
        p, u = item // split, item % split
        first, last = total * p // shares, total * (p + 1) // shares
        ra = np.empty(chunk, np.int64)
        rb = np.empty(chunk, np.int64)
        lanes = vw * depth                             # a position's values of a block, one group
        panel = groups * lanes                         # ... all groups: a staged position
        b = stage[item]
        for start in range(first, last, chunk):
            count = min(chunk, last - start)
            for j in range(count):
                row = start + j
                o1 = row % o1_
                o0 = (row // o1_) % o0_
                n = row // (o1_ * o0_)
                ra[j] = n * x_steps[0] + o0 * x_steps[1] + o1 * x_steps[2]
                rb[j] = j * ksteps * panel
            for nb in range(nblocks):
                for q in range(count * ksteps):
                    for gi in range(groups):
                        at = (start * ksteps + q) * dy_row + (gi * nblocks + nb) * lanes
                        src, dst = dyp[at:at + lanes], b[q * panel + gi * lanes:q * panel + (gi + 1) * lanes]
                        for l in range(lanes):
                            dst[l] = src[l]
                for triple in range(triples * u // split, triples * (u + 1) // split):
                    ib = triple % row_blocks
                    g = triple // row_blocks % groups
                    t = triple // (row_blocks * groups)
                    coff = (p * triples + triple) * rows * ldc
                    microkernel.run(width, rows, vecs, native, parts, coff + nb * vw, ldc, xb,
                                    taps_a[t] + g * g_step + ib * block_step, depth, x_steps[3], b, g * lanes,
                                    panel, ra, rb, count, ksteps, 0 if fresh and start == first else 1)
    return microkernel.parallel_items(weights)


def on_dot_product(f: Features) -> bool:
    """Whether ``f`` runs on the bf16 dot instruction (or tiles): bf16 data on a family of pairs."""
    return f.dtype == "bfloat16" and f.family in isa.PAIRS


def weights_in_pairs(f: Features) -> bool:
    """Whether the weights gradient of ``f`` runs on the bf16 dot instruction (pairs of output
    positions): its copies stay bf16."""
    return f.task == "backward_weights" and on_dot_product(f)


def _pair_phases(g: ConvGeometry) -> tuple[list[int], int]:
    """The phases ``ph`` of the last axis that the taps need (``k*D mod 2S``), and Q, the pairs
    per padded row of each phase copy (:func:`_pair_blocks`)."""
    s, d, k, o = (spatial(v, 1)[2] for v in (g.strides, g.dilations, g.kernel, g.out_size))
    return sorted({t * d % (2 * s) for t in range(k)}), -(-(o * s + (k - 1) * d + 1) // (2 * s)) + 1


def _pair_blocks(g: ConvGeometry, x: np.ndarray, rows: int, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """bf16 x as uint16 (PH, N, P0, P1, Q, G, CB, 2), CB the group's channels padded to whole
    blocks of ``rows``: per phase ``ph`` of the last axis, ``[.., q, g, c, j]`` = padded x at
    position ``2*S*q + j*S + ph`` and channel c of group g (zero past the data and the
    channels), so that output positions 2i and 2i+1 of a tap with offset ``k*D`` (phase
    ``k*D mod 2S``, pair ``i + k*D // 2S``) are a pair; and the taps' offsets. A block's rows are
    adjacent channels, as in x (pairs of a position's channels written in one pass: blocks of
    their own took 3x as long). ``out``: such an array of at least N images from an earlier call
    on the same geometry (the first N images are written again, every value)."""
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    lo, size, insize = spatial(g.pads_begin, 0), spatial(g.padded_size, 1), spatial(g.in_size, 1)
    phases, q = _pair_phases(g)
    x3 = spatial3(x).view(np.uint16)
    if out is None:
        shape = (len(phases), g.n, size[0], size[1], q, g.groups, -(-g.icg // rows) * rows, 2)
        out = workspace.empty(math.prod(shape), np.uint16).reshape(shape)
    step = 2 * s[2]
    spans = np.zeros((len(phases), 2, 3), np.int64)   # per (phase, j): first pair, stop, first x position
    for pi, ph in enumerate(phases):
        for j in (0, 1):
            first = max(0, -(-(lo[2] - j * s[2] - ph) // step))
            stop = max(first, min(q, -(-(lo[2] + insize[2] - j * s[2] - ph) // step)))
            spans[pi, j] = first, stop, first * step + j * s[2] + ph - lo[2]
    few = g.icg if g.icg == out.shape[-2] and g.icg < TUNING.pair_fill_channels else 0
    _pair_filler(few)(x3.shape[0] * out.shape[2] * out.shape[3], x3, out.view(np.uint32).reshape(out.shape[:-1]),
                      spans, step, lo[0], lo[1], g.icg)
    xs, k0, k1, k2 = _strides(out.shape[1:]), *np.indices(kernel, np.int64).reshape(3, -1)
    phase = np.searchsorted(np.array(phases, np.int64), k2 * d[2] % step)
    return out, phase * math.prod(out.shape[1:]) + k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] // step * xs[3]


@functools.cache
def _pair_filler(channels: int) -> Callable:
    """``fill(rows, x3, out, spans, step, lo0, lo1, icg)``: ``out[ph, n, p0, p1, q, g, c]``
    (uint32: low half j = 0) half j = ``x3[n, p0 - lo0, p1 - lo1, spans[ph, j, 2] + (q -
    spans[ph, j, 0])*step, g*icg + c]`` for q in [spans[ph, j, 0], spans[ph, j, 1]) and c < icg,
    else zero (and in the padding rows), one padded row (n, p0, p1) an item in the pool: every
    value written once, a position's channels in one loop. Compiled for ``channels`` = icg = the
    padded channels where they are few (a first layer's 3: loops of known length, 2.2x faster),
    else (0) for any."""
    def fill(row, x3, out, spans, step, lo0, lo1, icg):  # pragma: no cover - compiled
        phases, _, p0_, p1_, q_, groups, cb = out.shape
        if channels:
            icg, cb = channels, channels
        i0_, i1_ = x3.shape[1:3]
        n, p0, p1 = row // (p0_ * p1_), row // p1_ % p0_, row % p1_
        i0, i1 = p0 - lo0, p1 - lo1
        inside = 0 <= i0 < i0_ and 0 <= i1 < i1_
        src = x3[n, max(0, min(i0, i0_ - 1)), max(0, min(i1, i1_ - 1))]
        for ph in range(phases):
            dst = out[ph, n, p0, p1]
            f0, s0, p0s = spans[ph, 0, 0], spans[ph, 0, 1], spans[ph, 0, 2]
            f1, s1, p1s = spans[ph, 1, 0], spans[ph, 1, 1], spans[ph, 1, 2]
            if channels and groups == 1:              # each pair stored as it is joined
                d2 = dst.reshape((q_, channels))
                for q in range(q_):
                    lo_in, hi_in = inside and f0 <= q < s0, inside and f1 <= q < s1
                    lo_at, hi_at = p0s + (q - f0) * step, p1s + (q - f1) * step
                    for c in range(channels):
                        v = np.uint32(0)
                        if lo_in:
                            v = np.uint32(src[lo_at, c])
                        if hi_in:
                            v |= np.uint32(src[hi_at, c]) << np.uint32(16)
                        d2[q, c] = v
                continue
            for q in range(q_):
                lo_in, hi_in = inside and f0 <= q < s0, inside and f1 <= q < s1
                lo_at, hi_at = p0s + (q - f0) * step, p1s + (q - f1) * step
                for gi in range(groups):
                    c0 = gi * icg
                    if lo_in and hi_in:
                        for c in range(icg):
                            dst[q, gi, c] = np.uint32(src[lo_at, c0 + c]) | (np.uint32(src[hi_at, c0 + c])
                                                                            << np.uint32(16))
                    elif lo_in:
                        for c in range(icg):
                            dst[q, gi, c] = np.uint32(src[lo_at, c0 + c])
                    elif hi_in:
                        for c in range(icg):
                            dst[q, gi, c] = np.uint32(src[hi_at, c0 + c]) << np.uint32(16)
                    else:
                        for c in range(icg):
                            dst[q, gi, c] = 0
                    for c in range(icg, cb):
                        dst[q, gi, c] = 0
    return microkernel.parallel_items(fill)


def _dy_pairs(g: ConvGeometry, dy: np.ndarray, lanes: int, out: np.ndarray | None = None) -> np.ndarray:
    """bf16 dy as uint16 (N, O0, O1, ceil(O2/2), G, OCg padded to ``lanes``, 2): output
    positions 2i and 2i+1 of each lane interleaved (zero past them); ``out``: such an array of
    at least N images from an earlier call (the first N images are written, every value)."""
    d3 = spatial3(dy).view(np.uint16)
    o2 = d3.shape[3]
    if out is None:
        shape = (*d3.shape[:3], -(-o2 // 2), g.groups, lanes, 2)
        out = workspace.empty(math.prod(shape), np.uint16).reshape(shape)
    _fill_dy_pairs(d3, out.view(np.uint32).reshape(out.shape[:-1]), g.groups, g.ocg)
    return out


@kernel_cache.njit(parallel=True)
def _fill_dy_pairs(d3, out, groups, ocg):  # pragma: no cover - compiled
    """``out[n, o0, o1, i, g, l]`` = ``d3[n, o0, o1, 2i, g*OCg + l]`` | ``d3[.., 2i + 1, ..] << 16``
    (the high half zero past O2) for l < OCg, zero for the lanes past OCg, of the first N images:
    every value written, a pair per 32-bit store; rows (n, o0, o1) in parallel (an image at a time:
    (n, o0) was one item)."""
    n_, o0_, o1_, o2_ = d3.shape[:4]
    lanes = out.shape[5]
    for row in numba.prange(n_ * o0_ * o1_):
        n, o0, o1 = row // (o0_ * o1_), row // o1_ % o0_, row % o1_
        src = d3[n, o0, o1]
        for i in range(-(-o2_ // 2)):
            for gi in range(groups):
                lo = src[2 * i, gi * ocg:(gi + 1) * ocg]
                dst = out[n, o0, o1, i, gi]
                if 2 * i + 1 < o2_:
                    hi = src[2 * i + 1, gi * ocg:(gi + 1) * ocg]
                    for l in range(ocg):
                        dst[l] = np.uint32(lo[l]) | (np.uint32(hi[l]) << np.uint32(16))
                else:
                    for l in range(ocg):
                        dst[l] = np.uint32(lo[l])
                for l in range(ocg, lanes):
                    dst[l] = 0


def _lanes(dy: np.ndarray, groups: int, ocg: int, lanes: int, staged: bool = False) -> np.ndarray:
    """f32 dy (N, *O, G, ``lanes``): each group's channels padded with zeros to ``lanes`` (the
    f32 weights gradient's vectors). C-contiguous f32 dy whose groups fill their lanes already
    and that starts on a cache line is that array (a view: copying it was a tenth of a 64-channel
    3x3 gradient); else a copy, f32 data by a parallel loop writing every value once (NumPy's
    large arrays start 16 bytes past a line: every vector load of dy then touched two, the
    64-channel 3x3 gradient 16.0 ms against 13.2 aligned on the Xeon with AMX). With ``staged``
    (the driver copies each chunk of dy onto a line as it uses it), any such dy is that array."""
    shape = (*dy.shape[:-1], groups, lanes)
    if dy.dtype == F32 and ocg == lanes and dy.flags.c_contiguous and (staged or workspace.address(dy) % workspace.ALIGN == 0):
        return dy.reshape(shape)
    out = workspace.empty(math.prod(shape), F32).reshape(shape)
    if dy.dtype == F32:
        _fill_lanes(spatial3(dy), out.reshape(dy.shape[0], *(1,) * (5 - dy.ndim), *shape[1:]), ocg)
    else:                       # 16-bit data read as f32: converted as NumPy assigns it
        out[..., ocg:] = 0
        out[..., :ocg] = dy.reshape(*dy.shape[:-1], groups, ocg)    # a view, whatever dy's memory order
    return out


@kernel_cache.njit(parallel=True)
def _fill_lanes(d3, out, ocg):  # pragma: no cover - compiled
    """``out[n, o0, o1, o2, g, l] = d3[n, o0, o1, o2, g*OCg + l]`` for l < OCg, else 0; rows
    (n, o0) in parallel."""
    n_, o0_, o1_, o2_, groups, lanes = out.shape
    for row in numba.prange(n_ * o0_):
        n, o0 = row // o0_, row % o0_
        for o1 in range(o1_):
            for o2 in range(o2_):
                src = d3[n, o0, o1, o2]
                for gi in range(groups):
                    dst = out[n, o0, o1, o2, gi]
                    for l in range(ocg):
                        dst[l] = src[gi * ocg + l]
                    for l in range(ocg, lanes):
                        dst[l] = 0


def _pair_image_bytes(g: ConvGeometry, rows: int, lanes: int) -> int:
    """Bytes of one image's copies of x and dy in bf16 pairs (a few times an image each: two
    phases, padding)."""
    phases, q = _pair_phases(g)
    o = spatial(g.out_size, 1)
    return 2 * (len(phases) * math.prod(spatial(g.padded_size, 1)[:2]) * q * 2 * g.groups * -(-g.icg // rows) * rows
                + o[0] * o[1] * -(-o[2] // 2) * 2 * g.groups * lanes)


def _pair_images(g: ConvGeometry, rows: int, lanes: int) -> tuple[int, int]:
    """(images, row ranges) per call of the bf16 pairs' weights gradient: their copies of x and
    dy within ``TUNING.pair_bytes`` and within the bytes of x, dy and dw in bf16 (a dilated
    layer's pairs took 4.4x its image: two phases of padded rows): a few images at a time, or where one
    image's copies exceed ``TUNING.pair_bytes`` (a 3-D image), one image in as many ranges of
    output rows (:func:`_row_ranges`)."""
    image = _pair_image_bytes(g, rows, lanes)
    data = 2 * (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape))
    return max(1, min(g.n, min(TUNING.pair_bytes, data) // image)), -(-image // TUNING.pair_bytes)


def _unpaired_images(g: ConvGeometry, rows: int, lanes: int) -> int:
    """Images per call of a bf16 weights gradient whose pairs would not be exact
    (:func:`_pairs_exact`): its f32 copies (x padded, dy's lanes) within the bytes its pairs
    would take, so that it keeps the pairs' memory bound (:func:`workspace_bytes`)."""
    per = _pair_images(g, rows, lanes)[0]
    f32_image = 4 * (math.prod(g.padded_size) * g.ic + math.prod(g.out_size) * g.groups * lanes)
    return max(1, min(g.n, per * _pair_image_bytes(g, rows, lanes) // f32_image))


def _row_ranges(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, parts: int
                ) -> list[tuple[ConvGeometry, np.ndarray, np.ndarray]]:
    """The weights gradient of ``g`` as the sum of those of up to ``parts`` sub-problems (g', x',
    dy'), each over a range of output rows along the first spatial axis and the x rows it reads
    (its padding where it lies at the edges); ranges whose taps read only padding add nothing
    and are left out. One part, or a 1-D problem: ``g`` itself."""
    if parts <= 1 or g.rank < 2:
        return [(g, x, dy)]
    o, s, ek, pb, size = g.out_size[0], g.strides[0], g.effective_kernel[0], g.pads_begin[0], g.in_size[0]
    step = -(-o // parts)
    out = []
    for a in range(0, o, step):
        b = min(o, a + step)
        lo, hi = a * s - pb, (b - 1) * s - pb + ek            # the padded x rows [lo, hi) it reads
        if min(size, hi) <= max(0, lo):
            continue
        sub = dataclasses.replace(g, in_size=(min(size, hi) - max(0, lo), *g.in_size[1:]),
                                  out_size=(b - a, *g.out_size[1:]), pads_begin=(max(0, -lo), *g.pads_begin[1:]),
                                  pads_end=(max(0, hi - size), *g.pads_end[1:]))
        out.append((sub, x[:, max(0, lo):min(size, hi)], dy[:, a:b]))
    return out


def _pairs_exact(g: ConvGeometry, x: np.ndarray) -> bool:
    """Whether pairs of output positions give the exact sums: an odd last output row's missing
    partner pairs dy's zero with the x one position on, which must then be finite."""
    s, d, k, o = (spatial(v, 1)[2] for v in (g.strides, g.dilations, g.kernel, g.out_size))
    if o % 2 == 0:
        return True
    lo, size = spatial(g.pads_begin, 0)[2], spatial(g.in_size, 1)[2]
    columns = sorted({o * s + t * d - lo for t in range(k)} & set(range(size)))
    return bool(np.isfinite(spatial3(x)[:, :, :, columns].astype(F32)).all()) if columns else True


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, plan: Plan | None = None,
                     rounded: bool = False) -> np.ndarray:
    """dw (*K, ICg, OC) in f32: the reduction over output positions split among the threads
    (partial sums per thread, then added; ``split`` "rows") or the dw blocks split among them
    (every thread over all positions; "blocks"). bf16 data on the ``avx512_bf16`` family runs
    the dot instruction on pairs of output positions (:func:`_pair_blocks`, :func:`_dy_pairs`);
    with ``rounded``, where its f32 sums would outweigh x and dy, a few taps at a time, each
    slab of dw rounded to bf16 once its sums are done (:func:`_tap_slab`)."""
    plan = _plan(g, "backward_weights", plan)
    if plan.param("split") == "taps":
        dw, finite = tap_gemm.run(g, x, dy, rounded)
        if finite:                         # x as its transposition saw it: no pass of its own
            return dw
        plan = type(plan).of("jit", **dict(plan.params, split="rows"))   # Inf/NaN in x may have met junk zeros
    taps = math.prod(g.kernel)
    slab = _tap_slab(g, x, dy, plan, rounded)
    if slab >= taps:
        return _weight_sums(g, x, dy, plan, 0, taps).reshape(g.w_shape)
    dw = workspace.result((taps, g.icg, g.oc), x.dtype)
    for t0 in range(0, taps, slab):
        with workspace.part():   # each slab's pair copies back in the cache for the next
            casts.copy_into(dw[t0:t0 + slab], _weight_sums(g, x, dy, plan, t0, min(taps, t0 + slab)))
    return dw.reshape(g.w_shape)


def _tap_slab(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, plan: Plan, rounded: bool) -> int:
    """Taps per run of :func:`_weight_sums`: all of them, but for a rounded bf16 result on the
    dot instruction whose f32 partial sums (one dw per share) exceed x and dy: then as many as
    keep them within the larger of x + dy and the bf16 dw (ResNet-50's 512-channel 3x3 layer at
    7x7 took 2.17x its inputs and output of extra memory with all taps at once)."""
    taps = math.prod(g.kernel)
    rows, _, vw = _block(plan)
    shares = 1 if plan.param("split") == "blocks" else min(pool.threads(), g.n * math.prod(g.out_size[:-1]))
    sums = 4 * shares * taps * g.groups * -(-g.icg // rows) * rows * -(-g.ocg // vw) * vw
    data = x.nbytes + dy.nbytes
    if not rounded or _depth(x.dtype) != 2 or sums <= data:
        return taps
    return max(1, taps * max(data, 2 * math.prod(g.w_shape)) // sums)


def _weight_sums(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, plan: Plan, t0: int, t1: int) -> np.ndarray:
    """The f32 sums of dw's taps ``t0 .. t1`` (in the kernel's row-major order) as (t1 - t0,
    ICg, OC): :func:`backward_weights`' reduction for those taps."""
    rows, vecs, vw = _block(plan)
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    size, o = spatial(g.padded_size, 1), spatial(g.out_size, 1)
    nblocks = -(-g.ocg // vw)
    depth = 2 if _depth(x.dtype) == 2 and _pairs_exact(g, x) else 1
    fold = folds(g, depth) if (t0, t1) == (0, math.prod(kernel)) else 1    # taps of the last axis as channels
    icg = g.icg * fold
    row_blocks = -(-icg // rows)
    threads = pool.threads()
    split_blocks = plan.param("split") == "blocks"
    shares = 1 if split_blocks else min(threads, g.n * o[0] * o[1])
    chunk = max(1, plan.param("cache_bytes") // (4 * o[2] * (g.ic + g.oc)))
    parts = workspace.result((shares, (t1 - t0) // fold, g.groups, row_blocks * rows, nblocks * vw), F32)
    written = False
    per, ranges = _pair_images(g, rows, vw) if depth == 2 else (   # bf16 pairs: a few images at a time
        _unpaired_images(g, rows, vw) if _depth(x.dtype) == 2 else g.n, 1)   # ... in buffers allocated once
    xb = dyp = None
    for n0 in range(0, g.n, per):
        gn = dataclasses.replace(g, n=min(per, g.n - n0))
        subs = _row_ranges(gn, x[n0:n0 + gn.n], dy[n0:n0 + gn.n], ranges)
        for gc, xc, dyc in subs:
            own = len(subs) > 1 or depth == 1 and per < g.n           # a range's (or chunk's) own copies
            with workspace.part() if own else contextlib.nullcontext():
                if len(subs) > 1:
                    xb = dyp = None
                oc = spatial(gc.out_size, 1)
                if depth == 2:
                    xb, taps_a = _pair_blocks(gc, xc, rows, xb)
                    taps_a = taps_a[t0:t1]
                    xs = _strides(xb.shape[1:])
                    x_steps = [xs[0], s[0] * xs[1], s[1] * xs[2], xs[3]]
                    dyp = _dy_pairs(gc, dyc, nblocks * vw, dyp)
                    g_step, block_step, flat_x = xs[4], rows * 2, xb.reshape(-1)
                else:     # x zero-padded, a block's rows adjacent channels (the last reads on: dropped)
                    xb = padded(xc, spatial(g.pads_begin, 0), size, F32, rows)
                    xs = _strides(xb.shape)
                    x_steps = [xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]]
                    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3]
                                       for k0 in range(kernel[0]) for k1 in range(kernel[1])
                                       for k2 in range(kernel[2] // fold)], np.int64)[t0:t1]
                    dyp = _lanes(dyc, g.groups, g.ocg, nblocks * vw, staged=True)
                    g_step, block_step, flat_x = g.icg, rows, geometry.flat(xb)
                rows_total = gc.n * oc[0] * oc[1]
                items, run_rows = shares * (threads if split_blocks else 1), min(chunk, rows_total)
                dy_row = g.groups * nblocks * vw * depth
                span = -(-run_rows * -(-o[2] // depth) * g.groups * vw * depth // 32) * 32   # a chunk's block of dy
                stage = workspace.empty(items * span, dyp.dtype).reshape(items, span)
                fresh = not written and rows_total >= shares     # every share's sums written by its first chunk
                if not written and not fresh:
                    parts.fill(0)
                written = True
                _weights(_width(), rows, vecs, isa.bf16_kernel() if depth == 2 else 0)(
                    items, flat_x, np.array(x_steps, np.int64), g_step, block_step, taps_a, dyp.reshape(-1), dy_row,
                    np.array((gc.n, *oc), np.int64), run_rows, parts.reshape(-1), shares,
                    threads if split_blocks else 1, g.groups, icg, g.ocg, depth, -(-o[2] // depth), stage, fresh)
    total = parts[0]
    for more in parts[1:]:
        total += more
    if g.groups == 1:    # (T, ICg, OC) a view of the padded sums: no copy of a weight-sized array
        return total[:, 0, :icg, :g.ocg].reshape(t1 - t0, g.icg, g.ocg)   # (folded: K2*ICg rows a tap)
    return np.ascontiguousarray(total[:, :, :g.icg, :g.ocg].transpose(0, 2, 1, 3)).reshape(t1 - t0, g.icg, g.oc)
