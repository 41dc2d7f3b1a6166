"""What the framework adapters (:mod:`convgrad.torch`, :mod:`convgrad.jax`) share: attributes
validated and made plain, op objects reused across calls, shape inference from shapes and dtypes.

Nothing here imports a framework.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .attributes import attributes_key
from .memo import Memo
from .op import Op
from .opdefs import OpDef
from .problem import Problem

__all__ = ["plain_attributes", "attributes_and_op", "op_for", "infer", "data_input_names"]


def plain_attributes(kind: str, attrs: Mapping[str, Any], rank: int, remember: bool = True) -> dict[str, Any]:
    """The given (non-None) attributes validated as the functional API does (a ConvgradError on a
    bad one) and normalised to plain types: lists of ints (a per-axis scalar repeated for the
    ``rank`` spatial axes), ints, canonical strings. Remembered (with ``remember``) for attributes
    given alike (:func:`~convgrad.attributes.value_key`): a new dict each call, from one parse."""
    plain = attributes_and_op(kind, attrs, rank, remember)[0]
    return {k: list(v) if type(v) is list else v for k, v in plain.items()}


def attributes_and_op(kind: str, attrs: Mapping[str, Any], rank: int,
                      remember: bool = True) -> tuple[Mapping[str, Any], Op]:
    """:func:`plain_attributes` (the remembered dict itself: not to be changed) and their
    :func:`op_for`, from one memo lookup on a warm call."""
    given = {k: v for k, v in attrs.items() if v is not None}
    key = (kind, rank, attributes_key(given) if remember else None)
    hit = _plain.get(key) if key[2] is not None else None
    if hit is None:
        op = Op(kind, lenient=True, **given)
        per_axis = {a.name for a in op.definition.attributes if a.per_axis}
        plain = {k: list(v) if isinstance(v, tuple) else [v] * max(rank, 0) if k in per_axis else v
                 for k, v in op.attrs.items()}
        hit = (plain, op_for(kind, plain))
        if key[2] is not None:
            _plain.put(key, hit)
    return hit


_plain: Memo[tuple[Any, ...], tuple[dict[str, Any], Op]] = Memo(512)


@functools.lru_cache(maxsize=512)
def _cached_op(kind: str, attrs: tuple[tuple[str, Any], ...]) -> Op:
    return Op(kind, lenient=True, **dict(attrs))


def op_for(kind: str, attrs: Mapping[str, Any]) -> Op:
    """The (lenient) op for plain attributes (:func:`plain_attributes`' lists of ints, ints and
    strings), None meaning omitted. Ops are reused, so a training loop's repeated calls take the
    warm path (:meth:`Op.resolve`); the key keeps the attributes' order (another order: another
    entry of the same op)."""
    key = tuple((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items() if v is not None)
    return _cached_op(kind, key)


def infer(kind: str, attrs: Mapping[str, Any], inputs: Sequence[tuple[Sequence[int], np.dtype] | None]) -> Problem:
    """Shape inference from each data input's (shape, NumPy dtype), or None where absent: the
    inputs stand in as zero-memory arrays, so convgrad's own checks name any bad shape or dtype."""
    stand_ins = [None if spec is None else np.broadcast_to(np.zeros((), spec[1]), tuple(int(s) for s in spec[0]))
                 for spec in inputs]
    return op_for(kind, attrs).infer(*stand_ins)


def data_input_names(d: OpDef) -> list[str]:
    """The op's data inputs (its shape input, if any, is given as the attribute instead)."""
    return [s.name for s in d.inputs if s.role != "shape"]
