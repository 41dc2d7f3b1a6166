"""The layout ops' shape rules: StaticReshape's target shape and StaticTranspose's permutation.

Their data movement is NumPy's (``reshape`` in row-major order, ``transpose``); Reorder and TypeCast
keep the shape. The graph runner lays each output out with its logical tensor's strides, so a
Reorder into another memory order really moves the data.
"""

from __future__ import annotations

import math

from .errors import AttributeValueError, ShapeError

__all__ = ["reshape_target", "transpose_order"]


def reshape_target(op: str, src_shape: tuple[int, ...], shape: tuple[int, ...], special_zero: bool) -> tuple[int, ...]:
    """dst's shape: ``shape`` with a 0 copied from src (special_zero) and a -1 inferred; the element
    counts must match."""
    if any(v < -1 for v in shape) or shape.count(-1) > 1:
        raise AttributeValueError(op, "shape", list(shape), "sizes >= 0 and at most one -1 (the size to infer)")
    sizes = list(shape)
    if special_zero:
        for axis, size in enumerate(shape):
            if size == 0:
                if axis >= len(src_shape):
                    raise AttributeValueError(op, "shape", list(shape), f"a 0 (special_zero: copy src's size) only "
                                              f"on the {len(src_shape)} axes of src {list(src_shape)}")
                sizes[axis] = src_shape[axis]
    count = math.prod(src_shape)
    if -1 in sizes:
        known = math.prod(v for v in sizes if v != -1)
        if known == 0 or count % known:
            raise AttributeValueError(op, "shape", list(shape), f"a shape whose -1 can be inferred for the {count} "
                                      f"elements of src {list(src_shape)}")
        sizes[sizes.index(-1)] = count // known
    if math.prod(sizes) != count:
        raise ShapeError(op, "src", f"has shape {list(src_shape)} ({count} elements): expected "
                         f"{math.prod(sizes)} elements for the reshape to {sizes}")
    return tuple(sizes)


def transpose_order(op: str, rank: int, order: tuple[int, ...]) -> tuple[int, ...]:
    """``order`` with negative axes counted from the end; it must be a permutation of src's axes."""
    normal = tuple(v + rank if v < 0 else v for v in order)
    if sorted(normal) != list(range(rank)):
        raise AttributeValueError(op, "order", list(order), f"a permutation of the {rank} axes of src (values in "
                                  f"[{-rank}, {rank - 1}], each axis once)")
    return normal
