"""Gradients of geometries whose frame is mostly junk: GEMMs over the output positions only.

The frame (:mod:`.frame`) has ``Q = O + (K-1)*D // S`` positions per axis; a large dilation on a
small output (``O = 7, K = 3, D = 3``: Q = 13) makes most of its rows junk that backward data and
backward weights compute anyway (3.4x the FLOPs there). Here every GEMM has exactly the
``N * prod(O)`` output rows, and the taps are strided views of the zero-padded input
``P`` (padded size ``I + PB + PE``), tap ``k`` covering ``P[o*S + k*D]``:

- backward data (col2im): ``Z = dy @ [W_0^T | W_1^T | ...]`` per group, then
  ``dP[o*S + k*D] += Z_k[o]`` for each tap, and dx is the interior of dP;
- backward weights (im2col of a batch chunk): ``[dW_0; dW_1; ...] = [P[o*S + 0*D] | P[o*S + 1*D] | ...]^T @ dy``.

Chunks of images, or of output planes of one image (a large 3-D volume), bound the temporaries
(``CHUNK_BYTES`` of Z, or of the padded input and the taps).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ... import casts
from ...problem import ConvGeometry
from . import kernels

__all__ = ["JUNK_RATIO", "junk_heavy", "workspace_bytes", "backward_data", "backward_weights"]

#: Frame rows per output row from which each gradient runs here. Measured (f32, 2 cores): 1.3-3.5x
#: faster on dilated layers at 2-6x, 1.15-1.3x for the weights of 3-D U-Net layers at 1.7-1.9x;
#: slower on ResNet-50's 3x3 layers at 1.15-1.65x, where the frame's per-tap GEMMs win. Backward
#: data on the frame skips the first axis's border rows per tap (:func:`.kernels.accumulate`),
#: so it stays there longer: 1.15x faster than here on a 3-D U-Net layer at 1.87x.
JUNK_RATIO = {"backward_data": 1.9, "backward_weights": 1.66}
#: Bytes of the per-chunk temporaries (Z, or the padded input and its taps), at most; also at most
#: half the op's inputs + output (or ``MIN_CHUNK_BYTES``), so that the prod(K)-fold expansion never
#: costs more memory than the op's own arrays; at least one image.
CHUNK_BYTES = 16 << 20
MIN_CHUNK_BYTES = 1 << 20


def junk_heavy(g: ConvGeometry, frame_size: tuple[int, ...], task: str) -> bool:
    """Whether the frame of ``g`` (``frame_size`` positions per axis) has ``JUNK_RATIO[task]``
    times more rows than there are outputs."""
    return math.prod(frame_size) >= JUNK_RATIO[task] * max(1, math.prod(g.out_size))


def workspace_bytes(g: ConvGeometry, task: str, acc: np.dtype) -> int:
    """Upper estimate of the extra bytes of :func:`backward_data` (padded gradient, regrouped
    weights, one chunk of Z and of converted dy) or :func:`backward_weights` (one chunk of padded
    input, gathered taps and converted dy, the sums)."""
    padded, rows, taps = math.prod(_padded_size(g)), math.prod(g.out_size), math.prod(g.kernel)
    plane = rows // max(1, g.out_size[0])
    if task == "backward_data":
        n, planes = _chunk_size(g, plane * taps * g.ic * acc.itemsize, acc)
        return (g.n * padded * g.ic + math.prod(g.w_shape) + n * planes * plane * (taps * g.ic + 2 * g.oc)) \
            * acc.itemsize
    n, planes = _chunk_size(g, plane * taps * g.ic * acc.itemsize, acc, padded * g.ic * acc.itemsize)
    return (n * (padded * g.ic + planes * plane * (taps * g.ic + 2 * g.oc)) + 3 * math.prod(g.w_shape)) \
        * acc.itemsize


def _padded_size(g: ConvGeometry) -> tuple[int, ...]:
    return tuple(i + b + e for i, b, e in zip(g.in_size, g.pads_begin, g.pads_end))


def _interior(g: ConvGeometry) -> tuple[slice, ...]:
    return (slice(None), *(slice(b, b + i) for b, i in zip(g.pads_begin, g.in_size)), slice(None))


def _taps(g: ConvGeometry, planes: slice) -> Iterator[tuple[slice, ...]]:
    """Per kernel offset (C order), the slices of the padded input its outputs in ``planes`` (a
    range of the first output axis) read."""
    first = [planes.start, *([0] * (g.rank - 1))]
    last = [planes.stop, *g.out_size[1:]]
    for offset in itertools.product(*(range(k) for k in g.kernel)):
        yield (slice(None), *(slice(k * d + a * s, k * d + s * (b - 1) + 1, s)
                              for k, d, s, a, b in zip(offset, g.dilations, g.strides, first, last)), slice(None))


def _chunk_size(g: ConvGeometry, plane_bytes: int, acc: np.dtype, image_bytes: int = 0) -> tuple[int, int]:
    """(images, output planes) per chunk of temporaries of ``plane_bytes`` per output plane (one
    index of the first output axis of one image) and ``image_bytes`` per image: whole images while
    one fits in ``CHUNK_BYTES`` and in half the op's inputs + output (or ``MIN_CHUNK_BYTES``), else
    runs of planes of one image (a single large 3-D volume); at least one plane."""
    io_bytes = (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * acc.itemsize
    budget = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, io_bytes // 2))
    planes = max(1, g.out_size[0])
    if image_bytes + planes * plane_bytes <= budget:
        return max(1, budget // max(1, image_bytes + planes * plane_bytes)), planes
    return 1, max(1, (budget - image_bytes) // max(1, plane_bytes))


def _chunks(g: ConvGeometry, plane_bytes: int, acc: np.dtype,
            image_bytes: int = 0) -> Iterator[tuple[slice, list[slice]]]:
    """Batch chunks, each with its runs of output planes (see :func:`_chunk_size`)."""
    n, planes = _chunk_size(g, plane_bytes, acc, image_bytes)
    for start in range(0, g.n, n):
        yield slice(start, min(g.n, start + n)), [slice(a, min(g.out_size[0], a + planes))
                                                  for a in range(0, g.out_size[0], planes)]


def _rows(a: np.ndarray, groups: int, dtype: np.dtype) -> np.ndarray:
    """(n, *O, G*C) data as (G, n*prod(O), C) matrices in ``dtype``."""
    a = casts.astype(a, dtype)
    return a.reshape(-1, groups, a.shape[-1] // groups).transpose(1, 0, 2)


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """dx (canonical, a view of the padded gradient) from ``dy`` in ``dtype``; col2im."""
    taps, plane = math.prod(g.kernel), math.prod(g.out_size[1:])
    wt = np.ascontiguousarray(w.reshape(taps, g.icg, g.groups, g.ocg).transpose(2, 3, 0, 1), dtype=dtype)
    wt = wt.reshape(g.groups, g.ocg, taps * g.icg)
    dxp = np.zeros((g.n, *_padded_size(g), g.ic), dtype)
    buf = None  # Z of every chunk (the first is the largest): never two alive at once
    for batch, runs in _chunks(g, plane * taps * g.ic * dtype.itemsize, dtype):
        for planes in runs:
            part = dy[batch][:, planes]
            size = math.prod(part.shape[:-1]) * taps * g.ic
            buf = np.empty(size, dtype) if buf is None else buf
            z = np.matmul(_rows(part, g.groups, dtype), wt, out=buf[:size].reshape(g.groups, -1, taps * g.icg))
            z = z.reshape(g.groups, *part.shape[:-1], taps, g.icg)
            z = z.transpose(*range(1, g.rank + 2), g.rank + 2, 0, g.rank + 3)  # (n, *O, taps, G, ICg)
            for t, where in enumerate(_taps(g, planes)):
                target = dxp[batch][where]
                target.reshape(*target.shape[:-1], g.groups, g.icg)[...] += z[..., t, :, :]
    return dxp[_interior(g)]


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """dw (canonical) from ``x`` and ``dy`` in ``dtype``: per chunk the taps gathered side by
    side (im2col of the chunk), then one GEMM per group summing into dw (inside BLAS where it
    can: :func:`.kernels.product`)."""
    taps, padded, plane = math.prod(g.kernel), _padded_size(g), math.prod(g.out_size[1:])
    dw = np.zeros((taps, g.icg, g.groups, g.ocg), dtype)
    sums = dw.transpose(2, 0, 1, 3).reshape(g.groups, taps * g.icg, g.ocg)  # a view of dw
    scratch = np.empty(sums.shape, dtype)  # for products BLAS cannot sum in place
    buf = None  # the gathered taps of every chunk: never two alive at once
    for batch, runs in _chunks(g, plane * taps * g.ic * dtype.itemsize, dtype,
                               math.prod(padded) * g.ic * dtype.itemsize):
        n = batch.stop - batch.start
        xp = np.zeros((n, *padded, g.ic), dtype)
        xp[_interior(g)] = x[batch]
        for planes in runs:
            part = dy[batch][:, planes]
            size = math.prod(part.shape[:-1]) * taps * g.ic
            buf = np.empty(size, dtype) if buf is None else buf  # the first chunk is the largest
            col = buf[:size].reshape(*part.shape[:-1], g.groups, taps, g.icg)
            for t, where in enumerate(_taps(g, planes)):
                view = xp[where]
                col[..., t, :] = view.reshape(*view.shape[:-1], g.groups, g.icg)
            lhs = col.reshape(-1, g.groups, taps * g.icg).transpose(1, 2, 0)
            kernels.product(sums, lhs, _rows(part, g.groups, dtype), scratch)
    return dw.reshape(g.w_shape)
