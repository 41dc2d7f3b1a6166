"""The reference engine: plain float64 loops over kernel offsets, no im2col.

For each kernel offset k the input positions touched by every output o are the strided slice
``x_pad[k*D : k*D + S*(O-1) + 1 : S]`` of the zero-padded input, so each problem is a sum over k of
one small contraction over channels (per group):

- forward:          y[o]      += x_pad[o*S + k*D] @ w[k]
- backward_data:    dx_pad[o*S + k*D] += dy[o] @ w[k]^T     (then crop the padding)
- backward_weights: dw[k]     = sum_{n,o} x_pad[o*S + k*D]^T dy[o]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ..problem import ConvGeometry
from . import register

__all__ = ["ReferenceEngine"]


def _padded_shape(g: ConvGeometry, channels: int) -> tuple[int, ...]:
    """Canonical shape of the zero-padded input buffer."""
    return (g.n, *g.padded_size, channels)


def _interior(g: ConvGeometry) -> tuple[slice, ...]:
    """Where the unpadded input sits inside the padded buffer."""
    return (slice(None), *(slice(b, b + i) for b, i in zip(g.pads_begin, g.in_size)), slice(None))


def _offsets(g: ConvGeometry) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Each kernel offset k and the slice of the padded input its taps read for all outputs."""
    for k in itertools.product(*(range(size) for size in g.kernel)):
        taps = tuple(slice(kk * d, kk * d + s * (o - 1) + 1, s)
                     for kk, d, s, o in zip(k, g.dilations, g.strides, g.out_size))
        yield k, (slice(None), *taps, slice(None))


class ReferenceEngine:
    """Obviously-correct float64 implementation used as the oracle (``engine="reference"``)."""

    name = "reference"

    @staticmethod
    def workspace_bytes(g: ConvGeometry, task: str, dtype: np.dtype) -> int:
        """Peak bytes one call allocates, its f64 result included, whatever ``dtype``: the padded
        input, copies of dy and w, the result, and per kernel offset the gathered taps (twice,
        einsum may copy them) and one result-sized product (the maximum over the three tasks)."""
        padded = math.prod(_padded_shape(g, g.ic))
        taps = g.n * math.prod(g.out_size) * g.ic
        return 8 * (padded + math.prod(g.w_shape) + 2 * math.prod(g.y_shape) + 2 * taps + math.prod(g.x_shape))

    @staticmethod
    def _pad(g: ConvGeometry, x: np.ndarray) -> np.ndarray:
        padded = np.zeros(_padded_shape(g, g.ic), dtype=np.float64)
        padded[_interior(g)] = x
        return padded

    @staticmethod
    def _grouped_weights(g: ConvGeometry, w: np.ndarray) -> np.ndarray:
        return w.astype(np.float64).reshape(*g.kernel, g.icg, g.groups, g.ocg)

    def forward(self, g: ConvGeometry, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        padded, wg = self._pad(g, x), self._grouped_weights(g, w)
        y = np.zeros((g.n, *g.out_size, g.groups, g.ocg), dtype=np.float64)
        for k, taps in _offsets(g):
            xs = padded[taps].reshape(*y.shape[:-2], g.groups, g.icg)
            y += np.einsum("...gi,igo->...go", xs, wg[k], optimize=True)
        return y.reshape(g.y_shape)

    def backward_data(self, g: ConvGeometry, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        wg = self._grouped_weights(g, w)
        dyg = dy.astype(np.float64).reshape(g.n, *g.out_size, g.groups, g.ocg)
        padded = np.zeros(_padded_shape(g, g.ic), dtype=np.float64)
        for k, taps in _offsets(g):
            contribution = np.einsum("...go,igo->...gi", dyg, wg[k], optimize=True)
            padded[taps] += contribution.reshape(*dyg.shape[:-2], g.ic)
        return np.ascontiguousarray(padded[_interior(g)])

    def backward_weights(self, g: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        padded = self._pad(g, x)
        rows = g.n * int(np.prod(g.out_size))
        dyg = dy.astype(np.float64).reshape(rows, g.groups, g.ocg)
        dw = np.zeros((*g.kernel, g.icg, g.groups, g.ocg), dtype=np.float64)
        for k, taps in _offsets(g):
            xs = padded[taps].reshape(rows, g.groups, g.icg)
            dw[k] = np.einsum("mgi,mgo->igo", xs, dyg, optimize=True)
        return dw.reshape(g.w_shape)


register(ReferenceEngine())
