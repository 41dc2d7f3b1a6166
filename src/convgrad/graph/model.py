"""oneDNN Graph JSON files: logical tensors (with strides) and ops, read into immutable objects.

A file looks like ``{"version": ..., "engine_kind": "cpu", "fpmath_mode": "strict", "graph": [op,
...]}``; an op has ``id``, ``name``, ``kind``, ``attrs`` (``{name: {"type": T, "value": V}}`` with T
one of s64, s64[], string, f32, f32[], bool) and ``inputs``/``outputs`` lists of logical tensors
(``id``, ``dtype``, ``shape``, ``stride``, ``layout_type``, ``property_type``). Tensor ids connect
ops: graph inputs are tensors no op produces, graph outputs tensors no op consumes. Every problem
raises :class:`GraphError` naming the file and the field (``graph[1].inputs[0].stride``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..batch import read_text
from ..errors import describe

__all__ = ["GraphError", "LogicalTensor", "GraphOp", "Graph", "load_graph", "parse_graph",
           "dense_strides", "axis_order", "storage_size", "TENSOR_DTYPES", "MAX_OPS", "MAX_ID"]

#: Most ops a graph may have (ordering and planning take time proportional to the ops).
MAX_OPS = 100_000
#: Largest op or tensor id (oneDNN's ids are size_t).
MAX_ID = 2**64 - 1

#: dtypes a logical tensor may have (data types, and s32 for shape tensors).
TENSOR_DTYPES = ("f32", "bf16", "f16", "f64", "s32")
_LAYOUT_TYPES = ("strided", "any", "undef")
_ATTR_TYPES: dict[str, tuple[type, ...]] = {
    "s64": (int,), "s64[]": (list,), "string": (str,), "f32": (int, float), "f32[]": (list,), "bool": (bool,),
}


class GraphError(ValueError):
    """A graph file, or a rewrite of it, that cannot be used; the message names file and field."""


def dense_strides(shape: tuple[int, ...], order: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Dense strides (in elements) with the axes laid out in ``order``, outermost first
    (default: row-major, i.e. tag ``abcd``)."""
    order = tuple(range(len(shape))) if order is None else order
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


def axis_order(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The axes from outermost to innermost memory order of ``stride`` (ties keep axis order)."""
    return tuple(sorted(range(len(stride)), key=lambda axis: -stride[axis]))


@dataclass(frozen=True)
class LogicalTensor:
    """One logical tensor: id, dtype, shape and strides in elements (``None``: dense row-major)."""

    id: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    layout_type: str = "strided"
    property_type: str = "undef"

    @property
    def strides(self) -> tuple[int, ...]:
        """The strides in effect (dense row-major when none were given)."""
        return self.stride if self.stride is not None else dense_strides(self.shape)

    @property
    def is_dense(self) -> bool:
        return self.strides == dense_strides(self.shape)


@dataclass(frozen=True)
class GraphOp:
    """One op of the graph as written in the file."""

    id: int
    name: str
    kind: str
    attrs: dict[str, Any]
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]

    @property
    def label(self) -> str:
        """How messages name the op: ``op 0 'CONV_0' (ConvolutionBackwardWeights)``."""
        return f"op {self.id} '{self.name}' ({self.kind})"


@dataclass(frozen=True)
class Graph:
    """A whole graph: ops in file order plus the file's header fields."""

    ops: tuple[GraphOp, ...]
    source: str = ""
    version: str = ""
    engine_kind: str = "cpu"
    fpmath_mode: str = "strict"
    constants: tuple[tuple[int, float], ...] = ()  # (tensor id, value): inputs filled with one value

    def producers(self) -> dict[int, GraphOp]:
        """Tensor id -> the op that produces it."""
        return {t.id: op for op in self.ops for t in op.outputs}

    def input_ids(self) -> list[int]:
        """Graph inputs (consumed, produced by no op), in order of first use."""
        produced = self.producers()
        ids = [t.id for op in self.ops for t in op.inputs if t.id not in produced]
        return list(dict.fromkeys(ids))

    def output_ids(self) -> list[int]:
        """Graph outputs (produced, consumed by no op)."""
        consumed = {t.id for op in self.ops for t in op.inputs}
        return [t.id for op in self.ops for t in op.outputs if t.id not in consumed]

    def tensor(self, tensor_id: int) -> LogicalTensor:
        """The description of a tensor (its producer's, else its first consumer's); KeyError if no
        op has it."""
        return self._tensors[tensor_id]

    @cached_property
    def _tensors(self) -> dict[int, LogicalTensor]:
        tensors = {t.id: t for op in reversed(self.ops) for t in reversed(op.inputs)}
        tensors.update({t.id: t for op in self.ops for t in op.outputs})
        return tensors


class _Reader:
    """Reads one file; ``fail`` raises a GraphError naming the file and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> GraphError:
        return GraphError(f"{self.source}: {where}: {message}")

    def get(self, obj: dict[str, Any], key: str, where: str, kinds: tuple[type, ...], default: Any = ...) -> Any:
        if key not in obj:
            if default is ...:
                raise self.fail(where, f"field '{key}' is missing")
            return default
        value = obj[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(f"{where}.{key}", f"= {describe(value)}: expected {names}")
        return value

    def ints(self, value: list[Any], where: str, minimum: int) -> tuple[int, ...]:
        if any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
            raise self.fail(where, f"= {describe(value)}: expected integers >= {minimum}")
        return tuple(value)

    def id(self, obj: dict[str, Any], where: str) -> int:
        value = self.get(obj, "id", where, (int,))
        if not 0 <= value <= MAX_ID:
            raise self.fail(f"{where}.id", f"= {describe(value)}: expected 0 to 2^64 - 1 (a size_t)")
        return value

    def tensor(self, obj: Any, where: str) -> LogicalTensor:
        if not isinstance(obj, dict):
            raise self.fail(where, f"= {describe(obj)}: expected a logical tensor object")
        tid = self.id(obj, where)
        dtype = self.get(obj, "dtype", where, (str,))
        if dtype not in TENSOR_DTYPES:
            raise self.fail(f"{where}.dtype", f"= {describe(dtype)}: expected one of {', '.join(TENSOR_DTYPES)}")
        shape = self.ints(self.get(obj, "shape", where, (list,)), f"{where}.shape", -1)
        layout = self.get(obj, "layout_type", where, (str,), "strided")
        if layout not in _LAYOUT_TYPES:
            raise self.fail(f"{where}.layout_type", f"= {describe(layout)}: expected one of {', '.join(_LAYOUT_TYPES)}")
        stride: tuple[int, ...] | None = self.ints(self.get(obj, "stride", where, (list,), []), f"{where}.stride", -1)
        if layout != "strided" or not stride or -1 in stride or -1 in shape:
            stride = None
        elif len(stride) != len(shape):
            raise self.fail(f"{where}.stride", f"= {list(stride)}: expected {len(shape)} values, one per axis of "
                            f"shape {list(shape)}")
        else:
            _check_no_overlap(shape, stride, lambda msg: self.fail(f"{where}.stride", msg))
        prop = self.get(obj, "property_type", where, (str,), "undef")
        return LogicalTensor(tid, dtype, shape, stride, layout, prop)

    def attrs(self, obj: Any, where: str) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(where, f"= {describe(obj)}: expected an object of {{type, value}} attributes")
        out = {}
        for name, spec in obj.items():
            at = f"{where}.{name}"
            if not isinstance(spec, dict):
                raise self.fail(at, f"= {describe(spec)}: expected {{\"type\": ..., \"value\": ...}}")
            kind = self.get(spec, "type", at, (str,))
            if kind not in _ATTR_TYPES:
                raise self.fail(f"{at}.type", f"= {describe(kind)}: expected one of {', '.join(_ATTR_TYPES)}")
            value = self.get(spec, "value", at, _ATTR_TYPES[kind])
            if kind.endswith("[]"):
                item = (int,) if kind == "s64[]" else (int, float)
                if any(isinstance(v, bool) or not isinstance(v, item) for v in value):
                    raise self.fail(f"{at}.value", f"= {describe(value)}: expected a list of {kind[:-2]} values")
            out[name] = value
        return out

    def op(self, obj: Any, where: str) -> GraphOp:
        if not isinstance(obj, dict):
            raise self.fail(where, f"= {describe(obj)}: expected an op object")
        op_id = self.id(obj, where)
        name = self.get(obj, "name", where, (str,), "")
        where = f"{where} (op {op_id} '{name}')"
        kind = self.get(obj, "kind", where, (str,))
        attrs = self.attrs(self.get(obj, "attrs", where, (dict,), {}), f"{where}.attrs")
        inputs = tuple(self.tensor(t, f"{where}.inputs[{i}]")
                       for i, t in enumerate(self.get(obj, "inputs", where, (list,))))
        outputs = tuple(self.tensor(t, f"{where}.outputs[{i}]")
                        for i, t in enumerate(self.get(obj, "outputs", where, (list,))))
        if len(outputs) != 1:
            raise self.fail(f"{where}.outputs", f"has {len(outputs)} tensors: expected 1 (every supported "
                            "op has one output)")
        return GraphOp(op_id, name, kind, attrs, inputs, outputs)


def _check_no_overlap(shape: tuple[int, ...], stride: tuple[int, ...], fail: Any) -> None:
    """Strides must give every element its own memory (padding between them is fine)."""
    if 0 in shape:
        return
    extent = 1
    for axis in reversed(axis_order(stride)):
        if shape[axis] == 1:
            continue
        if stride[axis] < extent:
            raise fail(f"= {list(stride)}: elements of shape {list(shape)} would overlap (axis {axis} has stride "
                       f"{stride[axis]}, the axes inside it span {extent})")
        extent = stride[axis] * shape[axis]


def _check_declarations(reader: _Reader, ops: tuple[GraphOp, ...]) -> None:
    """Every declaration of a tensor id gives the dtype and shape of the first one (its producer's,
    else its first reader's; -1 matches any size)."""
    declared = {op.outputs[0].id: (op.outputs[0], f"op {op.id} '{op.name}'.outputs[0]") for op in ops}
    for op in ops:
        for i, t in enumerate(op.inputs):
            where = f"op {op.id} '{op.name}'.inputs[{i}]"
            first, first_where = declared.setdefault(t.id, (t, where))
            same_shape = len(t.shape) == len(first.shape) and all(
                a == b or -1 in (a, b) for a, b in zip(t.shape, first.shape))
            if t.dtype != first.dtype or not same_shape:
                raise reader.fail(where, f"tensor {t.id} is declared {t.dtype} {describe(list(t.shape))} here and "
                                  f"{first.dtype} {describe(list(first.shape))} by {first_where}: expected one "
                                  "dtype and shape per tensor id")


def parse_graph(document: Any, source: str) -> Graph:
    """A :class:`Graph` from a decoded JSON document (``source`` names it in errors)."""
    reader = _Reader(source)
    if not isinstance(document, dict):
        raise reader.fail("top level", "expected an object with a 'graph' list")
    items = reader.get(document, "graph", "top level", (list,))
    if len(items) > MAX_OPS:
        raise reader.fail("graph", f"has {len(items)} ops: expected at most {MAX_OPS}")
    ops = tuple(reader.op(o, f"graph[{i}]") for i, o in enumerate(items))
    if not ops:
        raise reader.fail("graph", "is empty: expected at least one op")
    first: dict[int, int] = {}
    for index, op in enumerate(ops):
        if first.setdefault(op.id, index) != index:
            raise reader.fail(f"graph[{index}].id", f"op id {op.id} is already the id of graph[{first[op.id]}]: "
                              "expected unique op ids")
    producers: dict[int, int] = {}
    for op in ops:
        tid = op.outputs[0].id
        if tid in producers:
            raise reader.fail(f"op {op.id} '{op.name}'.outputs[0].id",
                              f"tensor {tid} is produced by op {producers[tid]} already")
        producers[tid] = op.id
    _check_declarations(reader, ops)
    return Graph(ops, source, str(document.get("version", "")), str(document.get("engine_kind", "cpu")),
                 str(document.get("fpmath_mode", "strict")))


def load_graph(path: str | Path) -> Graph:
    """Read a oneDNN Graph JSON file."""
    source = str(path)
    try:
        text = read_text(Path(path))
    except OSError as exc:
        raise GraphError(f"{source}: cannot read the case file ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise GraphError(f"{source}: {exc}: expected a JSON file") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # integers over Python's digit limit, deep nesting
        raise GraphError(f"{source}: not usable JSON ({exc})") from None
    return parse_graph(document, source)


def storage_size(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements a buffer needs to hold ``shape`` with ``stride`` (0 for an empty tensor)."""
    if math.prod(shape) == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))
