"""Pointwise layers (1x1, no padding, one group, any stride) on bf16/f16 data: the ``gemm``
strategy's variant ``pointwise``.

Such a layer is one GEMM over the sampled positions ``x_s = x[:, ::S]`` (all of x for stride 1):
``y = x_s @ W``, ``dx_s = dy @ W^T`` (dx zero elsewhere), ``dW = x_s^T @ dy``. It costs little
next to the conversions around it: widening whole inputs to f32 and rounding a whole f32 result
back would each add a pass over memory. Here the rows are taken in
cache-sized blocks (row ranges of contiguous data, else runs of whole images): a block is widened
into an f32 buffer, goes through the GEMM, and its result is rounded (to nearest even) into the
output while still in cache; the weights gradient sums the blocks' products in f32. Extra
memory: two blocks and the f32 weights (:func:`.gemm.workspace_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ... import casts
from ...problem import ConvGeometry
from . import blas
from .tuning import TUNING

__all__ = ["sampled", "product", "weights_gradient"]


def sampled(g: ConvGeometry, x: np.ndarray) -> np.ndarray:
    """The input positions the layer reads, ``x[:, ::S]`` cut to the output size: (N, *O, C)."""
    return x[(slice(None), *(slice(0, s * (o - 1) + 1, s) for s, o in zip(g.strides, g.out_size)), slice(None))]


def _blocks(arrays: tuple[np.ndarray, ...], width: int, block_bytes: int) -> Iterator[tuple[np.ndarray, ...]]:
    """The same blocks of rows of every (N, *X, C_i) array (one X): flat row ranges if all are
    C-contiguous, else runs of whole images; about ``block_bytes`` of f32 rows ``width`` wide."""
    step = max(TUNING.min_block_rows, block_bytes // (4 * max(1, width)))
    if all(a.flags.c_contiguous for a in arrays):
        flat = [a.reshape(-1, a.shape[-1]) for a in arrays]
        for start in range(0, flat[0].shape[0], step):
            yield tuple(f[start:start + step] for f in flat)
    else:
        images = max(1, step // max(1, math.prod(arrays[0].shape[1:-1])))
        for start in range(0, arrays[0].shape[0], images):
            yield tuple(a[start:start + images] for a in arrays)


def _fit(buffer: np.ndarray | None, size: int) -> np.ndarray:
    """``buffer`` if it holds ``size`` f32 values, else a new one (allocated once per size)."""
    return buffer if buffer is not None and buffer.size >= size else np.empty(size, np.float32)


def _wide(buffer: np.ndarray | None, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``block`` widened into the front of a flat f32 buffer, as (rows, C), and that buffer."""
    rows = math.prod(block.shape[:-1])
    buffer = _fit(buffer, rows * block.shape[-1])
    wide = buffer[:rows * block.shape[-1]].reshape(*block.shape)
    casts.copy_into(wide, block)
    return wide.reshape(rows, block.shape[-1]), buffer


def product(src: np.ndarray, mat: np.ndarray, out: np.ndarray, block_bytes: int) -> None:
    """``out = src @ mat`` for (N, *O, K) ``src`` rows and (N, *O, M) ``out`` (views allowed) in
    bf16/f16, ``mat`` (K, M) f32, block by block."""
    m = mat.shape[1]
    src_buf = out_buf = None
    for src_block, out_block in _blocks((src, out), mat.shape[0] + m, block_bytes):
        wide, src_buf = _wide(src_buf, src_block)
        out_buf = _fit(out_buf, wide.shape[0] * m)
        result = np.matmul(wide, mat, out=out_buf[:wide.shape[0] * m].reshape(wide.shape[0], m))
        casts.copy_into(out_block, result.reshape(out_block.shape))


def weights_gradient(x: np.ndarray, dy: np.ndarray, block_bytes: int) -> np.ndarray:
    """``x`` rows^T @ ``dy`` rows, (IC, OC) in f32, block by block (``x`` may be a sampled view)."""
    x_buf = dy_buf = None
    dw = np.zeros((x.shape[-1], dy.shape[-1]), np.float32)
    for x_block, dy_block in _blocks((x, dy), x.shape[-1] + dy.shape[-1], block_bytes):
        (xw, x_buf), (dyw, dy_buf) = _wide(x_buf, x_block), _wide(dy_buf, dy_block)
        if not blas.addmm(dw, xw.T, dyw):
            dw += xw.T @ dyw
    return dw
