"""Gradients as GEMMs over the output positions only, the taps gathered (im2col) or scattered (col2im).

The frame (:mod:`.frame`) has ``Q = O + (K-1)*D // S`` positions per axis; a large dilation on a
small output (``O = 7, K = 3, D = 3``: Q = 13) makes most of its rows junk that backward data and
backward weights compute anyway (3.4x the FLOPs there). Here every GEMM has exactly the
``N * prod(O)`` output rows, and tap ``k`` of output ``o`` is the input at ``p = o*S + k*D - PB``
(zero in the padding; compiled loops: :mod:`.columns`):

- backward data (col2im): ``Z = dy @ [W_0^T | W_1^T | ...]`` per group, then ``dx[p] += Z_k[o]``
  for each tap inside dx;
- backward weights (im2col of a chunk of rows): ``[dW_0; dW_1; ...] += [x[p_0] | x[p_1] | ...]^T @ dy``.

Both also serve gradients without junk once the channels are wide: one GEMM per chunk with
``prod(K)*ICg`` output columns (data) or rows (weights), where the frame's per-tap GEMMs have
``ICg``. This is the ``gemm`` strategy's variant ``output_rows`` (:mod:`.gemm` selects it).

Chunks of images, or runs of output rows of one image (a large 3-D volume), bound the
temporaries to a ``budget`` of bytes (of Z, or of the gathered taps: :func:`.gemm.chunk_budget`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ... import casts, layout
from ...dtypes import compute_dtype
from ...problem import ConvGeometry
from . import columns, kernels
from .geometry import tap_weights
from .tuning import TUNING

__all__ = ["workspace_bytes", "backward_data", "backward_weights"]


def workspace_bytes(g: ConvGeometry, task: str, data: np.dtype, budget: int) -> int:
    """Upper estimate of the extra bytes for ``data`` of the op's dtype, in its accumulation dtype:
    :func:`backward_data` converts the weights (or a block) and holds one chunk of Z and of
    converted dy (and for bf16/f16, the chunk's sums and their rounding into dx); :func:`backward_weights` one chunk of
    the input, its gathered taps and converted dy, and three weights' worth (the sums, NumPy's
    product temporary where BLAS cannot accumulate (many groups), one spare)."""
    acc = compute_dtype(data)
    image, taps = math.prod(g.in_size) * g.ic * acc.itemsize, math.prod(g.kernel)
    if task == "backward_data":
        sums = image if data.itemsize < acc.itemsize else 0
        share = max(_block_size(g, data, acc, total) / total for total in (taps, max(1, g.ocg)))
        worst = 0
        for block in (math.ceil(share * taps), taps):  # Z per block of taps (XIO weights), or all (OIX)
            n, rows = _chunk_size(g, block * g.ic * acc.itemsize, budget, sums)
            worst = max(worst, 2 * n * sums + rows * (block * g.ic + 2 * g.oc) * acc.itemsize)
        return worst + math.ceil(share * math.prod(g.w_shape)) * acc.itemsize
    n, rows = _chunk_size(g, taps * g.ic * acc.itemsize, budget, image)
    return n * image + (rows * (taps * g.ic + 2 * g.oc) + 3 * math.prod(g.w_shape)) * acc.itemsize


def _chunk_size(g: ConvGeometry, row_bytes: int, budget: int, image_bytes: int = 0) -> tuple[int, int]:
    """(images, output rows) per chunk of temporaries of ``row_bytes`` per output row and
    ``image_bytes`` per image: whole images while one fits in ``budget`` bytes, else runs of rows
    of one image (a single large 3-D volume) in what the image leaves of that budget, or half of it."""
    rows = max(1, math.prod(g.out_size))
    if image_bytes + rows * row_bytes <= budget:
        images = max(1, budget // max(1, image_bytes + rows * row_bytes))
        return images, images * rows
    return 1, max(1, max(budget // 2, budget - image_bytes) // max(1, row_bytes))


def _chunks(g: ConvGeometry, row_bytes: int, budget: int,
            image_bytes: int = 0) -> Iterator[tuple[slice, list[tuple[int, int]]]]:
    """Batch chunks, each with its runs (first, last) of its images' output rows (see
    :func:`_chunk_size`)."""
    n, rows = _chunk_size(g, row_bytes, budget, image_bytes)
    for start in range(0, g.n, n):
        batch = slice(start, min(g.n, start + n))
        total = (batch.stop - batch.start) * math.prod(g.out_size)
        yield batch, [(a, min(total, a + rows)) for a in range(0, total, rows)]


def _rows(a: np.ndarray, groups: int, dtype: np.dtype) -> np.ndarray:
    """(n, *O, G*C) data as (G, n*prod(O), C) matrices in ``dtype``."""
    a = casts.astype(a, dtype)
    return a.reshape(-1, groups, a.shape[-1] // groups).transpose(1, 0, 2)


def _batches(g: ConvGeometry, dy: np.ndarray, dtype: np.dtype, budget: int, image_bytes: int = 0, taps: int = 0
             ) -> Iterator[tuple[slice, Iterator[tuple[int, np.ndarray, np.ndarray]]]]:
    """Per batch chunk (see :func:`_chunks`) its slice and its runs: per run, its first output
    row in the batch, its dy rows as (G, rows, OCg) in ``dtype``, and a flat ``dtype`` buffer for
    ``taps`` (default all) of its rows' taps (rows * taps * IC values), one buffer for all runs
    (the first is the largest)."""
    row = (taps or math.prod(g.kernel)) * g.ic
    buf: list[np.ndarray] = []

    def runs(flat: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for first, last in spans:
            buf[:] = buf or [np.empty((last - first) * row, dtype)]
            yield first, _rows(flat[first:last], g.groups, dtype), buf[0][:(last - first) * row]

    for batch, spans in _chunks(g, row * dtype.itemsize, budget, image_bytes):
        yield batch, runs(dy[batch].reshape(-1, g.oc), spans)  # a view for one image, or C-ordered data


def _blocks(g: ConvGeometry, data: np.dtype, dtype: np.dtype, total: int) -> list[tuple[int, int]]:
    """``range(total)`` (taps, or output channels) in equal blocks (first, last) of weights that
    are widened to ``dtype`` together: one block, except for bf16/f16 weights whose f32 copy would
    take more bytes than dx and dy (ResNet-50's res5 3x3 layers: 9 MiB on 4 MiB); then as many
    blocks as keep each within that."""
    size = _block_size(g, data, dtype, total)
    return [(k, min(total, k + size)) for k in range(0, total, size)] or [(0, 0)]


def _block_size(g: ConvGeometry, data: np.dtype, dtype: np.dtype, total: int) -> int:
    """The size of the (first, largest) block of :func:`_blocks`, in closed form."""
    widened = math.prod(g.w_shape) * dtype.itemsize
    limit = (math.prod(g.x_shape) + math.prod(g.y_shape)) * data.itemsize
    count = 1 if data.itemsize >= dtype.itemsize else min(total, -(-widened // max(1, limit)))
    return -(-total // max(1, count))


def _oix(w: np.ndarray) -> bool:
    """Whether canonical (*K, ICg, OC) weights are a view of OIX memory (taps innermost)."""
    return not w.flags.c_contiguous and layout.weights_from_canonical(w, "OIX").flags.c_contiguous


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dtype: np.dtype, budget: int,
                  rounded: bool = False) -> np.ndarray:
    """dx (canonical, contiguous) from ``dy`` in ``dtype``; col2im, Z's columns in the weights'
    memory order (taps outer for XIO, inner for OIX: no copy of either). Weights widened in blocks
    (:func:`_blocks`) take blocks of taps (XIO), each scattered in turn, or of output channels
    (OIX), their products summed in Z: contiguous in memory either way. For bf16/f16 ``dy`` and
    ``rounded`` the sums of each batch chunk are rounded into dx (in dy's dtype) once the chunk is
    done."""
    narrow, taps_inner, taps = rounded and dy.dtype.itemsize < dtype.itemsize, _oix(w), math.prod(g.kernel)
    # the weights as they lie in memory: (G, OCg, ICg, taps) for OIX, else (taps, ICg, G, OCg)
    memory = layout.weights_from_canonical(w, "OIX").reshape(g.groups, g.ocg, g.icg, taps) if taps_inner \
        else tap_weights(g, w).transpose(0, 2, 1, 3)
    tap_blocks = [(0, taps)] if taps_inner else _blocks(g, dy.dtype, dtype, taps)
    channel_blocks = _blocks(g, dy.dtype, dtype, g.ocg) if taps_inner else [(0, g.ocg)]

    def weights(t0: int, t1: int, o0: int, o1: int) -> np.ndarray:
        """(G, OCg, columns) of one block, widened along memory (once for one block, per run for
        several): a view of the weights in f32/f64 (BLAS takes it as it is)."""
        block = casts.astype(np.ascontiguousarray(memory[:, o0:o1] if taps_inner else memory[t0:t1]), dtype)
        return (block if taps_inner else block.transpose(2, 3, 0, 1)).reshape(g.groups, o1 - o0, -1)

    whole = weights(*tap_blocks[0], *channel_blocks[0]) if len(tap_blocks) == len(channel_blocks) == 1 else None
    dx = (np.empty if narrow else np.zeros)(g.x_shape, dy.dtype if narrow else dtype)
    image = math.prod(g.in_size) * g.ic * dtype.itemsize if narrow else 0
    for batch, runs in _batches(g, dy, dtype, budget, image, max(t1 - t0 for t0, t1 in tap_blocks)):
        sums = np.zeros((batch.stop - batch.start, *g.x_shape[1:]), dtype) if narrow else dx[batch]
        for first, rows, buf in runs:
            for t0, t1 in tap_blocks:
                z = buf[:rows.shape[1] * g.groups * (t1 - t0) * g.icg].reshape(g.groups, -1, (t1 - t0) * g.icg)
                for o0, o1 in channel_blocks:
                    wt = weights(t0, t1, o0, o1) if whole is None else whole
                    kernels.product(z, rows[..., o0:o1], wt, accumulate=o0 > 0)
                columns.scatter(z, sums, g, first, t0, taps_inner)
        if narrow:
            casts.copy_into(dx[batch], sums)
        sums = None  # freed before the next chunk's
    return dx


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dtype: np.dtype, budget: int) -> np.ndarray:
    """dw (canonical) from ``x`` and ``dy`` in ``dtype``: per chunk the taps gathered side by
    side (im2col of the chunk), then one GEMM per group summing into dw (inside BLAS where it
    can: :func:`.kernels.product`). For channels-first (NCX) data with at most ``TUNING.oix_rows``
    output rows per output channel dw lies in OIX order in memory, the taps gathered innermost
    (``dw = dy^T @ columns``), so that the OIX result NCX users ask for needs no transposition."""
    taps = math.prod(g.kernel)
    taps_inner = layout.channels_first(x) and g.n * math.prod(g.out_size) <= TUNING.oix_rows * g.oc
    if taps_inner:
        dw = np.zeros((g.groups, g.ocg, g.icg, taps), dtype)
        sums, canonical = dw.reshape(g.groups, g.ocg, -1), dw.transpose(3, 2, 0, 1)
    else:
        dw = np.zeros((taps, g.icg, g.groups, g.ocg), dtype)
        sums, canonical = dw.transpose(2, 0, 1, 3).reshape(g.groups, taps * g.icg, g.ocg), dw  # views of dw
    for batch, runs in _batches(g, dy, dtype, budget, math.prod(g.in_size) * g.ic * dtype.itemsize):
        # the batch of x, contiguous in dtype (a copy for NCX or 16-bit data)
        images = np.ascontiguousarray(casts.astype(x[batch], dtype))
        for first, rows, buf in runs:
            col = buf.reshape(-1, g.groups, taps * g.icg)
            columns.gather(images, col, g, first, taps_inner)
            if taps_inner:
                kernels.product(sums, rows.transpose(0, 2, 1), col.transpose(1, 0, 2), True)
            else:
                kernels.product(sums, col.transpose(1, 2, 0), rows, True)
        images = None  # freed before the next chunk's copy
    return canonical.reshape(g.w_shape)
