"""The ops around convolutions (element-wise, binary, BiasAdd, TypeCast, layout): shape and dtype
inference into a :class:`TensorProblem`, and its execution.

Execution: the reference engine computes in f64; any other engine takes the fast path, in f32 for
f32/bf16/f16 data (f64 for f64 data), vectorised NumPy (numba's erf for GELU). Either way the result
is rounded once, to nearest even, to the output dtype. Data movement (Reorder, StaticReshape,
StaticTranspose) copies values unchanged; TypeCast is that one rounding. The math lives in
:mod:`convgrad.eltwise`, :mod:`convgrad.binary` and :mod:`convgrad.layout_ops`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import binary, casts, eltwise
from .attributes import Attrs
from .dtypes import compute_dtype, dtype_name, parse_dtype, round_to
from .errors import AttributeValueError, DTypeError, InputError, MissingAttributeError, ShapeError
from .layout_ops import reshape_target, transpose_order
from .limits import check_bytes
from .opdefs import OpDef
from .problem import TensorInfo

__all__ = ["TensorProblem", "build_tensor_problem", "run_tensor_problem"]

_INT64_MAX = 2**63 - 1
_MOVES = ("reorder", "reshape", "transpose")


@dataclass(frozen=True)
class TensorProblem:
    """A resolved invocation of a non-convolution op: everything but the data."""

    definition: OpDef
    attrs: Attrs  # every attribute, defaults filled in
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtype: np.dtype  # shared by every input
    dtype: np.dtype  # of the output, as a convolution Problem's dtype
    output_shape: tuple[int, ...]

    @property
    def output_dtype(self) -> np.dtype:
        return self.dtype

    @property
    def op(self) -> str:
        return self.definition.kind

    @property
    def flops(self) -> int:
        """Convolution FLOPs (the graph runner's GFLOP/s count only those): none here."""
        return 0

    @property
    def reduction(self) -> int:
        """Number of values summed into one output element (BiasAddBackward), else 1."""
        if self.definition.family != "bias_add_backward":
            return 1
        return math.prod(self.input_shapes[0]) // max(self.output_shape[0], 1)

    def __repr__(self) -> str:
        return (f"TensorProblem({self.op}: {self.definition.output.name} {self.output_shape} "
                f"{dtype_name(self.output_dtype)})")


def _attributes(d: OpDef, given: Attrs) -> Attrs:
    """The given attributes with the table's defaults; a missing required one is an error."""
    attrs = {a.name: a.default for a in d.attributes if a.default is not None}
    attrs.update(given)
    for a in d.attributes:
        if a.required and a.name not in attrs:
            raise MissingAttributeError(d.kind, a.name, a.expected())
    if d.algorithm == "clamp" and attrs["min"] > attrs["max"]:
        raise AttributeValueError(d.kind, "max", attrs["max"], f"at least min = {attrs['min']}")
    return attrs


def _inputs(d: OpDef, infos: list[TensorInfo | None]) -> tuple[list[tuple[int, ...]], np.dtype]:
    """The input shapes (all inputs are required) and their common dtype."""
    if len(infos) > len(d.inputs):
        raise InputError(d.kind, None, f"takes {len(d.inputs)} input{'s' * (len(d.inputs) > 1)} "
                         f"({', '.join(s.name for s in d.inputs)}); {len(infos)} were given")
    given = dict(zip(d.inputs, infos))
    for spec in d.inputs:
        info = given.get(spec)
        if info is None or info.shape is None:
            raise InputError(d.kind, spec.name, "is required but was not given")
        if any(size < 0 for size in info.shape):
            raise ShapeError(d.kind, spec.name, f"has shape {list(info.shape)}: expected sizes >= 0")
    first = d.inputs[0]
    dtype = given[first].dtype
    for spec in d.inputs[1:]:
        if given[spec].dtype != dtype:
            raise DTypeError(d.kind, spec.name, f"has dtype {dtype_name(given[spec].dtype)}: expected "
                             f"{dtype_name(dtype)} like input '{first.name}' (all inputs share a dtype)")
    return [tuple(given[spec].shape) for spec in d.inputs], dtype


def _output_shape(d: OpDef, attrs: Attrs, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    names = [s.name for s in d.inputs]
    family, src = d.family, shapes[0]
    if family == "eltwise_backward" and shapes[1] != src:
        raise ShapeError(d.kind, names[1], f"has shape {list(shapes[1])}: expected {list(src)}, the shape of "
                         f"'{names[0]}'")
    if family == "binary":
        return binary.broadcast_shape(d.kind, (names[0], names[1]), (src, shapes[1]), attrs["auto_broadcast"])
    if family in ("bias_add", "bias_add_backward"):
        channels = src[binary.channel_axis(d.kind, names[0], src, attrs["data_format"])]
        if family == "bias_add_backward":
            return (channels,)
        if shapes[1] != (channels,):
            raise ShapeError(d.kind, "bias", f"has shape {list(shapes[1])}: expected [{channels}], one value per "
                             f"channel of src ({attrs['data_format']}: axis "
                             f"{binary.channel_axis(d.kind, names[0], src, attrs['data_format'])})")
    if family == "reshape":
        return reshape_target(d.kind, src, tuple(attrs["shape"]), attrs["special_zero"])
    if family == "transpose":
        return tuple(src[axis] for axis in transpose_order(d.kind, len(src), tuple(attrs["order"])))
    return src


def build_tensor_problem(d: OpDef, given: Attrs, infos: list[TensorInfo | None]) -> TensorProblem:
    """Resolve an invocation of a non-convolution op, or raise a convgrad error saying why not."""
    shapes, dtype = _inputs(d, infos)
    attrs = _attributes(d, given)
    output_shape = _output_shape(d, attrs, shapes)
    if math.prod(output_shape) * 8 > _INT64_MAX:
        raise ShapeError(d.kind, None, f"the output would have shape {list(output_shape)}: sizes beyond int64 "
                         "cannot be allocated or indexed")
    output_dtype = parse_dtype(attrs["dtype"]) if d.family == "typecast" else dtype
    return TensorProblem(d, attrs, tuple(shapes), dtype, output_dtype, output_shape)


def run_tensor_problem(problem: TensorProblem, arrays: list[np.ndarray], engine: Any) -> np.ndarray:
    """The op's result: f64 on the reference engine, else the fast path; one rounding to the output dtype."""
    d, attrs = problem.definition, problem.attrs
    elements = sum(math.prod(shape) for shape in problem.input_shapes) + math.prod(problem.output_shape)
    check_bytes(problem.op, f"running {problem.op} on shape {list(problem.output_shape)}", 3 * 8 * elements)
    if d.family in _MOVES:
        src = arrays[0]
        if d.family == "transpose":
            return np.transpose(src, transpose_order(d.kind, src.ndim, tuple(attrs["order"]))).copy()
        return np.array(src, copy=True).reshape(problem.output_shape)
    reference = getattr(engine, "name", None) == "reference"
    compute = np.dtype(np.float64) if reference else compute_dtype(problem.input_dtype)
    xs = [casts.astype(a, compute) for a in arrays]
    with np.errstate(all="ignore"):  # IEEE arithmetic: NaN and Inf propagate without warnings
        if d.family == "eltwise":
            result = eltwise.FORWARD[d.algorithm](xs[0], attrs)
        elif d.family == "eltwise_backward":
            result = eltwise.BACKWARD[d.algorithm](xs[0], xs[1], attrs)
        elif d.family == "binary":
            result = binary.BINARY[d.algorithm](xs[0], xs[1])
        elif d.family == "bias_add":
            result = binary.bias_add(xs[0], xs[1], attrs["data_format"])
        elif d.family == "bias_add_backward":
            result = binary.bias_add_backward(xs[0], attrs["data_format"])
        else:  # typecast
            result = xs[0]
    result = np.asarray(result, dtype=compute).reshape(problem.output_shape)
    if np.may_share_memory(result, arrays[0]):
        result = result.copy()  # never hand back the caller's memory
    return round_to(result, problem.output_dtype)
