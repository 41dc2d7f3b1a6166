"""Pointwise layers (1x1, stride 1, no padding, one group) on bf16/f16 channels-last data.

Such a layer is one GEMM over the rows of the data, ``y = x @ W``, ``dx = dy @ W^T``,
``dW = x^T @ dy``, and costs little next to the conversions around it: widening the whole input
to f32 and rounding a whole f32 result back would each add a pass over memory (1.5-2.3x our f32
time). Here the rows are taken in cache-sized blocks: a block is widened into an f32 buffer, goes
through the GEMM, and its result is rounded (to nearest even) into the output while still in
cache; the weights gradient sums the blocks' products in f32. Extra memory: two blocks and the
f32 weights (within the frame path's estimate, which ``workspace_bytes`` reports).
"""

from __future__ import annotations

import math

import numpy as np

from ... import fp16
from ...dtypes import bfloat16
from ...problem import ConvGeometry
from . import blas

__all__ = ["BLOCK_BYTES", "applies", "product", "weights_gradient"]

#: Bytes of the f32 block buffers (input and output rows together).
BLOCK_BYTES = 4 << 20


def applies(g: ConvGeometry, *data: np.ndarray) -> bool:
    """Whether ``g`` is pointwise with one group and every array of ``data`` bf16/f16 rows as they
    lie (C-contiguous canonical (N, *X, C), i.e. channels-last)."""
    return (g.groups == 1 and math.prod(g.kernel) == 1 and all(s == 1 for s in g.strides)
            and not any(g.pads_begin) and not any(g.pads_end)
            and all(a.dtype in (bfloat16, np.float16) and a.flags.c_contiguous for a in data))


def _block_rows(width: int) -> int:
    return max(256, BLOCK_BYTES // (4 * max(1, width)))


def product(src: np.ndarray, mat: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """``src`` rows (..., K) @ ``mat`` (K, M, f32) into a new array of ``out_shape`` (..., M) in
    ``src``'s dtype, block by block."""
    rows, out = src.reshape(-1, src.shape[-1]), np.empty(out_shape, src.dtype)
    out_rows = out.reshape(-1, out_shape[-1])
    step = _block_rows(mat.shape[0] + mat.shape[1])
    wide, result = np.empty((step, mat.shape[0]), np.float32), np.empty((step, mat.shape[1]), np.float32)
    for a in range(0, rows.shape[0], step):
        b = min(rows.shape[0], a + step)
        fp16.copy_into(wide[:b - a], rows[a:b])
        np.matmul(wide[:b - a], mat, out=result[:b - a])
        fp16.copy_into(out_rows[a:b], result[:b - a])
    return out


def weights_gradient(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``x`` rows^T @ ``dy`` rows, (IC, OC) in f32, block by block."""
    xr, dyr = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    step = _block_rows(xr.shape[1] + dyr.shape[1])
    xw, dyw = np.empty((step, xr.shape[1]), np.float32), np.empty((step, dyr.shape[1]), np.float32)
    dw = np.zeros((xr.shape[1], dyr.shape[1]), np.float32)
    for a in range(0, xr.shape[0], step):
        b = min(xr.shape[0], a + step)
        fp16.copy_into(xw[:b - a], xr[a:b])
        fp16.copy_into(dyw[:b - a], dyr[a:b])
        if not blas.addmm(dw, xw[:b - a].T, dyw[:b - a]):
            dw += xw[:b - a].T @ dyw[:b - a]
    return dw
