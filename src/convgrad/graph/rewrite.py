"""benchdnn graph driver rewrites: ``--in-shapes``, ``--op-attrs``, ``--mb`` and ``--dt``.

- ``--in-shapes=ID:SHAPE[*TAG][+ID:...]``: a graph input's shape (``2x64x56x56``, rank may change;
  ``-`` a 0-d tensor, ``0`` a 1-D empty one) and/or memory order (``ID:TAG`` or ``ID:*TAG``;
  ``abcd`` row-major, ``acdb`` channels-last), or its strides in full (``*200704x1x3584x64``).
  A shape without a tag is dense row-major.
- ``--op-attrs=OPID:NAME:VALUE[*NAME:VALUE][+OPID:...]``: an op's attribute; lists as ``2x2``.
  Names and value types come from the op table (:mod:`convgrad.opdefs`).
- ``--mb=N``: the batch (axis 0) of every graph input that is an op's data tensor (not weights,
  bias or shape tensors); applied after ``--in-shapes``, so it takes precedence. 0: as in the file.
- ``--dt=DT`` every floating-point tensor, or ``--dt=ID:DT[+ID:DT]`` single tensors (``undef``: as in the file).
- ``--tensor-property=ID:PROPERTY[+...]``: a tensor's property_type (undef, variable, constant,
  host_scalar; recorded, it changes nothing convgrad computes).
- ``--attr-fpmath=MODE[:APPLY_TO_INT][,...]``: checked (:func:`parse_fpmath`); every mode runs as strict.
- ``--op-kind=OPID:KIND[+OPID:KIND]``: another kind for an element-wise, element-wise backward or
  binary op, of the same family (ReLU -> GELU, Add -> Multiply); attributes the new kind lacks are
  dropped, ones it requires come from ``--op-attrs`` (applied after the swap). ``undef`` removes
  such an op: its consumers read the tensor it passes on (src, src_0, diff_dst).

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
from .model import Graph, GraphError, GraphOp, LogicalTensor, _check_no_overlap, axis_order, dense_strides

__all__ = ["InShape", "parse_in_shapes", "parse_op_attrs", "parse_op_kind", "parse_dt", "parse_mb", "parse_fpmath",
           "parse_tensor_property", "rewrite", "restride", "FLOAT_DTYPES", "FPMATH_MODES"]

FLOAT_DTYPES = ("f32", "bf16", "f16")
_TAG = re.compile(r"[a-l]+")
_SHAPE = re.compile(r"-|[0-9]+(x[0-9]+)*")

#: (shape or None: the file's; memory order as a TAG like acdb, or strides in full, or None: dense)
InShape = tuple[tuple[int, ...] | None, str | tuple[int, ...] | None]


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
    """``--in-shapes`` value -> {tensor id: (shape or None, tag, strides or None)}."""
    out: dict[int, InShape] = {}
    for tid, spec in _pairs(text, "--in-shapes"):
        shape_text, star, tag = spec.partition("*")
        if not star and _TAG.fullmatch(spec):
            shape_text, tag = "", spec
        if star and _SHAPE.fullmatch(tag) and tag != "-":  # strides in full: *802816x25088x112x1
            shape = _parse_shape(shape_text, spec, tid)
            strides = tuple(integer(v, f"--in-shapes: tensor {tid} strides") for v in tag.split("x"))
            if shape is not None and len(strides) != len(shape):
                raise ValueError(f"--in-shapes: strides {shorten(tag, 80)!r} for tensor {tid}: expected {len(shape)} values, "
                                 f"one per axis of shape {'x'.join(map(str, shape)) or '-'}")
            out[int(tid)] = (shape, strides)
            continue
        shape = _parse_shape(shape_text, spec, tid)
        if star or tag:
            rank = len(shape) if shape is not None else len(tag)
            if not _TAG.fullmatch(tag or "") or sorted(tag) != [chr(ord("a") + i) for i in range(rank)]:
                raise ValueError(f"--in-shapes: tag {tag!r} for tensor {tid}: expected each of the first {rank} "
                                 "letters once (abcd = row-major, acdb = channels-last)")
        out[tid] = (shape, tag or None)
    return out


def _parse_shape(text: str, spec: str, tid: str) -> tuple[int, ...] | None:
    """The SHAPE part of an ``--in-shapes`` item (None if empty; ``-`` is 0-d)."""
    if not text:
        return None
    if not _SHAPE.fullmatch(text):
        raise ValueError(f"--in-shapes: {shorten(spec, 80)!r} for tensor {tid}: expected a shape like 2x64x56x56 (or - for "
                         "0-d), optionally *TAG or *STRIDES (2x64x56x56*acdb, *200704x1x3584x64), or a TAG like acdb")
    return () if text == "-" else tuple(integer(d, f"--in-shapes: tensor {tid}") for d in text.split("x"))


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
    """``--dt`` value -> {tensor id or None (= every floating-point tensor): dtype}; ``undef``: the
    file's dtypes (no entry)."""
    if text == "undef":
        return {}
    items = [(None, text)] if ":" not in text else list(_pairs(text, "--dt"))
    for _, dtype in items:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"--dt: {shorten(dtype, 80)!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    return dict(items)


FPMATH_MODES = ("strict", "bf16", "f16", "tf32", "any")
TENSOR_PROPERTIES = ("undef", "variable", "constant", "host_scalar")


def parse_fpmath(text: str) -> tuple[str, ...]:
    """``--attr-fpmath`` value: MODE[:APPLY_TO_INT][,MODE...] (oneDNN's fpmath modes). convgrad
    computes every mode as strict (f32 accumulation, no implicit down-conversion), which each mode
    allows, so the modes are checked and the case runs once for all of them."""
    modes = []
    for item in text.split(","):
        mode, colon, apply_to_int = item.partition(":")
        if mode.lower() not in FPMATH_MODES or (colon and apply_to_int.lower() not in ("true", "false")):
            raise ValueError(f"--attr-fpmath: {shorten(item, 80)!r}: expected MODE[:true|false] with MODE one of "
                             f"{', '.join(FPMATH_MODES)} (several separated by ,)")
        modes.append(mode.lower())
    return tuple(modes)


def parse_tensor_property(text: str) -> dict[int, str]:
    """``--tensor-property`` value -> {tensor id: property type}."""
    out = {}
    for tid, prop in _pairs(text, "--tensor-property"):
        if prop not in TENSOR_PROPERTIES:
            raise ValueError(f"--tensor-property: {shorten(prop, 80)!r} for tensor {tid}: expected one of "
                             f"{', '.join(TENSOR_PROPERTIES)}")
        out[int(tid)] = prop
    return out


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


def _data_input_ids(graph: Graph, changed: dict[int, LogicalTensor]) -> set[int]:
    """Graph inputs that some op uses as a data tensor (the ones ``--mb`` changes): a binary op's
    src_1 only when it has src_0's rank and batch (a residual, not a broadcast operand), as in the
    file or after ``--in-shapes`` (``changed``); where src_0's batch is unknown (-1, as dumps write
    inner tensors) a data tensor's batch."""
    shapes = lambda t: {t.shape, changed.get(t.id, t).shape}  # noqa: E731
    data, operands = set(), []
    for op in graph.ops:
        try:
            specs = get_opdef(op.kind).inputs
        except ConvgradError:
            continue  # reported when the graph is planned
        data.update(t for spec, t in zip(specs, op.inputs) if spec.role in ("x", "y", "data"))
        operands += [(t, op.inputs[0]) for spec, t in zip(specs, op.inputs) if spec.role == "operand"]
    batches = {s[0] for t in data for s in shapes(t) if s and s[0] >= 0}
    ids = {t.id for t in data}
    for t, partner in operands:
        if any(s and len(s) == len(p) and (s[0] == p[0] or (p[0] < 0 and s[0] in batches))
               for s in shapes(t) for p in shapes(partner)):
            ids.add(t.id)
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


def _remove_ops(graph: Graph, removed: set[int]) -> Graph:
    """The graph without the ops ``removed`` (``--op-kind=ID:undef``): each is an element-wise,
    element-wise backward or binary op whose consumers read, instead of its output, the tensor it
    passes on (src, src_0; diff_dst for a backward op), as if it were the identity."""
    through: dict[int, LogicalTensor] = {}  # removed op's output id -> the tensor read instead
    for op in graph.ops:
        if op.id not in removed:
            continue
        try:
            definition = get_opdef(op.kind)
        except ConvgradError as exc:
            raise GraphError(f"--op-kind: {op.label}: {exc}") from None
        if definition.family not in SWAPPABLE_FAMILIES:
            raise GraphError(f"--op-kind: {op.label} -> undef: only element-wise, element-wise backward and binary "
                             "ops can be removed (their output has their input's shape)")
        source = op.inputs[1 if definition.family == "eltwise_backward" else 0]
        through[op.outputs[0].id] = through.get(source.id, source)
    for out_id, source in list(through.items()):  # chains of removed ops, in any file order
        while source.id in through and through[source.id] is not source:
            source = through[source.id]
        through[out_id] = source
    ops = tuple(replace(op, inputs=tuple(through.get(t.id, t) for t in op.inputs)) for op in graph.ops
                if op.id not in removed)
    if not ops:
        raise GraphError("--op-kind: every op is removed (undef): nothing is left to run")
    return replace(graph, ops=ops)


def rewrite(graph: Graph, *, in_shapes: dict[int, InShape] | None = None,
            op_attrs: dict[int, dict[str, str]] | None = None, mb: int = 0,
            dt: dict[int | None, str] | None = None, op_kind: dict[int, str] | None = None,
            tensor_property: dict[int, str] | None = None) -> Graph:
    """The graph with the rewrites applied to its op kinds, inputs, attributes, dtypes and tensor
    properties."""
    kinds = op_kind or {}
    unknown_kind_ops = set(kinds) - {op.id for op in graph.ops}
    if unknown_kind_ops:
        raise GraphError(f"--op-kind: op {sorted(unknown_kind_ops)[0]} is not in the graph: expected one of "
                         f"{describe([op.id for op in graph.ops])}")
    graph = _remove_ops(graph, {op_id for op_id, kind in kinds.items() if kind.lower() == "undef"})
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
        what = "letters" if isinstance(tag, str) else "strides"
        if tag is not None and len(tag) != len(shape):
            raise GraphError(f"--in-shapes: {what} {tag!r} for tensor {tid}: expected {len(shape)} {what} "
                             f"for shape {list(shape)}")
        if isinstance(tag, tuple):
            _check_no_overlap(shape, tag, lambda msg: GraphError(f"--in-shapes: tensor {tid}: strides {msg}"))
        stride = tag if isinstance(tag, tuple) else dense_strides(shape, tuple(ord(c) - ord("a") for c in tag)) \
            if tag else None
        changed[tid] = replace(tensor, shape=shape, stride=stride)
    if mb:
        for tid in _data_input_ids(graph, changed):
            tensor = changed.get(tid, graph.tensor(tid))
            if tensor.shape and tensor.shape[0] != mb:
                changed[tid] = restride(tensor, (mb, *tensor.shape[1:]))
    dt = dt or {}
    properties = tensor_property or {}
    for option, ids in (("--dt", set(dt) - {None}), ("--tensor-property", set(properties))):
        unknown = ids - {t.id for op in graph.ops for t in (*op.inputs, *op.outputs)}
        if unknown:
            raise GraphError(f"{option}: tensor {sorted(unknown)[0]} is not in the graph")

    def new_tensor(t: LogicalTensor) -> LogicalTensor:
        t = changed.get(t.id, t)
        dtype = dt.get(t.id, dt.get(None, t.dtype)) if t.dtype in FLOAT_DTYPES else t.dtype
        return replace(t, dtype=dtype, property_type=properties.get(t.id, t.property_type))

    attrs = op_attrs or {}
    unknown_ops = set(attrs) - {op.id for op in graph.ops}
    if unknown_ops:
        raise GraphError(f"--op-attrs: op {sorted(unknown_ops)[0]} is not in the graph: expected one of "
                         f"{describe([op.id for op in graph.ops])}")
    ops = tuple(replace(op, attrs={**op.attrs, **{k: _attr_value(op, k, v) for k, v in attrs.get(op.id, {}).items()}},
                        inputs=tuple(map(new_tensor, op.inputs)), outputs=tuple(map(new_tensor, op.outputs)))
                for op in graph.ops)
    return replace(graph, ops=ops)
