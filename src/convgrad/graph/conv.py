"""benchdnn convolution problems (``--dir`` + descriptor + options) as graphs, so that
``convgrad conv`` shares everything after this point with ``convgrad graph``.

Directions: FWD_D and FWD_I (Convolution: inference computes the same math), FWD_B (Convolution with
bias), BWD_D (ConvolutionBackwardData), BWD_W (ConvolutionBackwardWeights), BWD_WB (the weights
gradient and BiasAddBackward on the same diff_dst: diff_bias[c] = sum of diff_dst over every axis
but the channel axis). ``layout`` ``nxc`` gives the ops NXC data with XIO weights (oneDNN Graph's
defaults), ``ncx`` NCX data with OIX weights; memory tags (:mod:`.tags`) set the strides of the
tensors the user sees.

Data types: ``src``, ``wei`` and ``dst`` apply to src/diff_src, weights/diff_weights and
dst/diff_dst, ``bias`` to bias/diff_bias. When every type involved (post-op operands included) is
the same, the ops run in it. Otherwise, and for post-ops on bf16/f16 data, they run in f32: inputs
are widened by TypeCast (exact), the convolution and its post-ops compute in f32 and each output is
rounded once to its own type by a final TypeCast. Every op is checked against the reference engine in its own type, so the tolerance of
the rounding follows the lowest precision involved.

Post-ops (:mod:`.post_ops`) follow the forward convolution as graph ops in the compute type, in
the order given, before the final rounding; a ``dw`` entry rounds to the conv's dst type and runs a
depthwise convolution (itself a forward stage with its own bias and the remaining post-ops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..descriptor import ConvDescriptor
from ..problem import data_shape, weights_shape
from .model import Graph, GraphOp, LogicalTensor
from .post_ops import PostOp, mask_dims
from .tags import tag_strides

__all__ = ["DIRECTIONS", "ConvSetup", "descriptor_graph"]

#: --dir value -> the convolution op it runs.
DIRECTIONS: dict[str, str] = {
    "FWD_B": "Convolution", "FWD_D": "Convolution", "FWD_I": "Convolution",
    "BWD_D": "ConvolutionBackwardData", "BWD_W": "ConvolutionBackwardWeights", "BWD_WB": "ConvolutionBackwardWeights",
}
_WITH_BIAS = ("FWD_B", "BWD_WB")


@dataclass(frozen=True)
class ConvSetup:
    """Everything besides the descriptor that shapes the graph of one conv case."""

    direction: str = "FWD_B"
    src_dt: str = "f32"
    wei_dt: str = "f32"
    dst_dt: str = "f32"
    bias_dt: str = "f32"
    layout: str = "nxc"
    stag: str = "any"
    wtag: str = "any"
    dtag: str = "any"
    post_ops: tuple[PostOp, ...] = ()

    def compute_dtype(self) -> str:
        """The type the ops run in: the one type involved, else (mixed types, or post-ops on bf16/f16
        data, which oneDNN applies to the f32 accumulator) f32."""
        used = {self.src_dt, self.wei_dt, self.dst_dt}
        used |= {self.bias_dt} if self.direction in _WITH_BIAS else set()
        used |= {p.dt for p in self.post_ops if p.dt}
        one = len(used) == 1 and not (self.post_ops and used & {"bf16", "f16"})
        return used.pop() if one else "f32"


@dataclass
class _Builder:
    """Collects tensors and ops with fresh ids."""

    setup: ConvSetup
    compute: str
    ops: list[GraphOp] = field(default_factory=list)
    constants: dict[int, float] = field(default_factory=dict)
    next_id: int = 0

    def tensor(self, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> LogicalTensor:
        self.next_id += 1
        return LogicalTensor(self.next_id - 1, dtype, tuple(shape), stride)

    def op(self, kind: str, attrs: dict[str, Any], inputs: tuple[LogicalTensor, ...], out: LogicalTensor,
           name: str = "") -> LogicalTensor:
        self.ops.append(GraphOp(len(self.ops), name or kind, kind, attrs, inputs, (out,)))
        return out

    def widen(self, tensor: LogicalTensor) -> LogicalTensor:
        """``tensor`` in the compute type (a TypeCast when it is another type)."""
        if tensor.dtype == self.compute:
            return tensor
        return self.op("TypeCast", {}, (tensor,), self.tensor(self.compute, tensor.shape))

    def store(self, value: LogicalTensor, out: LogicalTensor) -> LogicalTensor:
        """``value`` (the last op's output) as the user's tensor ``out``: rounded once by a TypeCast
        to another type, else the last op writes ``out`` (with its strides) directly."""
        if value.dtype != out.dtype:
            return self.op("TypeCast", {}, (value,), out)
        if out.stride is None:
            return value
        last = self.ops[-1]
        self.ops[-1] = GraphOp(last.id, last.name, last.kind, last.attrs, last.inputs, (out,))
        return out


def _formats(layout: str) -> tuple[str, str]:
    return ("NXC", "XIO") if layout == "nxc" else ("NCX", "OIX")


def _data_axes(rank: int, data_format: str) -> list[str]:
    spatial = ["d", "h", "w"][3 - rank:]
    return ["n", *spatial, "c"] if data_format == "NXC" else ["n", "c", *spatial]


def _weights_axes(rank: int, weights_format: str, grouped: bool) -> list[str]:
    spatial = ["d", "h", "w"][3 - rank:]
    o = "O" if grouped else "o"
    return [*spatial, "i", o] if weights_format == "XIO" else [o, "i", *spatial]


def _conv_attrs(desc: ConvDescriptor, layout: str) -> dict[str, Any]:
    data_format, weights_format = _formats(layout)
    return {"strides": list(desc.strides), "pads_begin": list(desc.pads_begin), "pads_end": list(desc.pads_end),
            "dilations": list(desc.dilations), "groups": desc.groups, "auto_pad": "None",
            "data_format": data_format, "weights_format": weights_format}


def _user_tensor(b: _Builder, dtype: str, shape: tuple[int, ...], option: str, axes: list[str],
                 tag: str | None = None) -> LogicalTensor:
    """A tensor the user sees, laid out as the tag of ``option`` (stag, wtag, dtag) or ``tag``."""
    tag = getattr(b.setup, option) if tag is None else tag
    try:
        stride = tag_strides(tag, "weights" if option == "wtag" else "data", shape, axes)
    except ValueError as exc:
        raise ValueError(f"--{option}: {exc}") from None
    return b.tensor(dtype, shape, stride)


def _operand_shape(post_op: PostOp, dst_shape: tuple[int, ...], axes: list[str]) -> tuple[int, ...]:
    """A binary/prelu operand's shape: the dst's size along the dims its mask names, else 1."""
    benchdnn = ["n", "c", *[a for a in ("d", "h", "w") if a in axes]]
    spans = {benchdnn[d] for d in mask_dims(post_op, len(benchdnn))}
    return tuple(size if axis in spans else 1 for size, axis in zip(dst_shape, axes))


def _post_op(b: _Builder, post_op: PostOp, value: LogicalTensor, axes: list[str], dst_dt: str) -> LogicalTensor:
    """Apply one non-dw post-op to ``value`` (compute type)."""
    c, shape = b.compute, value.shape
    if post_op.family == "eltwise":
        return b.op(post_op.op_kind, dict(post_op.attrs), (value,), b.tensor(c, shape), post_op.text)
    if post_op.family == "sum":
        previous = b.widen(b.tensor(post_op.dt or dst_dt, shape))
        if post_op.scale != 1.0:
            scale = b.tensor(c, (1,) * len(shape))
            b.constants[scale.id] = post_op.scale
            previous = b.op("Multiply", {}, (previous, scale), b.tensor(c, shape), post_op.text)
        return b.op("Add", {}, (value, previous), b.tensor(c, shape), post_op.text)
    operand_shape = _operand_shape(post_op, shape, axes)
    try:
        stride = tag_strides(post_op.tag, "data", operand_shape, axes)
    except ValueError as exc:
        raise ValueError(f"--attr-post-ops: {post_op.text!r}: {exc}") from None
    operand = b.widen(b.tensor(post_op.dt, operand_shape, stride))
    if post_op.family == "binary":
        return b.op(post_op.op_kind, {}, (value, operand), b.tensor(c, shape), post_op.text)
    # prelu: max(x, 0) + w * min(x, 0), each value rounded once
    positive = b.op("ReLU", {}, (value,), b.tensor(c, shape), post_op.text)
    negative = b.op("Subtract", {}, (value, positive), b.tensor(c, shape), post_op.text)
    scaled = b.op("Multiply", {}, (negative, operand), b.tensor(c, shape), post_op.text)
    return b.op("Add", {}, (positive, scaled), b.tensor(c, shape), post_op.text)


def _dw_descriptor(desc: ConvDescriptor, post_op: PostOp) -> ConvDescriptor:
    """The depthwise convolution a dw post-op runs on ``desc``'s output (benchdnn's fused conv:
    output ceil(O / S) per axis, the right pad what that output needs)."""
    k, s, p = post_op.kernel, post_op.stride, post_op.padding
    rank = desc.rank
    out = tuple(-(-o // s) for o in desc.out_size)
    pads_end = tuple((oo - 1) * s + k - i - p for oo, i in zip(out, desc.out_size))
    if any(pe < 0 for pe in pads_end):
        raise ValueError(f"--attr-post-ops: {post_op.text!r}: the depthwise window does not reach the end of "
                         f"the {list(desc.out_size)} input (right padding {list(pads_end)})")
    return ConvDescriptor(desc.n, desc.oc, desc.oc, desc.oc, desc.out_size, out, (k,) * rank, (s,) * rank,
                          (1,) * rank, (p,) * rank, pads_end, f"{desc.name}:dw" if desc.name else "dw")


def _forward(b: _Builder, desc: ConvDescriptor, src: LogicalTensor, wtag: str, post_ops: tuple[PostOp, ...],
             name: str) -> LogicalTensor:
    """A forward stage: weights (laid out as ``wtag``) and bias inputs, the convolution and its
    post-ops; the value before its final rounding (compute type)."""
    s = b.setup
    data_format, weights_format = _formats(s.layout)
    grouped = desc.groups > 1
    w_shape = weights_shape(desc.oc, desc.ic // desc.groups, desc.kernel, weights_format)
    weights = _user_tensor(b, s.wei_dt, w_shape, "wtag", _weights_axes(desc.rank, weights_format, grouped), wtag)
    inputs = (b.widen(src), b.widen(weights))
    if s.direction == "FWD_B":
        inputs += (b.widen(b.tensor(s.bias_dt, (desc.oc,))),)
    dst_shape = data_shape(desc.n, desc.oc, desc.out_size, data_format)
    value = b.op("Convolution", _conv_attrs(desc, s.layout), inputs, b.tensor(b.compute, dst_shape), name)
    axes = _data_axes(desc.rank, data_format)
    for at, post_op in enumerate(post_ops):
        if post_op.family == "dw":
            rounded = b.store(value, b.tensor(s.dst_dt, dst_shape))
            dw = _dw_descriptor(desc, post_op)
            return _forward(b, dw, rounded, "any", post_ops[at + 1:], post_op.text)
        value = _post_op(b, post_op, value, axes, s.dst_dt)
    return value


def _final_dst_dt(setup: ConvSetup) -> str:
    dw = [p for p in setup.post_ops if p.family == "dw"]
    return (dw[0].dt or setup.dst_dt) if dw else setup.dst_dt


def descriptor_graph(desc: ConvDescriptor, setup: ConvSetup) -> Graph:
    """The graph that runs ``desc`` as ``setup`` describes."""
    b = _Builder(setup, setup.compute_dtype())
    data_format, weights_format = _formats(setup.layout)
    axes = _data_axes(desc.rank, data_format)
    x_shape = data_shape(desc.n, desc.ic, desc.in_size, data_format)
    y_shape = data_shape(desc.n, desc.oc, desc.out_size, data_format)
    w_shape = weights_shape(desc.oc, desc.ic // desc.groups, desc.kernel, weights_format)
    w_axes = _weights_axes(desc.rank, weights_format, desc.groups > 1)
    attrs = _conv_attrs(desc, setup.layout)
    name = desc.name or DIRECTIONS[setup.direction]
    if setup.direction.startswith("FWD"):
        src = _user_tensor(b, setup.src_dt, x_shape, "stag", axes)
        value = _forward(b, desc, src, setup.wtag, setup.post_ops, name)
        b.store(value, _user_tensor(b, _final_dst_dt(setup), value.shape, "dtag", axes))
    elif setup.direction == "BWD_D":
        diff_dst = b.widen(_user_tensor(b, setup.dst_dt, y_shape, "dtag", axes))
        weights = b.widen(_user_tensor(b, setup.wei_dt, w_shape, "wtag", w_axes))
        attrs["dst_shape"] = list(x_shape)
        value = b.op("ConvolutionBackwardData", attrs, (diff_dst, weights), b.tensor(b.compute, x_shape), name)
        b.store(value, _user_tensor(b, setup.src_dt, x_shape, "stag", axes))
    else:
        src = b.widen(_user_tensor(b, setup.src_dt, x_shape, "stag", axes))
        diff_dst = b.widen(_user_tensor(b, setup.dst_dt, y_shape, "dtag", axes))
        attrs["weights_shape"] = list(w_shape)
        value = b.op("ConvolutionBackwardWeights", attrs, (src, diff_dst), b.tensor(b.compute, w_shape), name)
        b.store(value, _user_tensor(b, setup.wei_dt, w_shape, "wtag", w_axes))
        if setup.direction == "BWD_WB":
            bias = b.op("BiasAddBackward", {"data_format": data_format}, (diff_dst,),
                        b.tensor(b.compute, (desc.oc,)), f"{name}:bias")
            b.store(bias, b.tensor(setup.bias_dt, (desc.oc,)))
    return Graph(tuple(b.ops), source=desc.text or desc.canonical(), constants=tuple(b.constants.items()))
