"""The functional API: one function per op, generated from the op table.

``convolution_backward_data(diff_dst, weights, dst_shape=None, *, strides=None, pads_begin=None,
pads_end=None, dilations=None, auto_pad="none", groups=1, data_format="NXC",
weights_format="XIO", output_padding=None, engine=None)`` and its six siblings take the op's
inputs positionally (spec index order) and its attributes by keyword. Omitted strides and
dilations mean 1 and omitted pads 0; each per-axis attribute may be one integer for every axis
(``strides=2``). The other ops' functions (``relu(src)``, ``elu_backward(src_or_dst,
diff_dst, *, alpha, use_dst=True)``, ``add(src_0, src_1, *, auto_broadcast="numpy")``, ...) take
their attributes with the table's defaults; a required one (``alpha``) has none. Signatures and
docstrings come from :mod:`convgrad.opdefs`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .attributes import attributes_key
from .errors import InputError, InputTypeError, MissingAttributeError, UnknownAttributeError
from .memo import Memo
from .op import Op
from .opdefs import OPS, AttrSpec, OpDef

__all__ = [d.function for d in OPS.values()]

_P = inspect.Parameter


def _keyword_default(d: OpDef, a: AttrSpec) -> Any:
    """The keyword's default: convolutions are lenient (omitted strides, pads and dilations are
    None: strides and dilations 1, pads 0), the other ops take the table's default or, when
    required, none."""
    if d.family != "convolution":
        return _P.empty if a.required else a.default
    return a.default if a.name in ("auto_pad", "groups", "data_format") or a.choices else None


def _signature(d: OpDef) -> inspect.Signature:
    params = [_P(s.name, _P.POSITIONAL_OR_KEYWORD, default=_P.empty if s.required else None) for s in d.inputs]
    for a in d.attributes:
        if a.full_shape:
            continue  # given as the positional shape input
        params.append(_P(a.name, _P.KEYWORD_ONLY, default=_keyword_default(d, a)))
    params.append(_P("engine", _P.KEYWORD_ONLY, default=None))
    return inspect.Signature(params, return_annotation=np.ndarray)


def docstring(d: OpDef) -> str:
    """Docstring of an op's function, from its table entry."""
    lines = [d.summary, "", f"    {d.math}", "", "Inputs (spec index order):"]
    for i, s in enumerate(d.inputs):
        lines.append(f"    {i}: {s.name} ({'required' if s.required else 'optional'})")
    lines += [f"Output: {d.output.name}", "", "Attributes (keyword):"]
    for a in d.attributes:
        if a.full_shape:
            continue
        default = _keyword_default(d, a)
        default = "required" if default is _P.empty else f"default {default!r}"
        lines.append(f"    {a.name}: {a.expected()}; {default}. {a.description}")
    lines.append("    engine: name of the engine ('fast', 'reference'); default: the default engine.")
    return "\n".join(lines)


#: Ops built by the functional API, by (op, positional count, attributes): a repeated call
#: reuses its Op (parsed attributes, and its last shape inference). Only calls that built an Op
#: are here, so a warm call is one a cold call accepted.
_ops: Memo[tuple[Any, ...], Op] = Memo(512)


def _make(d: OpDef) -> Callable[..., np.ndarray]:
    signature = _signature(d)
    input_names = [s.name for s in d.inputs]

    keywords = [p.name for p in signature.parameters.values() if p.kind is _P.KEYWORD_ONLY]

    def function(*args: Any, **kwargs: Any) -> np.ndarray:
        engine = kwargs.pop("engine", None)
        key = (d.kind, len(args), attributes_key(kwargs))
        op = _ops.get(key)
        if op is None:
            op, args = _cold(key, args, kwargs)
        return op(*args, *[None] * (len(input_names) - len(args)), engine=engine)

    def _cold(key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Op, tuple[Any, ...]]:
        """Check the call as written: its Op and inputs (the Op kept for calls with positional
        inputs whose every attribute has a key)."""
        # Same error classes as Op(kind, **attrs): a misspelt attribute is an UnknownAttributeError,
        # a missing required attribute (strides) a MissingAttributeError, a missing input an InputError.
        unknown = next((k for k in kwargs if k not in signature.parameters), None)
        if unknown is not None:
            raise UnknownAttributeError(d.kind, unknown, kwargs[unknown], keywords)
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise InputTypeError(d.kind, None, f"called as {d.function}(...): {exc}") from None
        for p in signature.parameters.values():
            if p.default is _P.empty and p.name not in bound.arguments:
                if p.kind is _P.KEYWORD_ONLY:
                    raise MissingAttributeError(d.kind, p.name, d.attr(p.name).expected())
                raise InputError(d.kind, p.name, "is required but was not given")
        op = Op(d.kind, lenient=True, **{k: v for k, v in kwargs.items() if k not in input_names})
        if key[2] is not None and not any(name in kwargs for name in input_names):
            _ops.put(key, op)
        return op, tuple(bound.arguments.get(name) for name in input_names)

    function.__name__ = function.__qualname__ = d.function
    function.__signature__ = signature  # type: ignore[attr-defined]
    function.__doc__ = docstring(d)
    function.__module__ = "convgrad"
    return function


for _d in OPS.values():
    globals()[_d.function] = _make(_d)

# Static names for type checkers and readers (the objects are the generated functions above).
convolution: Callable[..., np.ndarray] = globals()["convolution"]
convolution_backward_data: Callable[..., np.ndarray] = globals()["convolution_backward_data"]
convolution_backward_weights: Callable[..., np.ndarray] = globals()["convolution_backward_weights"]
convolution_backprop_filters: Callable[..., np.ndarray] = globals()["convolution_backprop_filters"]
conv_transpose: Callable[..., np.ndarray] = globals()["conv_transpose"]
conv_transpose_backward_data: Callable[..., np.ndarray] = globals()["conv_transpose_backward_data"]
conv_transpose_backward_weights: Callable[..., np.ndarray] = globals()["conv_transpose_backward_weights"]
