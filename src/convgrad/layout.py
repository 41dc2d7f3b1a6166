"""Moving user layouts to and from the engines' canonical form (zero-copy views).

Canonical form: data channels-last ``(N, *X, C)`` (NXC), weights ``(*K, ICg, OC)`` (XIO). NCX data
and OIX/IOX weights are exposed as transposed views; engines copy only what they must. IOX/XOI
weights of a ConvTranspose are the OIX/XIO weights of the convolution it is the transpose of, so
they share the same mapping.
"""

from __future__ import annotations

import numpy as np

__all__ = ["data_to_canonical", "data_from_canonical", "weights_to_canonical", "weights_from_canonical"]


def data_to_canonical(array: np.ndarray, data_format: str) -> np.ndarray:
    """View of an NXC or NCX data tensor as (N, *X, C)."""
    return array if data_format == "NXC" else np.moveaxis(array, 1, -1)


def data_from_canonical(array: np.ndarray, data_format: str) -> np.ndarray:
    """View of a canonical (N, *X, C) tensor in ``data_format``."""
    return array if data_format == "NXC" else np.moveaxis(array, -1, 1)


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
