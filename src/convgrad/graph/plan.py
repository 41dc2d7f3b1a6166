"""From a (rewritten) graph to an executable plan: ops in dependency order, every tensor's shape
re-inferred, and the values of shape tensors.

Shapes given as an input (``dst_shape``, ``weights_shape``, ``filter_shape`` at input index 2,
an s32 1-D graph input) and shape attributes are resolved by one rule, so that rewritten inputs
flow through: the spatial (or kernel) entries come from the op's shape attribute if it has one,
else from the op's output shape in the file; the batch and channel entries follow the op's data
inputs (diff_src: batch of diff_dst, channels of the weights; weights: the channels of the two
data inputs). The input form gets these values; an attribute form is updated to them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..dtypes import DATA_DTYPES, dtype_name
from ..attributes import parse_attributes, per_axis
from ..errors import ConvgradError, ShapeError, describe
from ..op import Op
from ..opdefs import OpDef, get_opdef
from ..problem import (Problem, TensorInfo, data_shape, input_size_range, split_data_shape,
                       split_weights_shape, weights_shape)
from ..tensor_ops import TensorProblem, build_tensor_problem
from .model import Graph, GraphError, GraphOp, LogicalTensor
from .rewrite import restride

__all__ = ["Step", "Plan", "plan_graph"]


@dataclass(frozen=True)
class Step:
    """One op ready to run: the convgrad op, its input ids in spec order, its output tensor."""

    source: GraphOp
    op: Op
    input_ids: tuple[int, ...]
    output: LogicalTensor
    problem: Problem | TensorProblem

    @property
    def is_convolution(self) -> bool:
        return isinstance(self.problem, Problem)


@dataclass(frozen=True)
class Plan:
    """A graph ready to run: steps in dependency order and the final description of every tensor."""

    graph: Graph
    steps: tuple[Step, ...]
    tensors: dict[int, LogicalTensor]
    inputs: tuple[int, ...]
    shape_values: dict[int, tuple[int, ...]]

    @property
    def flops(self) -> int:
        """FLOPs of the plan's convolutions (the other ops count none)."""
        return sum(step.problem.flops for step in self.steps)


def _order(graph: Graph) -> list[GraphOp]:
    """Ops in dependency order: in rounds, each the ops whose inputs the earlier rounds produce, in
    file order (Kahn's algorithm, O(ops + inputs) plus sorting each round); a cycle is an error."""
    producers = {op.outputs[0].id: index for index, op in enumerate(graph.ops)}
    waiting = [0] * len(graph.ops)  # per op: inputs not produced yet
    readers: dict[int, list[int]] = {}  # producer's index -> indices of the ops that wait for it
    for index, op in enumerate(graph.ops):
        for producer in {producers[t.id] for t in op.inputs if t.id in producers}:
            waiting[index] += 1
            readers.setdefault(producer, []).append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    order: list[GraphOp] = []
    while ready:
        order.extend(graph.ops[index] for index in ready)
        following = []
        for index in ready:
            for reader in readers.get(index, ()):
                waiting[reader] -= 1
                if not waiting[reader]:
                    following.append(reader)
        ready = sorted(following)
    if len(order) < len(graph.ops):
        cycle = [op.id for op, count in zip(graph.ops, waiting) if count]
        raise GraphError(f"{graph.source}: graph: ops {describe(cycle)} form a cycle (or wait for one)")
    return order


def _data_spatial(d: OpDef, attrs: dict[str, Any], y_spatial: tuple[int, ...],
                  kernel: tuple[int, ...]) -> tuple[int, ...]:
    """A forward input size whose output size is ``y_spatial`` (:func:`input_size_range`): the
    smallest, S*(O-1) + EK - PB - PE, with explicit pads (PB = PE = 0 with valid); the largest,
    S*O, with a same_* auto_pad (O = ceil(I / S): 56 from 28, as such files have it)."""
    parsed = parse_attributes(d, attrs)
    rank = len(y_spatial)
    strides, dilations = (per_axis(d, parsed, name, rank) for name in ("strides", "dilations"))
    mode = parsed.get("auto_pad", "none")
    pads = [(0,) * rank] * 2 if mode != "none" else [per_axis(d, parsed, p, rank) for p in ("pads_begin", "pads_end")]
    eff = tuple((k - 1) * dl + 1 for k, dl in zip(kernel, dilations))
    smallest, largest = input_size_range(y_spatial, strides, eff, *pads, mode)
    return largest if mode.startswith("same") else smallest


def _resolve_shape(d: OpDef, attrs: dict[str, Any], shapes: dict[str, tuple[int, ...]], base: tuple[int, ...],
                   fit: bool) -> tuple[int, ...]:
    """The shape attribute/input's values: batch and channels from the data inputs; kernel and spatial
    sizes from ``base``, or (``fit``, diff_src only) the spatial size that fits diff_dst."""
    parsed = parse_attributes(d, attrs)
    groups = parsed.get("groups", 1)
    data_format = str(parsed.get("data_format", d.attr("data_format").default)).upper()
    weights_format = str(parsed.get(d.weights_format_attr, d.attr(d.weights_format_attr).default)).upper()
    if d.output.role == "w":  # (OC, ICg, K): OC from y, ICg from x
        kernel = split_weights_shape(base, weights_format)[2]
        oc = split_data_shape(shapes["y"], data_format)[1]
        ic = split_data_shape(shapes["x"], data_format)[1]
        return weights_shape(oc, ic // groups, kernel, weights_format)
    n, _, y_spatial = split_data_shape(shapes["y"], data_format)  # diff_src: batch from y, channels from w
    _, icg, kernel = split_weights_shape(shapes["w"], weights_format)
    spatial = _data_spatial(d, attrs, y_spatial, kernel) if fit else split_data_shape(base, data_format)[2]
    return data_shape(n, icg * groups, spatial, data_format)


def _infer(op: GraphOp, d: OpDef, attrs: dict[str, Any], current: list[LogicalTensor],
           values: tuple[int, ...] | None) -> tuple[Op, Problem]:
    """The convgrad op and its resolved problem; shape ``values`` go to the input if there is one,
    else to the shape attribute."""
    has_input = any(spec.role == "shape" for spec in d.inputs[:len(current)])
    if values is not None and not has_input:
        attrs = {**attrs, d.shape_attr: list(values)}
    convop = Op(op.kind, **attrs)
    args = [values if spec.role == "shape" else t.shape for spec, t in zip(d.inputs, current)]
    # With no data input, the op's shape inference reports the missing input.
    dtype = next((t.dtype for spec, t in zip(d.inputs, current) if spec.role != "shape"), "f32")
    return convop, convop.infer(*args, dtype=DATA_DTYPES.get(dtype, "f32"))


def _plan_tensor_step(op: GraphOp, d: OpDef, tensors: dict[int, LogicalTensor]) -> Step:
    """A step of an op around the convolutions: output shape and dtype inferred from the inputs."""
    if len(op.inputs) != len(d.inputs):
        raise GraphError(f"{op.label}: has {len(op.inputs)} input{'s' * (len(op.inputs) != 1)}: expected "
                         f"{len(d.inputs)} ({', '.join(s.name for s in d.inputs)})")
    current = [tensors[t.id] for t in op.inputs]
    declared = op.outputs[0]
    for spec, t in zip(d.inputs, current):
        if t.dtype not in DATA_DTYPES:
            raise GraphError(f"{op.label}: input '{spec.name}' (tensor {t.id}) has dtype {t.dtype}: expected one "
                             f"of {', '.join(DATA_DTYPES)}")
    attrs = {"dtype": declared.dtype, **op.attrs} if d.family == "typecast" else op.attrs
    try:
        tensor_op = Op(op.kind, **attrs)
        problem = build_tensor_problem(d, tensor_op.attrs, [TensorInfo(t.shape, DATA_DTYPES[t.dtype]) for t in current])
    except ConvgradError as exc:
        raise GraphError(f"{op.label}: {exc}") from None
    produced = dtype_name(problem.output_dtype)
    if declared.dtype != produced:
        raise GraphError(f"{op.label}: output tensor {declared.id} has dtype {declared.dtype}: expected {produced}, "
                         f"the dtype {d.kind} produces" + ("" if d.family == "typecast" else " (its inputs')"))
    output = declared if declared.shape == problem.output_shape else restride(declared, problem.output_shape)
    return Step(op, tensor_op, tuple(t.id for t in op.inputs), output, problem)


def _plan_step(op: GraphOp, tensors: dict[int, LogicalTensor], inputs: set[int],
               shape_values: dict[int, tuple[int, ...]]) -> Step:
    try:
        d = get_opdef(op.kind)
    except ConvgradError as exc:
        raise GraphError(f"{op.label}: {exc}") from None
    if d.family != "convolution":
        return _plan_tensor_step(op, d, tensors)
    if len(op.inputs) > len(d.inputs):
        raise GraphError(f"{op.label}: has {len(op.inputs)} inputs: expected at most {len(d.inputs)} "
                         f"({', '.join(s.name for s in d.inputs)})")
    current = [tensors[t.id] for t in op.inputs]
    shapes = {spec.role: t.shape for spec, t in zip(d.inputs, current) if spec.role in ("x", "y", "w")}
    shape_input = next((t for spec, t in zip(d.inputs, current) if spec.role == "shape"), None)
    values = None
    try:
        shape_attr = parse_attributes(d, op.attrs).get(d.shape_attr) if d.shape_attr else None  # validated
        if (d.shape_attr is not None and len(shapes) == 2  # else the op reports the missing data input
                and (shape_input is not None or any(shape_attr or []))):
            base = tuple(shape_attr or ())
            base = base if any(base) else op.outputs[0].shape
            if len({len(shape) for shape in shapes.values()}) > 1:
                named = {spec.name: list(t.shape) for spec, t in zip(d.inputs, current) if spec.role in shapes}
                raise GraphError(f"{op.label}: inputs {named}: expected the same rank (N, C and the spatial axes)")
            if -1 in base or len(base) != len(next(iter(shapes.values()))):
                raise GraphError(f"{op.label}: '{d.shape_attr}' has no usable values ({list(base)}): give the "
                                 "attribute or the output tensor's shape")
            values = _resolve_shape(d, op.attrs, shapes, base, fit=False)
        try:
            convop, problem = _infer(op, d, op.attrs, current, values)
        except ShapeError:
            if values is None or d.output.role != "x":
                raise
            values = _resolve_shape(d, op.attrs, shapes, values, fit=True)
            convop, problem = _infer(op, d, op.attrs, current, values)
    except ConvgradError as exc:
        raise GraphError(f"{op.label}: {exc}") from None
    if shape_input is not None:
        if shape_input.id not in inputs or shape_input.dtype != "s32":
            raise GraphError(f"{op.label}: input '{d.inputs[2].name}' (tensor {shape_input.id}) must be an "
                             "s32 graph input")
        shape_values[shape_input.id] = values
        tensors[shape_input.id] = replace(shape_input, shape=(len(values),), stride=None)
    declared = op.outputs[0]
    if declared.dtype not in DATA_DTYPES:
        raise GraphError(f"{op.label}: output tensor {declared.id} has dtype {declared.dtype}: expected one of "
                         + ", ".join(DATA_DTYPES))
    output = declared if declared.shape == problem.output_shape else restride(declared, problem.output_shape)
    return Step(op, convop, tuple(t.id for t in op.inputs), output, problem)


def plan_graph(graph: Graph) -> Plan:
    """Order the ops, re-infer every shape and resolve shape tensors; errors name the op."""
    inputs = graph.input_ids()
    tensors = {tid: graph.tensor(tid) for tid in inputs}
    for tid in inputs:
        tensor = tensors[tid]
        if tensor.dtype != "s32" and any(s < 0 for s in tensor.shape):
            raise GraphError(f"{graph.source}: tensor {tid} is a graph input with unknown shape {list(tensor.shape)}")
        if tensor.dtype == "s32" and len(tensor.shape) != 1:
            raise GraphError(f"{graph.source}: tensor {tid} (s32) has shape {list(tensor.shape)}: expected a 1-D "
                             "shape tensor")
    shape_values: dict[int, tuple[int, ...]] = {}
    steps = []
    input_set = set(inputs)
    for op in _order(graph):
        step = _plan_step(op, tensors, input_set, shape_values)
        tensors[step.output.id] = step.output
        steps.append(step)
    stray = [tid for tid in inputs if tensors[tid].dtype == "s32" and tid not in shape_values]
    if stray:
        raise GraphError(f"{graph.source}: tensor {stray[0]} is s32 but is not the shape input (index 2) of an op")
    return Plan(graph, tuple(steps), tensors, tuple(inputs), shape_values)
