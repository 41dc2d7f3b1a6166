"""Moving user layouts to and from the engines' canonical form (zero-copy views).

Canonical form: data channels-last ``(N, *X, C)`` (NXC), weights ``(*K, ICg, OC)`` (XIO). NCX data
and OIX/IOX weights are exposed as transposed views; engines copy only what they must. IOX/XOI
weights of a ConvTranspose are the OIX/XIO weights of the convolution it is the transpose of, so
they share the same mapping. A weights result is laid out in its format by :func:`weights_in_format`.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel_cache

__all__ = ["data_to_canonical", "data_from_canonical", "channels_first", "weights_to_canonical",
           "weights_from_canonical", "weights_in_format"]

#: Channels per side of a tile of :func:`_reverse` (measured: 16 beats 32 and 64, 1.5-3x NumPy).
_TILE = 16


def data_to_canonical(array: np.ndarray, data_format: str) -> np.ndarray:
    """View of an NXC or NCX data tensor as (N, *X, C)."""
    return array if data_format == "NXC" else np.moveaxis(array, 1, -1)


def data_from_canonical(array: np.ndarray, data_format: str) -> np.ndarray:
    """View of a canonical (N, *X, C) tensor in ``data_format``."""
    return array if data_format == "NXC" else np.moveaxis(array, -1, 1)


def channels_first(data: np.ndarray) -> bool:
    """Whether canonical (N, *X, C) data is stored channels-first (a view of NCX memory)."""
    return data.ndim > 2 and data.strides[-1] > data.strides[-2]


def _channels_first_order(ndim: int) -> tuple[int, ...]:
    """Axis permutation between (O, I, *K) and (*K, I, O); it is its own inverse."""
    return (*range(2, ndim), 1, 0) if ndim else ()


def weights_to_canonical(array: np.ndarray, weights_format: str) -> np.ndarray:
    """View of weights in OIX/XIO (IOX/XOI) as (*K, ICg, OC)."""
    return array if weights_format[0] == "X" else np.transpose(array, _channels_first_order(array.ndim))


def weights_from_canonical(array: np.ndarray, weights_format: str) -> np.ndarray:
    """View of canonical (*K, ICg, OC) weights in ``weights_format``."""
    if weights_format[0] == "X":
        return array
    rank = array.ndim - 2
    return np.transpose(array, (rank + 1, rank, *range(rank)))


@kernel_cache.njit()
def _reverse(src, out):  # pragma: no cover - compiled
    """``out[o, i, k] = src[k, i, o]`` in _TILE x _TILE tiles of (i, o)."""
    k_, i_, o_ = src.shape
    for i0 in range(0, i_, _TILE):
        i1 = min(i_, i0 + _TILE)
        for o0 in range(0, o_, _TILE):
            o1 = min(o_, o0 + _TILE)
            for k in range(k_):
                for o in range(o0, o1):
                    for i in range(i0, i1):
                        out[o, i, k] = src[k, i, o]


def weights_in_format(array: np.ndarray, weights_format: str) -> np.ndarray:
    """Canonical (*K, ICg, OC) weights as a C-contiguous array in ``weights_format`` (``array``
    itself when it already is one). From canonical weights that are (K, ICg, OC) in memory (C-contiguous,
    or a view of an engine's padded sums), OIX/IOX is a reversal of the axes (K, ICg, OC) -> (OC,
    ICg, K), copied tile by tile: NumPy's copy of the reversed view strides through memory
    (measured 4.7 ms for 1M values, here 1.5 ms; a 3x3 512-channel weights gradient's padded
    sums 16 ms, here 2)."""
    view = weights_from_canonical(array, weights_format)
    taps, (icg, oc) = math.prod(array.shape[:-2]), array.shape[-2:]
    try:
        src = np.reshape(array, (taps, icg, oc), copy=False)
    except ValueError:
        src = None
    if view.flags.c_contiguous or weights_format[0] == "X" or src is None or array.dtype.itemsize not in (2, 4, 8):
        return np.ascontiguousarray(view)
    bits = np.dtype(f"u{array.dtype.itemsize}")  # any dtype (ml_dtypes' bf16 too) as its bits
    out = np.empty(view.shape, array.dtype)
    _reverse(src.view(bits), out.reshape(oc, icg, taps).view(bits))
    return out
