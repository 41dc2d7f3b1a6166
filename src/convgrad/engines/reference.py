"""The reference engine: plain float64 loops over kernel offsets, no im2col.

For each kernel offset k, output o reads input ``i = o*S + k*D - PB``; the outputs whose i lies
inside the input (not in the padding) are one range per axis, and the inputs they read the
strided slice ``x[i_first : i_last + 1 : S]``. Each problem is a sum over k of one small
contraction over channels (per group) between those two slices:

- forward:          y[o]  += x[i] @ w[k]
- backward_data:    dx[i] += dy[o] @ w[k]^T
- backward_weights: dw[k]  = sum_{n,o} x[i]^T dy[o]

Padding is not part of the sums (docs/semantics.md, *NaN and Inf*): a tap in the padding adds
nothing, so a NaN or Inf weight meets only real data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ..problem import ConvGeometry
from . import register

__all__ = ["ReferenceEngine"]


def _offsets(g: ConvGeometry) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
    """Each kernel offset k with a tap inside the input, the outputs whose tap k lies inside the
    input, and the input elements those taps read (slices of canonical (N, *X, C) arrays)."""
    for k in itertools.product(*(range(size) for size in g.kernel)):
        outputs, inputs = [], []
        for kk, d, s, b, i, o in zip(k, g.dilations, g.strides, g.pads_begin, g.in_size, g.out_size):
            first = max(0, -((kk * d - b) // s))  # the first o with o*S + k*D - PB >= 0
            last = min(o - 1, (i - 1 + b - kk * d) // s)  # the last with o*S + k*D - PB <= I - 1
            if first > last:
                break
            start = first * s + kk * d - b
            outputs.append(slice(first, last + 1))
            inputs.append(slice(start, start + s * (last - first) + 1, s))
        else:
            yield k, (slice(None), *outputs, slice(None)), (slice(None), *inputs, slice(None))


class ReferenceEngine:
    """Obviously-correct float64 implementation used as the oracle (``engine="reference"``)."""

    name = "reference"

    @staticmethod
    def workspace_bytes(g: ConvGeometry, task: str, dtype: np.dtype) -> int:
        """Peak bytes one call allocates, its f64 result included, whatever ``dtype``: f64 copies
        of x, dy and w, the result, and per kernel offset the gathered taps (twice, einsum may
        copy them) and one result-sized product (the maximum over the three tasks)."""
        taps = g.n * math.prod(g.out_size) * g.ic
        return 8 * (2 * math.prod(g.x_shape) + math.prod(g.w_shape) + 2 * math.prod(g.y_shape) + 2 * taps)

    @staticmethod
    def _grouped(data: np.ndarray, groups: int) -> np.ndarray:
        """Canonical (N, *X, C) data as float64 (N, *X, G, C/G)."""
        return data.astype(np.float64).reshape(*data.shape[:-1], groups, data.shape[-1] // groups)

    @staticmethod
    def _grouped_weights(g: ConvGeometry, w: np.ndarray) -> np.ndarray:
        return w.astype(np.float64).reshape(*g.kernel, g.icg, g.groups, g.ocg)

    def forward(self, g: ConvGeometry, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        xg, wg = self._grouped(x, g.groups), self._grouped_weights(g, w)
        y = np.zeros((g.n, *g.out_size, g.groups, g.ocg), dtype=np.float64)
        for k, outputs, inputs in _offsets(g):
            y[outputs] += np.einsum("...gi,igo->...go", xg[inputs], wg[k], optimize=True)
        return y.reshape(g.y_shape)

    def backward_data(self, g: ConvGeometry, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        dyg, wg = self._grouped(dy, g.groups), self._grouped_weights(g, w)
        dx = np.zeros((g.n, *g.in_size, g.groups, g.icg), dtype=np.float64)
        for k, outputs, inputs in _offsets(g):
            dx[inputs] += np.einsum("...go,igo->...gi", dyg[outputs], wg[k], optimize=True)
        return dx.reshape(g.x_shape)

    def backward_weights(self, g: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        xg, dyg = self._grouped(x, g.groups), self._grouped(dy, g.groups)
        dw = np.zeros((*g.kernel, g.icg, g.groups, g.ocg), dtype=np.float64)
        for k, outputs, inputs in _offsets(g):
            dw[k] = np.einsum("...gi,...go->igo", xg[inputs], dyg[outputs], optimize=True)
        return dw.reshape(g.w_shape)


register(ReferenceEngine())
