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
from pathlib import Path
from typing import Any

from ..batch import read_text

__all__ = ["GraphError", "LogicalTensor", "GraphOp", "Graph", "load_graph", "parse_graph",
           "dense_strides", "axis_order", "storage_size", "TENSOR_DTYPES"]

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
        """The description of a tensor (its producer's, else its first consumer's)."""
        for op in self.ops:
            for t in op.outputs:
                if t.id == tensor_id:
                    return t
        return next(t for op in self.ops for t in op.inputs if t.id == tensor_id)


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
            raise self.fail(f"{where}.{key}", f"= {value!r}: expected {names}")
        return value

    def ints(self, value: list[Any], where: str, minimum: int) -> tuple[int, ...]:
        if any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
            raise self.fail(where, f"= {value!r}: expected integers >= {minimum}")
        return tuple(value)

    def tensor(self, obj: Any, where: str) -> LogicalTensor:
        if not isinstance(obj, dict):
            raise self.fail(where, f"= {obj!r}: expected a logical tensor object")
        tid = self.get(obj, "id", where, (int,))
        dtype = self.get(obj, "dtype", where, (str,))
        if dtype not in TENSOR_DTYPES:
            raise self.fail(f"{where}.dtype", f"= {dtype!r}: expected one of {', '.join(TENSOR_DTYPES)}")
        shape = self.ints(self.get(obj, "shape", where, (list,)), f"{where}.shape", -1)
        layout = self.get(obj, "layout_type", where, (str,), "strided")
        if layout not in _LAYOUT_TYPES:
            raise self.fail(f"{where}.layout_type", f"= {layout!r}: expected one of {', '.join(_LAYOUT_TYPES)}")
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
            raise self.fail(where, f"= {obj!r}: expected an object of {{type, value}} attributes")
        out = {}
        for name, spec in obj.items():
            at = f"{where}.{name}"
            if not isinstance(spec, dict):
                raise self.fail(at, f"= {spec!r}: expected {{\"type\": ..., \"value\": ...}}")
            kind = self.get(spec, "type", at, (str,))
            if kind not in _ATTR_TYPES:
                raise self.fail(f"{at}.type", f"= {kind!r}: expected one of {', '.join(_ATTR_TYPES)}")
            value = self.get(spec, "value", at, _ATTR_TYPES[kind])
            if kind.endswith("[]"):
                item = (int,) if kind == "s64[]" else (int, float)
                if any(isinstance(v, bool) or not isinstance(v, item) for v in value):
                    raise self.fail(f"{at}.value", f"= {value!r}: expected a list of {kind[:-2]} values")
            out[name] = value
        return out

    def op(self, obj: Any, where: str) -> GraphOp:
        if not isinstance(obj, dict):
            raise self.fail(where, f"= {obj!r}: expected an op object")
        op_id = self.get(obj, "id", where, (int,))
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


def parse_graph(document: Any, source: str) -> Graph:
    """A :class:`Graph` from a decoded JSON document (``source`` names it in errors)."""
    reader = _Reader(source)
    if not isinstance(document, dict):
        raise reader.fail("top level", "expected an object with a 'graph' list")
    ops = tuple(reader.op(o, f"graph[{i}]") for i, o in enumerate(reader.get(document, "graph", "top level", (list,))))
    if not ops:
        raise reader.fail("graph", "is empty: expected at least one op")
    ids = [op.id for op in ops]
    if len(set(ids)) != len(ids):
        raise reader.fail("graph", f"op ids {ids} are not unique")
    producers: dict[int, int] = {}
    for op in ops:
        tid = op.outputs[0].id
        if tid in producers:
            raise reader.fail(f"op {op.id} '{op.name}'.outputs[0].id",
                              f"tensor {tid} is produced by op {producers[tid]} already")
        producers[tid] = op.id
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
