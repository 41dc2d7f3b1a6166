"""The binary ops' math and shape rules, and BiasAdd / BiasAddBackward.

Binary ops follow oneDNN's ``auto_broadcast``: ``numpy`` is multi-directional broadcasting (shapes
aligned at their last axes; each pair of sizes equal or one of them 1), ``none`` needs equal shapes.
BiasAdd adds a 1-D bias along the channel axis (axis 1 for NCX, the last axis for NXC);
BiasAddBackward sums diff_dst over every other axis. Arrays arrive in the compute dtype (f64 for the
reference engine, f32 for the fast path); the caller rounds the result once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import ShapeError

__all__ = ["BINARY", "broadcast_shape", "channel_axis", "bias_add", "bias_add_backward"]

#: algorithm -> dst = f(src_0, src_1)
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,  # NaN propagates
    "minimum": np.minimum,
    "squared_difference": lambda a, b: np.square(a - b),
}


def broadcast_shape(op: str, names: tuple[str, str], shapes: tuple[tuple[int, ...], tuple[int, ...]],
                    mode: str) -> tuple[int, ...]:
    """The output shape of a binary op with inputs of ``shapes`` under auto_broadcast ``mode``."""
    a, b = shapes
    if mode == "none":
        if a != b:
            raise ShapeError(op, names[1], f"has shape {list(b)}: expected {list(a)}, the shape of '{names[0]}' "
                             "(auto_broadcast is none: no broadcasting)")
        return a
    out = []
    for axis in range(-1, -max(len(a), len(b)) - 1, -1):
        x = a[axis] if -axis <= len(a) else 1
        y = b[axis] if -axis <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ShapeError(op, names[1], f"has shape {list(b)}: it does not broadcast with {list(a)}, the shape "
                             f"of '{names[0]}' (axis {axis}: {y} vs {x}; sizes must be equal or 1, aligned at the "
                             "last axis)")
        out.append(x if y == 1 else y)
    return tuple(reversed(out))


def channel_axis(op: str, name: str, shape: tuple[int, ...], data_format: str) -> int:
    """The channel axis of a data tensor of ``shape``: 1 for NCX, the last for NXC (rank >= 2)."""
    if len(shape) < 2:
        raise ShapeError(op, name, f"has shape {list(shape)} (rank {len(shape)}): expected rank 2 or more "
                         "(a batch axis, the channels and any spatial axes)")
    return 1 if data_format == "NCX" else len(shape) - 1


def bias_add(src: np.ndarray, bias: np.ndarray, data_format: str) -> np.ndarray:
    """dst = src + bias along the channel axis."""
    axis = 1 if data_format == "NCX" else src.ndim - 1
    return src + bias.reshape((-1,) + (1,) * (src.ndim - 1 - axis))


def bias_add_backward(diff_dst: np.ndarray, data_format: str) -> np.ndarray:
    """diff_bias[c] = sum of diff_dst over every axis but the channel axis (in diff_dst's dtype)."""
    axis = 1 if data_format == "NCX" else diff_dst.ndim - 1
    return diff_dst.sum(axis=tuple(a for a in range(diff_dst.ndim) if a != axis), dtype=diff_dst.dtype)
