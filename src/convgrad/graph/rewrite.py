"""benchdnn graph driver rewrites: ``--in-shapes``, ``--op-attrs``, ``--mb`` and ``--dt``.

- ``--in-shapes=ID:SHAPE[*TAG][+ID:...]``: a graph input's shape (``2x64x56x56``, rank may change;
  ``-`` a 0-d tensor, ``0`` a 1-D empty one) and/or memory order (``ID:TAG``; ``abcd`` row-major,
  ``acdb`` channels-last). A shape without a tag is dense row-major.
- ``--op-attrs=OPID:NAME:VALUE[*NAME:VALUE][+OPID:...]``: an op's attribute; lists as ``2x2``.
  Names and value types come from the op table (:mod:`convgrad.opdefs`).
- ``--mb=N``: the batch (axis 0) of every graph input that is an op's data tensor (not weights,
  bias or shape tensors); applied after ``--in-shapes``, so it takes precedence. 0: as in the file.
- ``--dt=DT`` every floating-point tensor, or ``--dt=ID:DT[+ID:DT]`` single tensors.
- ``--op-kind=OPID:KIND[+OPID:KIND]``: another kind for an element-wise, element-wise backward or
  binary op, of the same family (ReLU -> GELU, Add -> Multiply); attributes the new kind lacks are
  dropped, ones it requires come from ``--op-attrs`` (applied after the swap).

Shapes of inner tensors and outputs are not touched here: :mod:`convgrad.graph.plan` re-infers
them, so a rewritten input flows through the graph.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import ConvgradError, describe
from ..opdefs import SWAPPABLE_FAMILIES, get_opdef, ops_of
from ..untrusted import integer, shorten
from .model import Graph, GraphError, GraphOp, LogicalTensor, axis_order, dense_strides

__all__ = ["InShape", "parse_in_shapes", "parse_op_attrs", "parse_op_kind", "parse_dt", "parse_mb", "rewrite",
           "restride", "FLOAT_DTYPES"]

FLOAT_DTYPES = ("f32", "bf16", "f16")
_TAG = re.compile(r"[a-l]+")
_SHAPE = re.compile(r"-|[0-9]+(x[0-9]+)*")

InShape = tuple[tuple[int, ...] | None, str | None]


def _pairs(text: str, option: str, sep: str = "+") -> list[tuple[int, str]]:
    """``ID:REST`` items separated by ``sep``; the id must be a non-negative integer."""
    items = []
    for item in text.split(sep):
        tid, colon, rest = item.partition(":")
        if not colon or not (tid.isascii() and tid.isdigit()) or not rest:
            raise ValueError(f"{option}: {shorten(item, 80)!r} is not ID:VALUE (ID a tensor or op id)")
        items.append((integer(tid, f"{option}: id"), rest))
    return items


def parse_in_shapes(text: str) -> dict[int, InShape]:
    """``--in-shapes`` value -> {tensor id: (shape or None, tag or None)}."""
    out: dict[int, InShape] = {}
    for tid, spec in _pairs(text, "--in-shapes"):
        shape_text, star, tag = spec.partition("*")
        if not star and _TAG.fullmatch(spec):
            shape_text, tag = "", spec
        shape = None
        if shape_text:
            if not _SHAPE.fullmatch(shape_text):
                raise ValueError(f"--in-shapes: {shorten(spec, 80)!r} for tensor {tid}: expected a shape like "
                                 "2x64x56x56 "
                                 "(or - for 0-d), optionally *TAG, or a TAG like acdb")
            shape = () if shape_text == "-" else tuple(integer(d, f"--in-shapes: tensor {tid}")
                                                       for d in shape_text.split("x"))
        if star or tag:
            rank = len(shape) if shape is not None else len(tag)
            if not _TAG.fullmatch(tag or "") or sorted(tag) != [chr(ord("a") + i) for i in range(rank)]:
                raise ValueError(f"--in-shapes: tag {tag!r} for tensor {tid}: expected each of the first {rank} "
                                 "letters once (abcd = row-major, acdb = channels-last)")
        out[tid] = (shape, tag or None)
    return out


def parse_op_attrs(text: str) -> dict[int, dict[str, str]]:
    """``--op-attrs`` value -> {op id: {attribute name: value text}}."""
    out: dict[int, dict[str, str]] = {}
    for op_id, rest in _pairs(text, "--op-attrs"):
        for assignment in rest.split("*"):
            name, colon, value = assignment.partition(":")
            if not colon or not name:
                raise ValueError(f"--op-attrs: {assignment!r} for op {op_id} is not NAME:VALUE")
            out.setdefault(op_id, {})[name] = value
    return out


def parse_op_kind(text: str) -> dict[int, str]:
    """``--op-kind`` value -> {op id: kind} (kinds are checked against the graph by :func:`rewrite`)."""
    return dict(_pairs(text, "--op-kind"))


def parse_dt(text: str) -> dict[int | None, str]:
    """``--dt`` value -> {tensor id or None (= every floating-point tensor): dtype}."""
    items: list[tuple[int | None, str]] = [(None, text)] if ":" not in text else list(_pairs(text, "--dt"))
    for _, dtype in items:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"--dt: {shorten(dtype, 80)!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    return dict(items)


def parse_mb(text: str) -> int:
    """``--mb`` value: a non-negative integer (0 keeps the file's batch)."""
    return integer(text, "--mb")


def restride(tensor: LogicalTensor, shape: tuple[int, ...]) -> LogicalTensor:
    """``tensor`` with a new shape, dense in the memory order its strides had (padding is dropped)."""
    if tensor.stride is None or len(shape) != len(tensor.shape):
        return replace(tensor, shape=shape, stride=None)
    return replace(tensor, shape=shape, stride=dense_strides(shape, axis_order(tensor.stride)))


def _attr_value(op: GraphOp, name: str, text: str) -> Any:
    """The value of ``--op-attrs`` text for attribute ``name``, typed by the op table."""
    try:
        definition = get_opdef(op.kind)
    except ConvgradError as exc:
        raise GraphError(f"--op-attrs: {op.label}: {exc}") from None
    if name not in definition.attr_names:
        raise GraphError(f"--op-attrs: {op.label}: unknown attribute '{name}': expected one of "
                         + ", ".join(definition.attr_names))
    spec = definition.attr(name)
    if spec.type == "string":
        return text
    try:
        if spec.type == "s64":
            return integer(text, name, signed=True)
        if spec.type == "f32":
            return float(text)
        if spec.type == "bool":
            return {"true": True, "1": True, "false": False, "0": False}[text.lower()]
        return [integer(v, name, signed=True) for v in text.split("x")] if text else []
    except (ValueError, KeyError):
        raise GraphError(f"--op-attrs: {op.label}: attribute '{name}' = {shorten(text, 80)!r}: expected "
                         f"{spec.expected()}"
                         + (", written like 2x2" if spec.type == "s64[]" else "")) from None


def _data_input_ids(graph: Graph) -> set[int]:
    """Graph inputs that some op uses as a data tensor (the ones ``--mb`` changes): a binary op's
    src_1 only when it has src_0's rank and batch (a residual, not a broadcast operand)."""
    ids = set()
    for op in graph.ops:
        try:
            specs = get_opdef(op.kind).inputs
        except ConvgradError:
            continue  # reported when the graph is planned
        first = op.inputs[0].shape if op.inputs else ()
        ids.update(t.id for spec, t in zip(specs, op.inputs) if spec.role in ("x", "y", "data")
                   or (spec.role == "operand" and len(t.shape) == len(first) and t.shape[:1] == first[:1]))
    return ids & set(graph.input_ids())


def _swap_kind(op: GraphOp, kind: str) -> GraphOp:
    """``op`` as ``kind`` (--op-kind), keeping the attributes the new kind has."""
    try:
        old, new = get_opdef(op.kind), get_opdef(kind)
    except ConvgradError as exc:
        raise GraphError(f"--op-kind: {op.label}: {exc}") from None
    if old.family not in SWAPPABLE_FAMILIES:
        raise GraphError(f"--op-kind: {op.label}: only element-wise, element-wise backward and binary ops can "
                         "change kind")
    if new.family != old.family:
        raise GraphError(f"--op-kind: {op.label} -> {kind}: expected a kind of the same family "
                         f"({old.family.replace('_', ' ')}): one of {', '.join(ops_of(old.family))}")
    return replace(op, kind=new.kind, attrs={k: v for k, v in op.attrs.items() if k in new.attr_names})


def rewrite(graph: Graph, *, in_shapes: dict[int, InShape] | None = None,
            op_attrs: dict[int, dict[str, str]] | None = None, mb: int = 0,
            dt: dict[int | None, str] | None = None, op_kind: dict[int, str] | None = None) -> Graph:
    """The graph with the rewrites applied to its op kinds, inputs, attributes and dtypes."""
    kinds = op_kind or {}
    unknown_kind_ops = set(kinds) - {op.id for op in graph.ops}
    if unknown_kind_ops:
        raise GraphError(f"--op-kind: op {sorted(unknown_kind_ops)[0]} is not in the graph: expected one of "
                         f"{describe([op.id for op in graph.ops])}")
    graph = replace(graph, ops=tuple(_swap_kind(op, kinds[op.id]) if op.id in kinds else op for op in graph.ops))
    inputs = graph.input_ids()
    changed: dict[int, LogicalTensor] = {}
    for tid, (shape, tag) in (in_shapes or {}).items():
        if tid not in inputs:
            where = "is produced by an op" if tid in graph.producers() else "is not in the graph"
            raise GraphError(f"--in-shapes: tensor {tid} {where}: expected a graph input, one of "
                             f"{describe(inputs)}")
        tensor = graph.tensor(tid)
        shape = tensor.shape if shape is None else shape
        if tag is not None and len(tag) != len(shape):
            raise GraphError(f"--in-shapes: tag {tag!r} for tensor {tid}: expected {len(shape)} letters "
                             f"for shape {list(shape)}")
        stride = dense_strides(shape, tuple(ord(c) - ord("a") for c in tag)) if tag else None
        changed[tid] = replace(tensor, shape=shape, stride=stride)
    if mb:
        for tid in _data_input_ids(graph):
            tensor = changed.get(tid, graph.tensor(tid))
            if tensor.shape and tensor.shape[0] != mb:
                changed[tid] = restride(tensor, (mb, *tensor.shape[1:]))
    dt = dt or {}
    unknown = set(dt) - {None} - {t.id for op in graph.ops for t in (*op.inputs, *op.outputs)}
    if unknown:
        raise GraphError(f"--dt: tensor {sorted(unknown)[0]} is not in the graph")

    def new_tensor(t: LogicalTensor) -> LogicalTensor:
        t = changed.get(t.id, t)
        dtype = dt.get(t.id, dt.get(None, t.dtype)) if t.dtype in FLOAT_DTYPES else t.dtype
        return replace(t, dtype=dtype)

    attrs = op_attrs or {}
    unknown_ops = set(attrs) - {op.id for op in graph.ops}
    if unknown_ops:
        raise GraphError(f"--op-attrs: op {sorted(unknown_ops)[0]} is not in the graph: expected one of "
                         f"{describe([op.id for op in graph.ops])}")
    ops = tuple(replace(op, attrs={**op.attrs, **{k: _attr_value(op, k, v) for k, v in attrs.get(op.id, {}).items()}},
                        inputs=tuple(map(new_tensor, op.inputs)), outputs=tuple(map(new_tensor, op.outputs)))
                for op in graph.ops)
    return replace(graph, ops=ops)
