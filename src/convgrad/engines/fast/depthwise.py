"""Depthwise kernels (one input and one output channel per group): compiled multiply-adds.

The same tap sums as :mod:`.kernels` with a per-channel weight instead of a matrix::

    out[m, c] = sum_t src[p_t, m + off_t, c] * w[t, c]        (forward, backward data)
    dw[t, c]  = sum_m src[p_t, m + off_t, c] * dy[m, c]        (backward weights)

There is no GEMM to hand to BLAS, and NumPy needs a temporary and two passes per tap (2-5 GFLOP/s
on the reference machine); these loops, compiled by numba, run the taps of a cache-sized row
block back to back, vectorised over channels and parallel over blocks (about 5-10x faster).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

__all__ = ["accumulate", "reduce"]

#: Bytes of one row block (kept in the L1/L2 cache while all taps run over it).
BLOCK_BYTES = 64 << 10
_FASTMATH = {"reassoc", "contract"}  # vectorised sums and fused multiply-adds; IEEE NaN/inf kept


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True)
def _accumulate(out, src, phase, offset, w, block):  # pragma: no cover - compiled
    rows, channels = out.shape
    for i in numba.prange((rows + block - 1) // block):
        a, b = i * block, min(rows, i * block + block)
        for t in range(offset.shape[0]):
            p, o = phase[t], offset[t]
            for m in range(a, b):
                if t == 0:
                    for c in range(channels):
                        out[m, c] = src[p, m + o, c] * w[t, c]
                else:
                    for c in range(channels):
                        out[m, c] += src[p, m + o, c] * w[t, c]


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True)
def _reduce(src, phase, offset, dy, block, parts):  # pragma: no cover - compiled
    rows, channels = dy.shape
    blocks = (rows + block - 1) // block
    acc = np.zeros((parts, offset.shape[0], channels), dy.dtype)
    for part in numba.prange(parts):
        for i in range(part * blocks // parts, (part + 1) * blocks // parts):
            a, b = i * block, min(rows, i * block + block)
            for t in range(offset.shape[0]):
                p, o = phase[t], offset[t]
                for m in range(a, b):
                    for c in range(channels):
                        acc[part, t, c] += src[p, m + o, c] * dy[m, c]
    return acc.sum(axis=0)


def _block(channels: int, itemsize: int) -> int:
    return max(1, BLOCK_BYTES // (channels * itemsize))


def _taps(taps: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    phase, offset = zip(*taps)
    return np.array(phase, np.int64), np.array(offset, np.int64)


def accumulate(out: np.ndarray, srcs: np.ndarray, taps: Sequence[tuple[int, int]], weights: np.ndarray) -> None:
    """``out[m] = sum_t srcs[s_t][m + off_t] * weights[t]``; ``srcs`` (S, rows, C), ``weights`` (T, C)."""
    if out.shape[0]:
        _accumulate(out, srcs, *_taps(taps), np.ascontiguousarray(weights, dtype=out.dtype),
                    _block(out.shape[1], out.itemsize))


def reduce(srcs: np.ndarray, taps: Sequence[tuple[int, int]], dy: np.ndarray) -> np.ndarray:
    """``dW[t] = sum_m srcs[s_t][m + off_t] * dy[m]`` per channel, (T, C)."""
    block = _block(dy.shape[1], dy.itemsize)
    parts = max(1, min(4 * numba.get_num_threads(), -(-dy.shape[0] // block)))
    return _reduce(srcs, *_taps(taps), dy, block, parts)
