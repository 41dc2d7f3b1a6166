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

from ..dtypes import DATA_DTYPES
from ..errors import ConvgradError
from ..op import Op
from ..opdefs import OpDef, get_opdef
from ..problem import Problem, data_shape, split_data_shape, split_weights_shape, weights_shape
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
    problem: Problem


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
        return sum(step.problem.geometry.flops for step in self.steps)


def _order(graph: Graph) -> list[GraphOp]:
    """Ops in dependency order (file order among ready ops); a cycle is an error."""
    producers = graph.producers()
    done: set[int] = set()
    order: list[GraphOp] = []
    pending = list(graph.ops)
    while pending:
        ready = [op for op in pending if all(t.id not in producers or t.id in done for t in op.inputs)]
        if not ready:
            raise GraphError(f"{graph.source}: graph: ops {[op.id for op in pending]} form a cycle")
        for op in ready:
            order.append(op)
            done.add(op.outputs[0].id)
        pending = [op for op in pending if op not in ready]
    return order


def _resolve_shape(d: OpDef, attrs: dict[str, Any], shapes: dict[str, tuple[int, ...]], base: tuple[int, ...],
                   label: str) -> tuple[int, ...]:
    """The shape attribute/input's values: spatial/kernel from ``base``, batch and channels from the data."""
    groups = attrs.get("groups", 1)
    data_format = str(attrs.get("data_format", d.attr("data_format").default)).upper()
    weights_format = str(attrs.get(d.weights_format_attr, d.attr(d.weights_format_attr).default)).upper()
    try:
        if d.output.role == "w":  # (OC, ICg, K): OC from y, ICg from x
            _, _, kernel = split_weights_shape(base, weights_format)
            oc = split_data_shape(shapes["y"], data_format)[1]
            ic = split_data_shape(shapes["x"], data_format)[1]
            return weights_shape(oc, ic // groups, kernel, weights_format)
        _, _, spatial = split_data_shape(base, data_format)  # diff_src: batch from y, channels from w
        n = split_data_shape(shapes["y"], data_format)[0]
        icg = split_weights_shape(shapes["w"], weights_format)[1]
        return data_shape(n, icg * groups, spatial, data_format)
    except (IndexError, TypeError, KeyError):
        raise GraphError(f"{label}: cannot derive '{d.shape_attr}' from base {list(base)} and the input "
                         f"shapes") from None


def _plan_step(op: GraphOp, tensors: dict[int, LogicalTensor], inputs: set[int],
               shape_values: dict[int, tuple[int, ...]]) -> Step:
    try:
        d = get_opdef(op.kind)
    except ConvgradError as exc:
        raise GraphError(f"{op.label}: {exc}") from None
    if len(op.inputs) > len(d.inputs):
        raise GraphError(f"{op.label}: has {len(op.inputs)} inputs: expected at most {len(d.inputs)} "
                         f"({', '.join(s.name for s in d.inputs)})")
    current = [tensors[t.id] for t in op.inputs]
    shapes = {spec.role: t.shape for spec, t in zip(d.inputs, current) if spec.role in ("x", "y", "w")}
    attrs = dict(op.attrs)
    shape_input = next((t for spec, t in zip(d.inputs, current) if spec.role == "shape"), None)
    if d.shape_attr is not None and (shape_input is not None or any(attrs.get(d.shape_attr) or [])):
        base = tuple(attrs.get(d.shape_attr) or ())
        if not any(base):
            base = op.outputs[0].shape
        if -1 in base or not base:
            raise GraphError(f"{op.label}: '{d.shape_attr}' has no values: give the attribute or the output "
                             "tensor's shape")
        values = _resolve_shape(d, attrs, shapes, base, op.label)
        if shape_input is None:
            attrs[d.shape_attr] = list(values)
        elif shape_input.id not in inputs or shape_input.dtype != "s32":
            raise GraphError(f"{op.label}: input '{d.inputs[2].name}' (tensor {shape_input.id}) must be an "
                             "s32 graph input")
        else:
            shape_values[shape_input.id] = values
            tensors[shape_input.id] = replace(shape_input, shape=(len(values),), stride=None)
    try:
        convop = Op(op.kind, **attrs)
        args = [shape_values[t.id] if spec.role == "shape" else t.shape for spec, t in zip(d.inputs, current)]
        data_dtypes = [t.dtype for spec, t in zip(d.inputs, current) if spec.role != "shape"]
        problem = convop.infer(*args, dtype=DATA_DTYPES.get(data_dtypes[0], "f32"))
    except ConvgradError as exc:
        raise GraphError(f"{op.label}: {exc}") from None
    declared = op.outputs[0]
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
    for op in _order(graph):
        step = _plan_step(op, tensors, set(inputs), shape_values)
        tensors[step.output.id] = step.output
        steps.append(step)
    stray = [tid for tid in inputs if tensors[tid].dtype == "s32" and tid not in shape_values]
    if stray:
        raise GraphError(f"{graph.source}: tensor {stray[0]} is s32 but is not the shape input (index 2) of an op")
    return Plan(graph, tuple(steps), tensors, tuple(inputs), shape_values)
