"""The fast engine (the default): phase frames, shifted-row GEMMs and blocked accumulation.

Algorithm (see :mod:`.frame` for the index math and :mod:`.kernels` for the row kernels):

1. Split the batch into chunks whose frame buffers hold about ``CHUNK_BYTES``.
2. Copy the chunk once into its *phase frame*: one zero-padded, stride-phase-split (rows, C)
   buffer per input phase the kernel reads (none at all for stride 1 without padding), stored in
   the data's own order (row-major for NXC, channel-major for NCX, see :func:`_frame`). bf16/f16
   data is converted to the accumulation dtype (f32; f64 for f64 data) in that same copy.
3. Every kernel offset is then a row shift of a flat ``(rows, C)`` matrix, and each problem is a
   sum over offsets of GEMMs on views of those buffers, run over cache-sized row blocks, each
   offset's product accumulated inside BLAS (:mod:`.blas`):

   - forward:          ``y[m]    = sum_k P[m + shift_k] @ w[k]``
   - backward data:    ``dP[m]   = sum_k dy_ext[m - shift_k] @ w[k]^T``, each offset over just
                       the rows m where ``dy_ext[m - shift_k]`` can be non-zero (so the borders of
                       the first axis cost nothing), then one copy into dx (for bf16/f16 data
                       that copy rounds: no f32 dx)
   - backward weights: ``dw[k]   = sum_m P[m + shift_k]^T @ dy_ext[m]``

Selection rule, one algorithm per problem class, the first that applies (:func:`_algorithm`;
Ci/Co: channels per group on the GEMM's input and output side; ``GEMM_DEPTH`` = 64):

- depthwise (Ci = Co = 1), any size: compiled multiply-adds vectorised over channels
  (:mod:`.depthwise`, numba; 6x the direct loops below on a 32-channel 7x7 layer);
- an empty batch: zeros;
- a strategy forced by :func:`forced_strategy` or ``CONVGRAD_STRATEGY``, where it applies;
- small problems (``direct.small``: at most ``direct.SMALL_FLOPS`` of work): compiled direct
  loops (:mod:`.direct`), where the frame path's fixed costs would dominate;
- ``jit.selected`` (the host's kernel family in ``TUNING.jit_families``, f32 accumulation, >= 2
  taps, at most 128 (forward) / 64 (gradients) channels per group, gradients from 8 input
  channels, the weights gradient of f32 data, no gradient whose frame is mostly junk rows (those
  run on output rows, below: 0.22x vs 1.1x on a dilated 3x13 output); :mod:`.tuning` has the
  measurements): implicit-GEMM convolutions on our JIT micro-kernels (:mod:`.jit`,
  docs/engine.md);
- pointwise layers (1x1, no padding, one group, any stride) on bf16/f16 channels-last data: one
  GEMM over row blocks that are widened to f32 and rounded back while in cache (:mod:`.pointwise`);
- backward data and weights where the frame has ``output_rows.JUNK_RATIO[task]`` times more rows than
  there are outputs (a large dilation on a small output), and kernels with several taps from
  ``output_rows.WIDE_CHANNELS[task]`` (ICg, OCg) channels per group (data: 32, 256, or from 32
  input channels where the frame would spread narrow results; weights: 32, 64): GEMMs over the
  output rows only, the taps gathered or scattered by compiled loops (:mod:`.output_rows`;
  bf16/f16 sums rounded per batch chunk, and weights widened in blocks where their f32 copy
  would outweigh dx and dy);
- a pointwise layer (1x1, stride 1, no padding, one group) on NCX data in the accumulation dtype
  with at least ``IMAGE_GEMM_ROWS`` positions per image: one GEMM per image on the channel-major
  (C, positions) matrices as they are (no frame copies; below that size the per-image GEMMs are
  too small and the frame path wins), batched for forward and backward data, summed into dw for
  backward weights;
- otherwise the frame; there Ci >= GEMM_DEPTH (backward weights: Ci >= ``REDUCE_VIEWS`` = 32,
  its GEMMs reduce over rows): one GEMM per kernel offset on views of the frame (no copy);
- below that: ``taps_per_gemm`` offsets gathered side by side per row block, so that each
  GEMM reduces over >= GEMM_DEPTH values (a blocked im2col, cache-sized); for backward weights,
  where those values are the GEMM's output rows, ``REDUCE_DEPTH`` = 256 of them, gathered for
  blocks of dy's own rows (:func:`kernels.reduce_gathered`: no frame copy of dy, no junk rows;
  1.2-1.4x over gathering frame rows, e.g. the 3-channel 7x7 first layer);
- sums over offsets (forward, backward data) with Co < min(Ci, GEMM_DEPTH): one wide GEMM for a
  cluster of offsets, then the narrow results summed at their shifts (:func:`kernels.accumulate`);
  for backward data into at most 4 channels from at least 32 (``SCATTER_CHANNELS``, a first
  layer), one GEMM per block of dy's own rows for every offset, its products added into the
  phase buffers at their taps (:func:`kernels.spread_scattered`: no frame copy of dy).

Extra memory (see :meth:`FastEngine.workspace_bytes`): the chunk's frame buffers (at most
``CHUNK_BYTES`` and half the op's inputs + output or 1 MiB, unless one image needs more) plus a
few row blocks of ``BLOCK_BYTES``, converted weights, and for bf16/f16 the f32 result the API
rounds; never an im2col buffer. The direct loops take contiguous copies of their inputs; the
output-row GEMMs chunks of Z or of gathered taps (of images, or of output rows of one large
volume) of at most half the op's inputs + output (or 1 MiB), and for bf16/f16 the chunk's f32
sums (data) or the f32 dw (weights).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import numpy as np

from ... import casts, layout
from ...dtypes import compute_dtype
from ...errors import EngineError
from ...problem import ConvGeometry
from .. import register
from . import blas, depthwise, direct, isa, jit, kernels, output_rows, pointwise
from .frame import Frame, empty_like_data

__all__ = ["FastEngine", "CHUNK_BYTES", "STRATEGIES", "forced_strategy"]

#: Bytes of frame buffers per batch chunk (at least one image per chunk).
CHUNK_BYTES = 16 << 20
#: Chunks of at most half the op's own size are never cut below this (tiny problems: one chunk).
MIN_CHUNK_BYTES = 1 << 20
#: Positions per image from which an NCX pointwise layer runs as per-image GEMMs (see above).
IMAGE_GEMM_ROWS = 128
#: (at most ICg, at least OCg) of a multi-tap backward data whose products of dy's own rows are
#: scattered into the phase buffers (a first layer: a few image channels from many). Measured
#: against the frame's shifted sums: 1.35x on ResNet-50's conv1, 1.6x on 3-D U-Net's conv_1,
#: 1.35x with 3 channels from 32 (64x64 images); 0.8-0.95x with 3 from 16, or 8-16 from 32-64,
#: and 0.5-0.75x grouped, where the shifted sums are long vector operations and the scatter's runs
#: are short or many.
SCATTER_CHANNELS = (4, 32)


#: The strategies :func:`forced_strategy` and ``CONVGRAD_STRATEGY`` can force.
STRATEGIES = ("jit", "frame", "direct", "output_rows", "pointwise", "image_gemms")
_forced: list[str] = []


@contextlib.contextmanager
def forced_strategy(name: str | None) -> Iterator[None]:
    """Within the block, run every problem that strategy ``name`` can take on it (``None``: the
    selection rule), like ``CONVGRAD_STRATEGY=name`` (read at every call) does for a whole process.
    Depthwise problems and empty batches keep their own strategies; ``jit`` takes f32-accumulating
    problems on a JIT family (f64 keeps the rule), ``output_rows`` gradients only, ``pointwise``
    and ``image_gemms`` the problems their rules admit. For tests and measurements."""
    _forced.append(_strategy(name) if name else "")
    try:
        yield
    finally:
        _forced.pop()


def _strategy(name: str) -> str:
    if name not in STRATEGIES:
        raise EngineError(None, f"CONVGRAD_STRATEGY={name!r} is not a strategy of the fast engine: expected one "
                          f"of {', '.join(STRATEGIES)}")
    return name


def _forced_strategy() -> str | None:
    """The strategy forced by :func:`forced_strategy` (innermost) or ``CONVGRAD_STRATEGY``."""
    if _forced:
        return _forced[-1] or None
    name = os.environ.get("CONVGRAD_STRATEGY")
    return _strategy(name) if name else None


def _depthwise(g: ConvGeometry) -> bool:
    return g.icg == 1 and g.ocg == 1


def _takes(name: str, g: ConvGeometry, task: str, dtype: np.dtype, data: tuple[np.ndarray, ...] | None) -> bool:
    """Whether strategy ``name`` can run ``task`` on ``g`` (a forced strategy applies where it does)."""
    if name == "jit":
        return jit.applies(g, dtype)
    if name == "output_rows":
        return task != "forward"
    if name == "pointwise":
        return data is not None and pointwise.applies(g, *data)
    if name == "image_gemms":
        return data is not None and _image_gemms(g, dtype, *data)
    return True


def _algorithm(g: ConvGeometry, task: str, dtype: np.dtype, data: tuple[np.ndarray, ...] | None,
               data_dtype: np.dtype | None = None) -> str:
    """The selection rule of the module docstring, in its order: the algorithm that runs ``task``
    on ``g`` with the op's canonical ``data`` inputs in accumulation dtype ``dtype``. Without
    ``data`` (planning for any layout) the rules that depend on it are skipped, and
    ``data_dtype`` gives the data's dtype. The first call checks a family forced by
    ``CONVGRAD_ISA`` (:func:`.isa.family`)."""
    isa.family()
    if _depthwise(g) and g.n:
        return "depthwise"
    if g.n == 0:
        return "empty"
    forced = _forced_strategy()
    if forced and _takes(forced, g, task, dtype, data):
        return forced
    if direct.small(g):
        return "direct"
    frame_size = Frame.of(g).size
    if jit.selected(g, task, dtype, data[0].dtype if data is not None else data_dtype or dtype) \
            and not (task != "forward" and output_rows.junk_heavy(g, frame_size, task)):
        return "jit"
    if data is not None and pointwise.applies(g, *data):
        return "pointwise"
    if task != "forward" and output_rows.applies(g, frame_size, task):
        return "output_rows"
    if data is not None and _image_gemms(g, dtype, *data):
        return "image_gemms"
    return "frame"


def _image_gemms(g: ConvGeometry, dtype: np.dtype, *data: np.ndarray) -> bool:
    """Whether the problem on ``data`` runs as one GEMM per image (see the selection rule)."""
    return (g.groups == 1 and math.prod(g.kernel) == 1 and all(s == 1 for s in g.strides)
            and not any(g.pads_begin) and not any(g.pads_end) and math.prod(g.out_size) >= IMAGE_GEMM_ROWS
            and all(a.dtype == dtype and layout.channels_first(a) for a in data))


def _image_rows(data: np.ndarray) -> np.ndarray:
    """Canonical (N, *X, C) data as (N, prod(X), C) matrices (a view for NCX memory)."""
    return data.reshape(data.shape[0], -1, data.shape[-1])


def _frame(g: ConvGeometry, channels_first: bool, task: str) -> Frame:
    """The frame of ``g`` for ``task``. A side's buffers (x, y) are channel-major when the data is
    (NCX: copies then run along memory), or when that side's channels are split into groups or
    fewer than ``GEMM_DEPTH`` and the kernels gather or sum them (along runs of rows, 2-3x faster
    than along runs of a few channels). A side the kernels only read as a GEMM operand keeps the
    data's order: dy in backward weights, x there unless its taps are gathered, and the source of
    a narrow-output sum (:func:`kernels.spreads`); a transposing copy of narrow NXC data cost
    1.4-2x there."""
    def major(per_group: int) -> bool:
        return channels_first or g.groups > 1 or per_group < kernels.GEMM_DEPTH
    taps = math.prod(g.kernel)
    if task == "backward_weights":  # x is gathered only below REDUCE_VIEWS channels
        gathered = kernels.taps_per_gemm(taps, g.icg, reduces=True) > 1
        return Frame.of(g, channels_first or gathered, channels_first)
    if task == "backward_data":
        return Frame.of(g, major(g.icg), channels_first if kernels.spreads(taps, g.ocg, g.icg) else major(g.ocg))
    return Frame.of(g, channels_first if kernels.spreads(taps, g.icg, g.ocg) else major(g.icg), major(g.ocg))


def _tap_weights(g: ConvGeometry, w: np.ndarray, transpose: bool) -> np.ndarray:
    """Canonical weights as a (T, G, ICg, OCg) view, or (T, G, OCg, ICg) with ``transpose``,
    still in the data's dtype: the kernels cast them tap by tap (:func:`convgrad.casts.astype`)."""
    taps = w.reshape(math.prod(g.kernel), g.icg, g.groups, g.ocg)
    return taps.transpose(0, 2, 3, 1) if transpose else taps.transpose(0, 2, 1, 3)


def _zero_sums(g: ConvGeometry, dtype: np.dtype, channels_first: bool) -> np.ndarray:
    """Zeroed (T, ICg, G, OCg) weights sums. For a 1x1 kernel on channels-first data they lie in
    OIX order in memory ((G, OCg, ICg); the GEMMs write either order), so that the OIX result
    NCX users ask for needs no transposition (3-5 ms for ResNet-50's 1M-value res5 layers)."""
    if math.prod(g.kernel) == 1 and channels_first:
        return np.zeros((g.groups, g.ocg, g.icg), dtype).transpose(2, 0, 1)[None]
    return np.zeros((math.prod(g.kernel), g.icg, g.groups, g.ocg), dtype)


def _without_frame(algorithm: str, g: ConvGeometry, src: np.ndarray, w: np.ndarray, shape: tuple[int, ...],
                   dtype: np.dtype, transpose: bool) -> np.ndarray:
    """Forward (``transpose=False``) or backward data of shape ``shape`` by an ``algorithm`` that
    needs no frame: an empty batch, depthwise loops, or NCX pointwise layers as one GEMM per
    image."""
    out = empty_like_data(shape, dtype, src, fill=algorithm == "empty")
    if algorithm == "depthwise":
        (depthwise.backward_data if transpose else depthwise.forward)(g, casts.astype(src, dtype), w, out)
    elif algorithm == "image_gemms":
        np.matmul(_image_rows(src), _tap_weights(g, w, transpose=transpose)[0, 0].astype(dtype, copy=False),
                  out=_image_rows(out))
    return out


class FastEngine:
    """Phase-frame GEMM engine (``engine="fast"``, the default)."""

    name = "fast"

    # -- planning -----------------------------------------------------------------------------
    @staticmethod
    def _frame_bytes(g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype) -> int:
        """Bytes per image of the frame buffers ``task`` allocates (none where the data itself
        serves as the frame: stride 1 without padding on the input side, no junk rows on the
        output side and, for backward data, no lead rows, in the accumulation dtype and the
        frame's memory order; the weights gradient of narrow inputs has no dy frame, only 16-bit NCX
        dy widened)."""
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

    def _images_per_chunk(self, g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype) -> int:
        """Images per batch chunk: frame buffers of at most ``CHUNK_BYTES`` and at most half the
        bytes of the op's inputs and output (so extra memory stays below 2x of them even when
        bf16/f16 data is widened to f32) or ``MIN_CHUNK_BYTES``; at least one image."""
        per_image = self._frame_bytes(g, frame, task, dtype)
        io_bytes = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * dtype.itemsize
        return max(1, min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, io_bytes // 2)) // max(1, per_image))

    def _batches(self, g: ConvGeometry, frame: Frame, task: str, dtype: np.dtype) -> Iterator[slice]:
        step = self._images_per_chunk(g, frame, task, dtype)
        for start in range(0, g.n, step):
            yield slice(start, min(g.n, start + step))

    def workspace_bytes(self, g: ConvGeometry, task: str, dtype: np.dtype) -> int:
        """Upper estimate of the extra memory ``task`` allocates beyond its inputs and result
        (for either data layout): one batch chunk of frame buffers (and of f16 data widened to
        f32), the row-block temporaries, the converted weights and, for bf16/f16, the f32 result
        before the API rounds it."""
        dtype, taps = np.dtype(dtype), math.prod(g.kernel)
        acc = compute_dtype(dtype)
        algorithm = _algorithm(g, task, acc, None, dtype)
        if algorithm == "jit":
            return jit.workspace_bytes(g, task, dtype)
        if algorithm == "direct":
            return direct.workspace_bytes(g, task, dtype, acc)
        if algorithm == "output_rows":
            return output_rows.workspace_bytes(g, task, dtype) + (
                math.prod(g.w_shape) * acc.itemsize if task == "backward_weights" and dtype != acc else 0)
        depth, width = (g.ocg, g.icg) if task == "backward_data" else (g.icg, g.ocg)
        per_gemm = kernels.taps_per_gemm(taps, depth, reduces=task == "backward_weights")
        widest = g.groups * max(per_gemm * depth, taps * width) * acc.itemsize
        spreads = task != "backward_weights" and kernels.spreads(taps, depth, width)
        result = math.prod(g.x_shape if task == "backward_data" else g.w_shape if task == "backward_weights"
                           else g.y_shape) * (acc.itemsize if dtype != acc else 0)
        estimates = []
        for channels_first in (False, True):
            frame = _frame(g, channels_first, task)
            images = min(max(g.n, 1), self._images_per_chunk(g, frame, task, dtype))
            rows = images * frame.image_rows + frame.max_shift(images)
            block_bytes = kernels.BLOCK_BYTES * (kernels.SPREAD_BLOCKS if spreads else 1)
            blocks = 3 * min(rows * widest, max(block_bytes, 256 * widest))
            widened = images * (math.prod(g.x_shape[1:]) + math.prod(g.y_shape[1:])) * acc.itemsize \
                if dtype == np.float16 else 0  # casts.to_f32 of the chunk before its frame copy
            estimates.append(images * self._frame_bytes(g, frame, task, dtype) + blocks + widened)
        return max(estimates) + 3 * taps * g.icg * g.oc * acc.itemsize + result

    # -- the three problems ---------------------------------------------------------------------
    def forward(self, g: ConvGeometry, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """y = conv(x, w): sum over offsets of shifted-row GEMMs into the frame rows of y."""
        dtype = compute_dtype(x.dtype)
        algorithm = _algorithm(g, "forward", dtype, (x,))
        if algorithm == "jit":
            return jit.forward(g, x, w)
        if algorithm == "direct":
            return direct.forward(g, x, w, dtype)
        if algorithm == "pointwise":
            y = np.empty(g.y_shape, x.dtype)
            pointwise.product(pointwise.sampled(g, x), casts.astype(w, dtype).reshape(g.ic, g.oc), y)
            return y
        if algorithm != "frame":
            return _without_frame(algorithm, g, x, w, g.y_shape, dtype, transpose=False)
        y = empty_like_data(g.y_shape, dtype, x, fill=True)
        frame = _frame(g, layout.channels_first(x), "forward")
        weights = _tap_weights(g, w, transpose=False)
        for batch in self._batches(g, frame, "forward", x.dtype):
            n, taps = batch.stop - batch.start, frame.taps(batch.stop - batch.start)
            srcs = frame.phase_input(x[batch], dtype)
            rows = frame.output_target(y[batch])
            kernels.accumulate(rows[:frame.span(n)], srcs, taps, weights, kernels.taps_per_gemm(len(taps), g.icg))
            frame.crop_output(rows, y[batch])
        return y

    def backward_data(self, g: ConvGeometry, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        """dx: per input phase, the sum over its offsets of GEMMs on dy shifted back by the offset."""
        dtype = compute_dtype(dy.dtype)
        algorithm = _algorithm(g, "backward_data", dtype, (dy,))
        if algorithm == "jit":
            return jit.backward_data(g, dy, w)
        if algorithm == "direct":
            return direct.backward_data(g, dy, w, dtype)
        if algorithm == "pointwise":
            every = g.out_size == g.in_size  # else zero where no output reads
            dx = (np.empty if every else np.zeros)(g.x_shape, dy.dtype)
            pointwise.product(dy, casts.astype(w, dtype).reshape(g.ic, g.oc).T, pointwise.sampled(g, dx))
            return dx
        if algorithm == "output_rows":
            return output_rows.backward_data(g, dy, w, dtype)
        if algorithm != "frame":
            return _without_frame(algorithm, g, dy, w, g.x_shape, dtype, transpose=True)
        frame = _frame(g, layout.channels_first(dy), "backward_data")
        weights = _tap_weights(g, w, transpose=True)
        scattered = len(weights) > 1 and g.icg <= SCATTER_CHANNELS[0] and g.ocg >= SCATTER_CHANNELS[1]
        # 16-bit data: the phase buffers' copy into dx rounds (once, to nearest even), so no f32 dx
        rounds = dy.dtype != dtype and not frame.input_is_frame
        dx = empty_like_data(g.x_shape, dy.dtype if rounds else dtype, dy,
                              fill=scattered or not (frame.input_is_frame or frame.covers_input))
        per_phase = [[k for k, p in enumerate(frame.tap_phase) if p == ph] for ph in range(len(frame.phases))]
        for batch in self._batches(g, frame, "backward_data", dy.dtype):
            n = batch.stop - batch.start
            if scattered:
                target = frame.input_target(dx[batch], dtype, zeroed=True)
                kernels.spread_scattered(target, weights, frame.taps(n), frame.output_grid(n), dy[batch])
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
                kernels.accumulate(out, [src], taps, own, kernels.taps_per_gemm(len(taps), g.ocg),
                                   live=(lead, lead + frame.span(n)))
            frame.scatter_input(target, dx[batch])
        return dx

    def backward_weights(self, g: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """dw[k] = sum over the frame rows of the shifted input rows times dy, per batch chunk."""
        dtype = compute_dtype(x.dtype)
        algorithm = _algorithm(g, "backward_weights", dtype, (x, dy))
        if algorithm == "jit":
            return jit.backward_weights(g, x, dy)
        if algorithm == "direct":
            return direct.backward_weights(g, x, dy, dtype)
        if algorithm == "pointwise":
            return pointwise.weights_gradient(pointwise.sampled(g, x), dy).reshape(g.w_shape)
        if algorithm == "output_rows":
            return output_rows.backward_weights(g, x, dy, dtype)
        dw = _zero_sums(g, dtype, layout.channels_first(x))
        if algorithm == "depthwise":
            depthwise.backward_weights(g, casts.astype(x, dtype), casts.astype(dy, dtype), dw)
        elif algorithm == "image_gemms":
            total = dw[0, :, 0]
            for xn, dyn in zip(_image_rows(x), _image_rows(dy)):
                if not blas.addmm(total, xn.T, dyn, beta=1.0):
                    total += xn.T @ dyn
        elif algorithm == "frame":
            frame = _frame(g, layout.channels_first(x), "backward_weights")
            per_gemm = kernels.taps_per_gemm(math.prod(g.kernel), g.icg, reduces=True)
            for batch in self._batches(g, frame, "backward_weights", x.dtype):
                n, taps = batch.stop - batch.start, frame.taps(batch.stop - batch.start)
                srcs = frame.phase_input(x[batch], dtype)
                if per_gemm > 1:
                    kernels.reduce_gathered(dw, srcs, taps, frame.output_grid(n), dy[batch], per_gemm)
                else:
                    kernels.reduce(dw, srcs, taps, frame.extended_output(dy[batch], dtype)[:frame.span(n)])
        return dw.reshape(g.w_shape)


register(FastEngine(), default=True)
