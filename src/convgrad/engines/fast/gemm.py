"""The ``gemm`` strategy: convolutions as GEMMs on NumPy's BLAS, in one of four variants.

The plan parameter ``variant`` picks how the convolution becomes GEMMs:

- ``frame`` (any problem): the batch is split into chunks whose frame buffers hold about
  ``chunk_bytes``; each chunk is copied once into its *phase frame* (:mod:`.frame`: one
  zero-padded, stride-phase-split (rows, C) buffer per input phase the kernel reads, none for
  stride 1 without padding), in the data's own memory order, bf16/f16 widened in that copy. Every
  kernel offset is then a row shift of a flat ``(rows, C)`` matrix, and each problem a sum over
  offsets of GEMMs on views of those buffers, over row blocks of about ``block_bytes``
  (:mod:`.kernels`, accumulating inside BLAS: :mod:`.blas`):

  - forward:          ``y[m]    = sum_k P[m + shift_k] @ w[k]``
  - backward data:    ``dP[m]   = sum_k dy_ext[m - shift_k] @ w[k]^T``, each offset over just
                      the rows m where ``dy_ext[m - shift_k]`` can be non-zero, then one copy
                      into dx (for bf16/f16 data that copy rounds: no f32 dx)
  - backward weights: ``dw[k]   = sum_m P[m + shift_k]^T @ dy_ext[m]``

  With Ci input-side channels per group below ``TUNING.gemm_depth`` several taps are gathered
  side by side per GEMM (a blocked im2col, cache-sized); narrow outputs (Co < min(Ci,
  gemm_depth)) are summed at their shifts after one wide GEMM per cluster of taps, and a first
  layer's backward data (``TUNING.scatter_channels``) scatters the products of dy's own rows.
- ``output_rows`` (gradients): GEMMs over the output rows only, the taps gathered or scattered
  by compiled loops (:mod:`.output_rows`): no junk rows of the frame, one wide GEMM per chunk.
- ``pointwise`` (1x1, no padding, one group, bf16/f16): one GEMM over row blocks widened to f32
  and rounded back while in cache (:mod:`.pointwise`).
- ``image_gemms`` (1x1, stride 1, no padding, one group, data in the accumulation dtype): one
  GEMM per image on the (C, positions) matrices of NCX data as they are, no frame copies.

Padding is not part of the sums (docs/semantics.md): where the frame's or the gathered taps'
zeros would meet a NaN or Inf weight (gradient), :func:`run` takes another path (the output-row
GEMMs for backward data, the direct loops otherwise).

Extra memory stays within 2x the op's inputs + output: a chunk takes at most
:func:`chunk_budget` bytes of temporaries (``chunk_bytes``, and half the op's inputs + output or
``TUNING.min_chunk_bytes``, the latter at most the inputs + output for the output-row variant),
whatever N is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ... import casts, layout
from ...dtypes import bfloat16, compute_dtype
from ...problem import ConvGeometry
from . import blas, direct, geometry, kernels, output_rows, pointwise, workspace
from .features import Features
from .frame import Frame, empty_like_data
from .geometry import tap_weights
from .tuning import TUNING

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["VARIANTS", "applies", "variant_applies", "complete", "options", "run", "workspace_bytes", "chunk_budget"]

VARIANTS = ("frame", "output_rows", "pointwise", "image_gemms")


def variant_applies(f: Features, name: str) -> bool:
    """Whether the variant ``name`` can run ``f`` (see the module docstring)."""
    if name == "output_rows":
        return f.task != "forward"
    if name == "pointwise":
        return f.pointwise and f.data_dtype in (bfloat16, np.dtype(np.float16))
    if name == "image_gemms":
        return f.pointwise and all(s == 1 for s in f.strides) and f.data_dtype == f.acc
    return name == "frame"


def applies(f: Features, plan: Plan | None = None) -> bool:
    """Any non-empty problem; a plan's variant where it applies (see the module docstring) and
    positive chunk and block sizes."""
    if f.n == 0:
        return False
    if plan is None:
        return True
    sizes = (plan.param("chunk_bytes"), plan.param("block_bytes"))
    return variant_applies(f, plan.param("variant")) and all(isinstance(v, int) and v > 0 for v in sizes)


def complete(f: Features, params: dict) -> dict:
    """``params`` (their ``variant`` given: the rule's, :func:`.plan.gemm_variant`) with
    ``chunk_bytes`` and ``block_bytes`` defaulted from the tuning table (``pointwise_block_bytes``
    for the pointwise variant)."""
    name = params["variant"]
    block = TUNING.pointwise_block_bytes if name == "pointwise" else TUNING.block_bytes
    return {"variant": name, "chunk_bytes": TUNING.chunk_bytes, "block_bytes": block, **params}


def options(f: Features) -> list[dict]:
    """Parameter sets worth timing: each variant that applies."""
    return [{"variant": name} for name in VARIANTS if variant_applies(f, name)]


def chunk_budget(g: ConvGeometry, data: np.dtype, chunk_bytes: int, expanding: bool = False) -> int:
    """Bytes of temporaries per batch chunk: at most ``chunk_bytes`` and half the bytes of the op's
    inputs and output in ``data`` (so extra memory stays below 2x of them even when bf16/f16
    data is widened to f32), but not cut below ``TUNING.min_chunk_bytes`` for the latter (small
    problems: one chunk). For temporaries ``expanding`` the data (the output-row variant's taps of
    a chunk, prod(K) times its input) that floor is at most half the inputs and output, so that
    the extra memory stays within 2x of them for small problems too (with a bf16 weights
    gradient's f32 sums beside the chunk: 2.06x at a whole inputs + output, dilated_conv:21 at
    mb 2)."""
    io_bytes = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * data.itemsize
    floor = min(TUNING.min_chunk_bytes, io_bytes // 2) if expanding else TUNING.min_chunk_bytes
    return min(chunk_bytes, max(floor, io_bytes // 2))


# -- running ---------------------------------------------------------------------------------------
def run(plan: Plan, g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, rounded: bool = False) -> np.ndarray:
    """``task`` on its two canonical inputs by ``plan``'s variant; the result in the
    accumulation dtype, or with ``rounded`` for 16-bit data where the variant rounds as it
    stores (pointwise forward and data gradient, block by block; the frame's and the output
    rows' data gradients, chunk by chunk) in the data's dtype."""
    name, acc = plan.param("variant"), compute_dtype(a.dtype)
    # The frame and output-row GEMMs multiply the padding's zeros too; padding is not part of the
    # sums (docs/semantics.md, *NaN and Inf*), so a NaN/Inf weight or gradient that would meet it
    # goes to a path that skips it: checked on the weights before (one reduction over w), on the
    # weights gradient after (over dw, not dy: a non-finite dy makes every dw it pairs with
    # non-finite, padding included, so a finite dw means no padding met one).
    meets_padding = name in ("frame", "output_rows") and geometry.has_padding(g)
    if name == "frame" and task == "backward_data" and not direct.finite(b, acc):
        name = "output_rows"  # the frame would multiply a NaN/Inf weight by its junk rows' zeros
    if meets_padding and task == "forward" and not direct.finite(b, acc):
        return direct.forward(g, a, b, acc)
    result = _run(name, plan, g, a, b, task, acc, rounded)
    if meets_padding and task == "backward_weights" and not direct.finite(result, acc):
        return direct.backward_weights(g, a, b, acc)
    return result


def _run(name: str, plan: Plan, g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str,
         acc: np.dtype, rounded: bool) -> np.ndarray:
    """``task`` by variant ``name``."""
    budget = chunk_budget(g, a.dtype, plan.param("chunk_bytes"), expanding=name == "output_rows")
    block = plan.param("block_bytes")
    if name == "pointwise":
        return _pointwise(g, a, b, task, acc, block, rounded)
    if name == "image_gemms":
        return _image_gemms(g, a, b, task, acc)
    if name == "output_rows":
        if task == "backward_data":
            return output_rows.backward_data(g, a, b, acc, budget, rounded)
        return output_rows.backward_weights(g, a, b, acc, budget)
    if task == "backward_data":
        return _backward_data(g, a, b, acc, budget, block, rounded)
    return {"forward": _forward, "backward_weights": _backward_weights}[task](g, a, b, acc, budget, block)


def _pointwise(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, acc: np.dtype, block: int,
               rounded: bool) -> np.ndarray:
    out = a.dtype if rounded else acc
    if task == "forward":
        y = workspace.result(g.y_shape, out)
        pointwise.product(pointwise.sampled(g, a), casts.astype(b, acc).reshape(g.ic, g.oc), y, block)
        return y
    if task == "backward_data":
        every = g.out_size == g.in_size  # else zero where no output reads
        dx = (np.empty if every else np.zeros)(g.x_shape, out)
        pointwise.product(a, casts.astype(b, acc).reshape(g.ic, g.oc).T, pointwise.sampled(g, dx), block)
        return dx
    return pointwise.weights_gradient(pointwise.sampled(g, a), b, block).reshape(g.w_shape)


def _image_rows(data: np.ndarray) -> np.ndarray:
    """Canonical (N, *X, C) data as (N, prod(X), C) matrices (a view for NCX memory)."""
    return data.reshape(data.shape[0], -1, data.shape[-1])


def _image_gemms(g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str, acc: np.dtype) -> np.ndarray:
    if task == "backward_weights":
        dw = _zero_sums(g, acc, layout.channels_first(a))
        total = dw[0, :, 0]
        for xn, dyn in zip(_image_rows(a), _image_rows(b)):
            if not blas.addmm(total, xn.T, dyn):
                total += xn.T @ dyn
        return dw.reshape(g.w_shape)
    out = empty_like_data(g.y_shape if task == "forward" else g.x_shape, acc, a)
    weights = tap_weights(g, b, transpose=task == "backward_data")[0, 0].astype(acc, copy=False)
    np.matmul(_image_rows(a), weights, out=_image_rows(out))
    return out


def _zero_sums(g: ConvGeometry, dtype: np.dtype, channels_first: bool) -> np.ndarray:
    """Zeroed (T, ICg, G, OCg) weights sums. For a 1x1 kernel on channels-first data they lie in
    OIX order in memory ((G, OCg, ICg); the GEMMs write either order), so that the OIX result
    NCX users ask for needs no transposition."""
    if math.prod(g.kernel) == 1 and channels_first:
        return np.zeros((g.groups, g.ocg, g.icg), dtype).transpose(2, 0, 1)[None]
    return np.zeros((math.prod(g.kernel), g.icg, g.groups, g.ocg), dtype)


def _frame(g: ConvGeometry, channels_first: bool, task: str) -> Frame:
    """The frame of ``g`` for ``task``. A side's buffers (x, y) are channel-major when the data is
    (NCX: copies then run along memory), or when that side's channels are split into groups or
    fewer than ``TUNING.gemm_depth`` and the kernels gather or sum them (along runs of rows rather
    than runs of a few channels). A side the kernels only read as a GEMM operand keeps the data's
    order: dy in backward weights, x there unless its taps are gathered, and the source of a
    narrow-output sum (:func:`kernels.spreads`)."""
    def major(per_group: int) -> bool:
        return channels_first or g.groups > 1 or per_group < TUNING.gemm_depth
    taps = math.prod(g.kernel)
    if task == "backward_weights":  # x is gathered only below reduce_views channels
        gathered = kernels.taps_per_gemm(taps, g.icg, reduces=True) > 1
        return Frame.of(g, channels_first or gathered, channels_first)
    if task == "backward_data":
        return Frame.of(g, major(g.icg), channels_first if kernels.spreads(taps, g.ocg, g.icg) else major(g.ocg))
    return Frame.of(g, channels_first if kernels.spreads(taps, g.icg, g.ocg) else major(g.icg), major(g.ocg))


def _frame_bytes(g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype) -> int:
    """Bytes per image of the frame buffers ``task`` allocates (none where the data itself serves
    as the frame: stride 1 without padding on the input side, no junk rows on the output side and,
    for backward data, no lead rows, in the accumulation dtype and the frame's memory order; the
    weights gradient of narrow inputs has no dy frame, only 16-bit NCX dy widened)."""
    acc, rows = compute_dtype(dtype), frame.image_rows
    lead = frame.max_shift(1) if task == "backward_data" else 0  # lead rows grow at most with n
    own_input = frame.input_is_frame and not frame.batch_inside and not frame.input_major \
        and (task == "backward_data" or dtype == acc)
    own_output = not frame.batch_inside and not frame.output_major and not lead \
        and (task == "forward" or dtype == acc)
    output = 0 if own_output else (rows + lead) * g.oc
    if task == "backward_weights" and kernels.taps_per_gemm(math.prod(g.kernel), g.icg, reduces=True) > 1:
        widened = dtype != acc and frame.output_major  # 16-bit NCX dy, widened along memory
        output = math.prod(g.out_size) * g.oc if widened else 0
    return ((0 if own_input else frame.phase_count * rows * g.ic) + output) * acc.itemsize


def _images_per_chunk(g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype, budget: int) -> int:
    """Images per batch chunk: frame buffers of at most ``budget`` bytes; at least one image."""
    return max(1, budget // max(1, _frame_bytes(g, frame, task, dtype)))


def _batches(g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype, budget: int) -> Iterator[slice]:
    step = _images_per_chunk(g, frame, task, dtype, budget)
    for start in range(0, g.n, step):
        yield slice(start, min(g.n, start + step))


def _forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray, dtype: np.dtype, budget: int, block: int) -> np.ndarray:
    """y = conv(x, w): sum over offsets of shifted-row GEMMs into the frame rows of y."""
    y = empty_like_data(g.y_shape, dtype, x, fill=True)
    frame = _frame(g, layout.channels_first(x), "forward")
    weights = tap_weights(g, w)
    for batch in _batches(g, frame, "forward", x.dtype, budget):
        n, taps = batch.stop - batch.start, frame.taps(batch.stop - batch.start)
        srcs = frame.phase_input(x[batch], dtype)
        rows = frame.output_target(y[batch])
        kernels.accumulate(rows[:frame.span(n)], srcs, taps, weights, kernels.taps_per_gemm(len(taps), g.icg), block)
        frame.crop_output(rows, y[batch])
    return y


def _backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dtype: np.dtype, budget: int,
                   block: int, rounded: bool) -> np.ndarray:
    """dx: per input phase, the sum over its offsets of GEMMs on dy shifted back by the offset."""
    frame = _frame(g, layout.channels_first(dy), "backward_data")
    weights = tap_weights(g, w, transpose=True)
    few, many = TUNING.scatter_channels
    scattered = len(weights) > 1 and g.icg <= few and g.ocg >= many
    # 16-bit data, rounded: the phase buffers' copy into dx rounds (once, to nearest even): no f32 dx
    rounds = rounded and dy.dtype != dtype and not frame.input_is_frame
    dx = empty_like_data(g.x_shape, dy.dtype if rounds else dtype, dy,
                         fill=scattered or not (frame.input_is_frame or frame.covers_input))
    per_phase = [[k for k, p in enumerate(frame.tap_phase) if p == ph] for ph in range(len(frame.phases))]
    for batch in _batches(g, frame, "backward_data", dy.dtype, budget):
        n = batch.stop - batch.start
        if scattered:
            target = frame.input_target(dx[batch], dtype, zeroed=True)
            kernels.spread_scattered(target, weights, frame.taps(n), frame.output_grid(n), dy[batch], block)
            frame.scatter_input(target, dx[batch])
            continue
        shifts = [shift for _, shift in frame.taps(n)]
        lead = max(shifts)
        src = frame.extended_output(dy[batch], dtype, lead)
        target = frame.input_target(dx[batch], dtype)
        for ph, offsets in enumerate(per_phase):
            first, last = frame.phase_rows(ph, n)
            out, taps = target[ph][first:last], [(0, lead + first - shifts[k]) for k in offsets]
            own = weights if len(offsets) == len(weights) else weights[offsets]
            kernels.accumulate(out, [src], taps, own, kernels.taps_per_gemm(len(taps), g.ocg), block,
                               live=(lead, lead + frame.span(n)))
        frame.scatter_input(target, dx[batch])
    return dx


def _backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dtype: np.dtype, budget: int,
                      block: int) -> np.ndarray:
    """dw[k] = sum over the frame rows of the shifted input rows times dy, per batch chunk."""
    dw = _zero_sums(g, dtype, layout.channels_first(x))
    frame = _frame(g, layout.channels_first(x), "backward_weights")
    per_gemm = kernels.taps_per_gemm(math.prod(g.kernel), g.icg, reduces=True)
    for batch in _batches(g, frame, "backward_weights", x.dtype, budget):
        n, taps = batch.stop - batch.start, frame.taps(batch.stop - batch.start)
        srcs = frame.phase_input(x[batch], dtype)
        if per_gemm > 1:
            kernels.reduce_gathered(dw, srcs, taps, frame.output_grid(n), dy[batch], per_gemm, block)
        else:
            kernels.reduce(dw, srcs, taps, frame.extended_output(dy[batch], dtype)[:frame.span(n)], block)
    return dw.reshape(g.w_shape)


# -- memory ----------------------------------------------------------------------------------------
def workspace_bytes(f: Features, plan: Plan) -> int:
    """Upper estimate of the extra bytes ``plan`` allocates for ``f`` beyond its inputs and result:
    per variant, one batch chunk of temporaries, the row-block temporaries, converted weights and,
    for bf16/f16, the f32 result before the API rounds it; plus 16 KiB of views, tables and
    per-call objects (what dominates small problems)."""
    return _workspace(f, plan) + (16 << 10)


def _workspace(f: Features, plan: Plan) -> int:
    g, data, acc, task = f.geometry, f.data_dtype, f.acc, f.task
    name, block = plan.param("variant"), plan.param("block_bytes")
    budget = chunk_budget(g, data, plan.param("chunk_bytes"), expanding=name == "output_rows")
    result = math.prod(f.result_shape) * (acc.itemsize if data != acc else 0)
    if name == "output_rows":
        return output_rows.workspace_bytes(g, task, data, budget) + (
            math.prod(g.w_shape) * acc.itemsize if task == "backward_weights" and data != acc else 0)
    if name == "pointwise":  # two f32 row buffers of a block (or of a run of images), f32 weights, f32 dw
        width = g.ic + g.oc
        rows = max(TUNING.min_block_rows, block // (4 * width), math.prod(g.out_size))
        return 2 * rows * width * 4 + 2 * math.prod(g.w_shape) * 4
    if name == "image_gemms":
        return 2 * math.prod(g.w_shape) * acc.itemsize
    return _frame_workspace(f, budget, block) + result


def _frame_workspace(f: Features, budget: int, block: int) -> int:
    """The frame variant's chunk of frame buffers (and of f16 data widened to f32 before its frame
    copy), three row blocks and three weights' worth of converted weights."""
    g, data, acc, task, taps = f.geometry, f.data_dtype, f.acc, f.task, f.taps
    depth, width = (g.ocg, g.icg) if task == "backward_data" else (g.icg, g.ocg)
    per_gemm = kernels.taps_per_gemm(taps, depth, reduces=task == "backward_weights")
    widest = g.groups * max(per_gemm * depth, taps * width) * acc.itemsize
    spreads = task != "backward_weights" and kernels.spreads(taps, depth, width)
    frame = _frame(g, f.channels_first, task)
    images = min(max(g.n, 1), _images_per_chunk(g, frame, task, data, budget))
    rows = images * frame.image_rows + frame.max_shift(images)
    block_bytes = block * (TUNING.spread_blocks if spreads else 1)
    blocks = 3 * min(rows * widest, max(block_bytes, TUNING.min_block_rows * widest))
    widened = images * (math.prod(g.x_shape[1:]) + math.prod(g.y_shape[1:])) * acc.itemsize \
        if data == np.float16 else 0  # casts.to_f32 of the chunk before its frame copy
    return images * _frame_bytes(g, frame, task, data) + blocks + widened + 3 * taps * g.icg * g.oc * acc.itemsize
