"""Attribute parsing and validation, driven entirely by the tables in :mod:`convgrad.opdefs`.

Types: s64 (integers), s64[] (lists of integers), string (one of the choices), f32 (finite numbers,
held as the nearest f32 value) and bool.

Two stages: :func:`parse_attributes` checks names, types, ranges and choices as soon as an op is
built (no inputs needed); :func:`per_axis` then fits list attributes to the spatial rank once the
inputs are known.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import AttributeTypeError, AttributeValueError, MissingAttributeError, UnknownAttributeError
from .opdefs import MAX_NDIMS, AttrSpec, OpDef

__all__ = ["parse_attributes", "per_axis", "fits_rank", "Attrs", "value_key", "attributes_key"]

Attrs = dict[str, Any]

# Largest value any s64 attribute may hold (oneDNN's dims are int64).
_S64_MAX = 2**63 - 1


def _as_int(op: str, spec: AttrSpec, value: Any, whole: Any) -> int:
    kind = "an integer" if spec.type == "s64" else "a list of integers"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise AttributeTypeError(op, spec.name, whole, f"{kind} ({spec.expected()})")
    try:
        number = int(value)
    except Exception:  # an Integral whose conversion fails
        raise AttributeTypeError(op, spec.name, whole, f"{kind} ({spec.expected()})") from None
    if abs(number) > _S64_MAX:
        raise AttributeValueError(op, spec.name, whole, f"{spec.expected()} that fit in s64")
    if spec.minimum is not None and number < spec.minimum:
        raise AttributeValueError(op, spec.name, whole, spec.expected())
    return number


def _as_float(op: str, spec: AttrSpec, value: Any) -> float:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise AttributeTypeError(op, spec.name, value, f"a number ({spec.expected()})")
    with np.errstate(over="ignore"):
        number = float(np.float32(value))  # an f32 attribute holds the f32 nearest the value given
    if (not math.isfinite(number) or (spec.minimum is not None and number < spec.minimum)
            or (spec.nonzero and number == 0)):
        raise AttributeValueError(op, spec.name, value, spec.expected())
    return number


def _parse_one(op: str, spec: AttrSpec, value: Any) -> Any:
    if spec.type == "f32":
        return _as_float(op, spec, value)
    if spec.type == "bool":
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, (bool, np.bool_)):
            raise AttributeTypeError(op, spec.name, value, "true or false (a bool)")
        return bool(value)
    if spec.type == "string":
        if not isinstance(value, str):
            raise AttributeTypeError(op, spec.name, value, f"a string, {spec.expected()}")
        for choice in spec.choices:
            if value.lower() == choice.lower():
                return choice
        raise AttributeValueError(op, spec.name, value, spec.expected())
    if spec.type == "s64":
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        return _as_int(op, spec, value, value)
    # s64[]
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise AttributeTypeError(op, spec.name, value, f"a 1-D list of integers ({spec.expected()})")
        items = value.tolist() if value.dtype.kind in "iu" else list(value)
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise AttributeTypeError(op, spec.name, value, f"a list of integers ({spec.expected()})")
    return tuple(_as_int(op, spec, item, value) for item in items)


def parse_attributes(definition: OpDef, attrs: Mapping[str, Any], scalars: bool = False) -> Attrs:
    """Validate ``attrs`` against the op's table; return the given ones, normalised.

    ``None`` means "not given". Unknown names are errors. String choices are matched in any letter
    case. An all-zero shape attribute (as oneDNN writes unset ones) counts as not given. With
    ``scalars`` (the functional API), a per-axis list may be one integer for every spatial axis
    (``strides=2``), kept as an int until :func:`per_axis` knows the rank.
    """
    op = definition.kind
    known = definition.attr_names
    parsed: Attrs = {}
    for name, value in attrs.items():
        if name not in known:
            raise UnknownAttributeError(op, name, value, known)
        if value is None:
            continue
        spec = definition.attr(name)
        if _is_list(value) and len(value) > MAX_NDIMS:  # before reading the items: it may be huge
            raise AttributeValueError(op, name, value, f"{spec.expected()}: at most {MAX_NDIMS} values "
                                      "(oneDNN's DNNL_MAX_NDIMS)")
        if spec.full_shape and _is_list(value) and not any(_nonzero(v) for v in value):
            continue
        if scalars and spec.per_axis and not _is_list(value) and not isinstance(value, (str, bytes)):
            parsed[name] = _parse_one(op, AttrSpec(name, "s64", spec.description, minimum=spec.minimum), value)
            continue
        parsed[name] = _parse_one(op, spec, value)
    return parsed


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1)


def _nonzero(item: Any) -> bool:
    try:
        return bool(item != 0)
    except Exception:  # hostile element: let the type check report it
        return True


def per_axis(definition: OpDef, attrs: Attrs, name: str, rank: int, lenient: bool = False) -> tuple[int, ...]:
    """The value of list attribute ``name`` fitted to ``rank`` spatial axes.

    An omitted optional list (output_padding) and an empty pads list mean zeros. An omitted
    required list is an error, unless ``lenient`` (the functional API), which fills pads with 0
    and dilations with 1. A longer list is accepted when every extra entry is 0 (oneDNN writes
    unset lists as 12 zeros); any other length is an error naming the attribute.
    """
    spec = definition.attr(name)
    value = attrs.get(name)
    if value is None:
        if spec.required and not lenient:
            raise MissingAttributeError(definition.kind, name, f"{spec.expected()} ({rank} values)")
        return (max(spec.minimum or 0, 0),) * rank
    if isinstance(value, int):  # one value for every axis (the functional API's scalars)
        return (value,) * rank
    if not fits_rank(spec, value, rank):
        raise AttributeValueError(definition.kind, name, list(value),
                                  f"{rank} values, one per spatial axis of the {rank}-D problem")
    return (0,) * rank if value == () else value[:rank]


def fits_rank(spec: AttrSpec, value: int | tuple[int, ...], rank: int) -> bool:
    """Whether the given ``value`` of per-axis attribute ``spec`` fits ``rank`` spatial axes: one
    integer for all, ``rank`` values, or more when every extra one is 0, or none at all for a list
    whose values may be 0 (empty pads mean zeros)."""
    if isinstance(value, int):
        return True
    if value == ():
        return spec.minimum == 0
    return len(value) >= rank and not any(value[rank:])


_SCALARS = (int, bool, float, str, type(None))
_INT = frozenset({int})


def value_key(value: Any) -> Any:
    """A hashable key of an attribute value as given, equal only for values the parser reads alike
    (type-exact: 1, True, 1.0 and [1] all differ), for memos of parsed attributes; ``None`` for
    arrays, nested or long lists and other objects (those calls are parsed afresh)."""
    t = type(value)
    if t is list or t is tuple:
        if len(value) > MAX_NDIMS:
            return None
        if _INT.issuperset(map(type, value)):  # the common case, cheaply (keys of other items are pairs)
            return t, tuple(value)
        items = tuple(_scalar_key(v) for v in value)
        return None if None in items else (t, items)
    return _scalar_key(value)


def _scalar_key(value: Any) -> Any:
    t = type(value)
    return (t, value) if t in _SCALARS or isinstance(value, np.integer) else None


_PLAIN = frozenset({int, str, type(None)})
_PLAIN_OR_LIST = _PLAIN | {list}


def attributes_key(attrs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The (name, :func:`value_key`) pairs of ``attrs`` in the order given; ``None`` where a value
    has no key. (Attributes all ints, strings, None or short lists of ints, the common case:
    their names, types and values, lists as tuples, as three tuples, without a pair per
    attribute; a list's type stays in the types, so [1, 2] and (1, 2) still differ.)"""
    values = tuple(attrs.values())
    types = tuple(map(type, values))
    if _PLAIN.issuperset(types):
        return tuple(attrs), types, values
    if _PLAIN_OR_LIST.issuperset(types):             # and lists of ints (pads, strides): as tuples
        plain = []
        for value in values:
            if type(value) is list:
                if len(value) > MAX_NDIMS or not _INT.issuperset(map(type, value)):
                    break
                value = tuple(value)
            plain.append(value)
        else:
            return tuple(attrs), types, tuple(plain)
    key = []
    for name, value in attrs.items():
        t = type(value)
        if t is int or t is str or value is None:  # the common cases, inline (a warm call's cost)
            key.append((name, (t, value)))
            continue
        value = value_key(value)
        if value is None:
            return None
        key.append((name, value))
    return tuple(key)
