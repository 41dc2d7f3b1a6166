"""Gradients as GEMMs over the output positions only, the taps gathered (im2col) or scattered (col2im).

The frame (:mod:`.frame`) has ``Q = O + (K-1)*D // S`` positions per axis; a large dilation on a
small output (``O = 7, K = 3, D = 3``: Q = 13) makes most of its rows junk that backward data and
backward weights compute anyway (3.4x the FLOPs there). Here every GEMM has exactly the
``N * prod(O)`` output rows, and tap ``k`` of output ``o`` is the zero-padded input ``P``
(padded size ``I + PB + PE``) at ``o*S + k*D`` (compiled loops: :mod:`.columns`):

- backward data (col2im): ``Z = dy @ [W_0^T | W_1^T | ...]`` per group, then
  ``dP[o*S + k*D] += Z_k[o]`` for each tap, and dx is the interior of dP;
- backward weights (im2col of a chunk of rows): ``[dW_0; dW_1; ...] += [P[o*S + 0*D] | P[o*S + 1*D] | ...]^T @ dy``.

Backward weights runs here also without junk once the channels are wide (:func:`applies`): its
one GEMM per chunk has ``prod(K)*ICg`` output rows where the frame's per-tap GEMMs have ``ICg``.

Chunks of images, or runs of output rows of one image (a large 3-D volume), bound the
temporaries (``CHUNK_BYTES`` of Z, or of the gathered taps).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ... import casts
from ...problem import ConvGeometry
from . import columns, kernels

__all__ = ["JUNK_RATIO", "WEIGHTS_CHANNELS", "applies", "workspace_bytes", "backward_data", "backward_weights"]

#: Frame rows per output row from which each gradient runs here. Measured (f32, 2 cores): 1.3-3.5x
#: faster on dilated layers at 2-6x; backward data slower on ResNet-50's 3x3 layers at 1.07-1.65x
#: (1.1-1.4x), where the frame's per-tap GEMMs win, and on a 3-D U-Net layer at 1.87x (1.15x):
#: on the frame it skips the first axis's border rows per tap (:func:`.kernels.accumulate`).
JUNK_RATIO = {"backward_data": 1.9, "backward_weights": 1.66}
#: (ICg, OCg) from which backward weights with several taps runs here whatever the junk. Measured
#: against the frame (f32, NXC): 1.1-1.35x on ResNet-50's 3x3 layers, 1.04-1.45x on 3-D U-Net's
#: from 32 input channels; 0.8x with 8 input or 16 output channels, where the gather costs more
#: than the narrow GEMM it feeds, about even at 16 inputs or 32 outputs.
WEIGHTS_CHANNELS = (32, 64)
#: Bytes of the per-chunk temporaries (Z, or the padded input and its taps), at most; also at most
#: half the op's inputs + output (or ``MIN_CHUNK_BYTES``), so that the prod(K)-fold expansion never
#: costs more memory than the op's own arrays; at least one image.
CHUNK_BYTES = 16 << 20
MIN_CHUNK_BYTES = 1 << 20


def applies(g: ConvGeometry, frame_size: tuple[int, ...], task: str) -> bool:
    """Whether ``task`` (a gradient) on ``g`` runs here: its frame (``frame_size`` positions per
    axis) has ``JUNK_RATIO[task]`` times more rows than there are outputs, or it is backward
    weights of a kernel with several taps and at least ``WEIGHTS_CHANNELS`` channels per group."""
    if math.prod(frame_size) >= JUNK_RATIO[task] * max(1, math.prod(g.out_size)):
        return True
    wide = g.icg >= WEIGHTS_CHANNELS[0] and g.ocg >= WEIGHTS_CHANNELS[1]
    return task == "backward_weights" and math.prod(g.kernel) > 1 and wide


def workspace_bytes(g: ConvGeometry, task: str, acc: np.dtype) -> int:
    """Upper estimate of the extra bytes of :func:`backward_data` (padded gradient, regrouped
    weights, one chunk of Z and of converted dy) or :func:`backward_weights` (one chunk of padded
    input, gathered taps and converted dy, the sums)."""
    padded, taps = math.prod(_padded_size(g)), math.prod(g.kernel)
    if task == "backward_data":
        _, rows = _chunk_size(g, taps * g.ic * acc.itemsize, acc)
        return (g.n * padded * g.ic + math.prod(g.w_shape) + rows * (taps * g.ic + 2 * g.oc)) * acc.itemsize
    n, rows = _chunk_size(g, taps * g.ic * acc.itemsize, acc, padded * g.ic * acc.itemsize)
    return (n * padded * g.ic + rows * (taps * g.ic + 2 * g.oc) + 3 * math.prod(g.w_shape)) * acc.itemsize


def _padded_size(g: ConvGeometry) -> tuple[int, ...]:
    return tuple(i + b + e for i, b, e in zip(g.in_size, g.pads_begin, g.pads_end))


def _interior(g: ConvGeometry) -> tuple[slice, ...]:
    return (slice(None), *(slice(b, b + i) for b, i in zip(g.pads_begin, g.in_size)), slice(None))


def _padded(g: ConvGeometry, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x`` (n, *I, C) zero-padded, contiguous in ``dtype``: ``x`` itself if it already is."""
    if not any(g.pads_begin) and not any(g.pads_end) and x.dtype == dtype and x.flags.c_contiguous:
        return x
    xp = np.zeros((x.shape[0], *_padded_size(g), g.ic), dtype)
    xp[_interior(g)] = x
    return xp


def _chunk_size(g: ConvGeometry, row_bytes: int, acc: np.dtype, image_bytes: int = 0) -> tuple[int, int]:
    """(images, output rows) per chunk of temporaries of ``row_bytes`` per output row and
    ``image_bytes`` per image: whole images while one fits in ``CHUNK_BYTES`` and in half the op's
    inputs + output (or ``MIN_CHUNK_BYTES``), else runs of rows of one image (a single large 3-D
    volume) in what the image leaves of that budget, or half of it."""
    io_bytes = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * acc.itemsize
    budget = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, io_bytes // 2))
    rows = max(1, math.prod(g.out_size))
    if image_bytes + rows * row_bytes <= budget:
        images = max(1, budget // max(1, image_bytes + rows * row_bytes))
        return images, images * rows
    return 1, max(1, max(budget // 2, budget - image_bytes) // max(1, row_bytes))


def _chunks(g: ConvGeometry, row_bytes: int, acc: np.dtype,
            image_bytes: int = 0) -> Iterator[tuple[slice, list[tuple[int, int]]]]:
    """Batch chunks, each with its runs (first, last) of its images' output rows (see
    :func:`_chunk_size`)."""
    n, rows = _chunk_size(g, row_bytes, acc, image_bytes)
    for start in range(0, g.n, n):
        batch = slice(start, min(g.n, start + n))
        total = (batch.stop - batch.start) * math.prod(g.out_size)
        yield batch, [(a, min(total, a + rows)) for a in range(0, total, rows)]


def _rows(a: np.ndarray, groups: int, dtype: np.dtype) -> np.ndarray:
    """(n, *O, G*C) data as (G, n*prod(O), C) matrices in ``dtype``."""
    a = casts.astype(a, dtype)
    return a.reshape(-1, groups, a.shape[-1] // groups).transpose(1, 0, 2)


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """dx (canonical, a view of the padded gradient) from ``dy`` in ``dtype``; col2im."""
    taps = math.prod(g.kernel)
    wt = np.ascontiguousarray(w.reshape(taps, g.icg, g.groups, g.ocg).transpose(2, 3, 0, 1), dtype=dtype)
    wt = wt.reshape(g.groups, g.ocg, taps * g.icg)
    dxp = np.zeros((g.n, *_padded_size(g), g.ic), dtype)
    buf = None  # Z of every chunk (the first is the largest): never two alive at once
    for batch, runs in _chunks(g, taps * g.ic * dtype.itemsize, dtype):
        flat = dy[batch].reshape(-1, g.oc)  # a view for one image, or C-ordered data
        for first, last in runs:
            size = (last - first) * taps * g.ic
            buf = np.empty(size, dtype) if buf is None else buf
            z = np.matmul(_rows(flat[first:last], g.groups, dtype), wt,
                          out=buf[:size].reshape(g.groups, -1, taps * g.icg))
            columns.scatter(z, dxp[batch], g, first)
    return dxp[_interior(g)]


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """dw (canonical) from ``x`` and ``dy`` in ``dtype``: per chunk the taps gathered side by
    side (im2col of the chunk), then one GEMM per group summing into dw (inside BLAS where it
    can: :func:`.kernels.product`)."""
    taps, padded = math.prod(g.kernel), _padded_size(g)
    dw = np.zeros((taps, g.icg, g.groups, g.ocg), dtype)
    sums = dw.transpose(2, 0, 1, 3).reshape(g.groups, taps * g.icg, g.ocg)  # a view of dw
    scratch = np.empty(sums.shape, dtype)  # for products BLAS cannot sum in place
    buf = None  # the gathered taps of every chunk: never two alive at once
    for batch, runs in _chunks(g, taps * g.ic * dtype.itemsize, dtype, math.prod(padded) * g.ic * dtype.itemsize):
        xp = _padded(g, x[batch], dtype)
        flat = dy[batch].reshape(-1, g.oc)  # a view for one image, or C-ordered data
        for first, last in runs:
            size = (last - first) * taps * g.ic
            buf = np.empty(size, dtype) if buf is None else buf  # the first chunk is the largest
            col = buf[:size].reshape(last - first, g.groups, taps * g.icg)
            columns.gather(xp, col, g, first)
            kernels.product(sums, col.transpose(1, 2, 0), _rows(flat[first:last], g.groups, dtype), scratch)
    return dw.reshape(g.w_shape)
