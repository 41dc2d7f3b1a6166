"""Declarative definitions of the seven ops: the single source of truth.

Each :class:`OpDef` lists the op's inputs in the specification's index order, its output, and its
attributes with type, default, range and required status. Attribute validation
(:mod:`convgrad.attributes`), shape inference (:mod:`convgrad.problem`), the functional API, the
generated docs and the CLI's attribute parsing all read these tables; nothing repeats them.

Every op reduces to one canonical problem on an underlying forward convolution
``y = conv(x, w)`` (see :mod:`convgrad.problem`):

============================  ==================  ===============================================
op                            canonical task      roles (input -> role, output -> role)
============================  ==================  ===============================================
Convolution                   forward             src->x, weights->w, bias->bias; dst->y
ConvolutionBackwardData       backward_data       diff_dst->y, weights->w, dst_shape; diff_src->x
ConvolutionBackwardWeights    backward_weights    src->x, diff_dst->y, weights_shape; diff_weights->w
ConvolutionBackpropFilters    backward_weights    input_forward->x, output_delta->y; filter_delta->w
ConvTranspose                 backward_data       src->y, weights->w, bias->bias; dst->x
ConvTransposeBackwardData     forward             diff_dst->x, weights->w; diff_src->y
ConvTransposeBackwardWeights  backward_weights    src->y, diff_dst->x, weights_shape; diff_weights->w
============================  ==================  ===============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import UnknownOpError

AttrType = Literal["s64", "s64[]", "string"]
Role = Literal["x", "y", "w", "bias", "shape"]
Task = Literal["forward", "backward_data", "backward_weights"]

__all__ = ["AttrSpec", "InputSpec", "OpDef", "OPS", "get_opdef", "AUTO_PAD_VALUES", "MAX_NDIMS"]

AUTO_PAD_VALUES = ("none", "same_upper", "same_lower", "valid")
#: The most dimensions oneDNN has (DNNL_MAX_NDIMS): no list attribute or shape given to an op is
#: longer (oneDNN writes unset lists as this many zeros).
MAX_NDIMS = 12


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: oneDNN name, type, default, and the rule its values follow.

    ``minimum`` bounds every integer (1 = positive, 0 = non-negative). ``per_axis`` lists hold one
    value per spatial axis; ``full_shape`` lists are a whole tensor shape (rank + 2 values).
    ``choices`` are matched case-insensitively and normalised to the spelling given here.
    """

    name: str
    type: AttrType
    description: str
    required: bool = False
    default: object = None
    minimum: int | None = None
    choices: tuple[str, ...] = ()
    per_axis: bool = False
    full_shape: bool = False

    def expected(self) -> str:
        """Human-readable description of the accepted values (used in errors, docs, CLI)."""
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices) + " (any letter case)"
        sign = {1: "positive", 0: "non-negative", None: ""}[self.minimum]
        if self.type == "s64":
            return f"a {sign} integer".replace("a  ", "a ")
        what = "one per spatial axis" if self.per_axis else "the full tensor shape"
        return f"a list of {sign} integers, {what}".replace("of  ", "of ")


@dataclass(frozen=True)
class InputSpec:
    """One input or output tensor of an op, and its role in the canonical convolution."""

    name: str
    role: Role
    required: bool = True
    description: str = ""


@dataclass(frozen=True)
class OpDef:
    """The complete definition of one op kind."""

    kind: str
    function: str
    task: Task
    transposed: bool
    summary: str
    math: str
    inputs: tuple[InputSpec, ...]
    output: InputSpec
    attributes: tuple[AttrSpec, ...] = field(default=())
    versioned_name: str | None = None

    @property
    def attr_names(self) -> list[str]:
        return [a.name for a in self.attributes]

    def attr(self, name: str) -> AttrSpec:
        return next(a for a in self.attributes if a.name == name)

    @property
    def shape_attr(self) -> str | None:
        """Name of the attribute that can also arrive as input 2 (dst_shape, weights_shape, ...)."""
        return next((a.name for a in self.attributes if a.full_shape), None)

    @property
    def weights_format_attr(self) -> str:
        return "filter_format" if "filter_format" in self.attr_names else "weights_format"


# ---------------------------------------------------------------------------------------------
# Attribute building blocks (the spec's wording, shared by the ops that have them)
# ---------------------------------------------------------------------------------------------
_IGNORED = " Ignored when auto_pad is same_upper, same_lower or valid."
STRIDES = AttrSpec("strides", "s64[]", "Stride of the window along each spatial axis.",
                   required=True, minimum=1, per_axis=True)
PADS_BEGIN = AttrSpec("pads_begin", "s64[]", "Zeros added at the front/top/left of each spatial axis." + _IGNORED,
                      required=True, minimum=0, per_axis=True)
PADS_END = AttrSpec("pads_end", "s64[]", "Zeros added at the back/bottom/right of each spatial axis." + _IGNORED,
                    required=True, minimum=0, per_axis=True)
DILATIONS = AttrSpec("dilations", "s64[]", "Spacing between kernel taps (1 = dense kernel).",
                     required=True, minimum=1, per_axis=True)
AUTO_PAD = AttrSpec("auto_pad", "string", "How the padding is computed.", default="none", choices=AUTO_PAD_VALUES)
GROUPS = AttrSpec("groups", "s64", "Number of groups the input and output channels are divided into.",
                  default=1, minimum=1)
DATA_FORMAT = AttrSpec("data_format", "string", "Layout of every data tensor: NXC (channels last) or NCX.",
                       default="NXC", choices=("NCX", "NXC"))
OUTPUT_PADDING = AttrSpec("output_padding", "s64[]", "Extra size added at the end of each spatial axis of "
                          "the transposed convolution's output.", default=None, minimum=0, per_axis=True)
#: On the ConvTranspose gradients: validated only; diff_dst may have any size of the range.
GRADIENT_OUTPUT_PADDING = AttrSpec(
    "output_padding", "s64[]", "The forward ConvTranspose's output_padding: validated, but diff_dst may have "
    "any size D with floor((D + PB + PE - EK) / S) + 1 = I, up to S - 1 more than S*(I-1) + EK - PB - PE, "
    "whatever it says (the extra rows get no gradient).", default=None, minimum=0, per_axis=True)


def _weights_format(name: str, pair: tuple[str, str]) -> AttrSpec:
    return AttrSpec(name, "string", f"Layout of the weights: {pair[0]} or {pair[1]}.", default=pair[1],
                    choices=pair)


def _shape_attr(name: str, of: str, data: bool = False) -> AttrSpec:
    """A shape attribute; a data shape (dst_shape) may have a batch of 0 like the data inputs."""
    batch = " Positive sizes, except that the batch (first entry) may be 0." if data else ""
    return AttrSpec(name, "s64[]", f"Shape of the {of} tensor (may also be given as input 2, which wins).{batch}",
                    minimum=0 if data else 1, full_shape=True)


CONV_WEIGHTS_FORMAT = _weights_format("weights_format", ("OIX", "XIO"))
CONVT_WEIGHTS_FORMAT = _weights_format("weights_format", ("IOX", "XOI"))
_GEOMETRY = (STRIDES, PADS_BEGIN, PADS_END, DILATIONS, AUTO_PAD)

_FWD_MATH = "dst[n, g*OCg+oc, o] = sum_{ic,k} src_pad[n, g*ICg+ic, o*S + k*D - PB] * W[g*OCg+oc, ic, k]"

OPS: dict[str, OpDef] = {
    d.kind: d
    for d in (
        OpDef(
            "Convolution", "convolution", "forward", False,
            "Forward convolution, optionally with bias.",
            _FWD_MATH + " (+ bias[oc]); O = floor((I + PB + PE - EK) / S) + 1, EK = (K-1)*D + 1",
            (InputSpec("src", "x"), InputSpec("weights", "w"), InputSpec("bias", "bias", required=False)),
            InputSpec("dst", "y"),
            _GEOMETRY + (GROUPS, DATA_FORMAT, CONV_WEIGHTS_FORMAT),
        ),
        OpDef(
            "ConvolutionBackwardData", "convolution_backward_data", "backward_data", False,
            "Gradient of a convolution with respect to its input.",
            "diff_src = d<conv(src, W), diff_dst>/d src; input positions no window touches get 0",
            (InputSpec("diff_dst", "y"), InputSpec("weights", "w"), InputSpec("dst_shape", "shape", required=False)),
            InputSpec("diff_src", "x"),
            _GEOMETRY + (OUTPUT_PADDING, GROUPS, DATA_FORMAT, CONV_WEIGHTS_FORMAT,
                         _shape_attr("dst_shape", "diff_src (the forward src)", data=True)),
        ),
        OpDef(
            "ConvolutionBackwardWeights", "convolution_backward_weights", "backward_weights", False,
            "Gradient of a convolution with respect to its weights.",
            "diff_weights = d<conv(src, W), diff_dst>/d W",
            (InputSpec("src", "x"), InputSpec("diff_dst", "y"), InputSpec("weights_shape", "shape", required=False)),
            InputSpec("diff_weights", "w"),
            _GEOMETRY + (GROUPS, DATA_FORMAT, CONV_WEIGHTS_FORMAT, _shape_attr("weights_shape", "diff_weights")),
        ),
        OpDef(
            "ConvolutionBackpropFilters", "convolution_backprop_filters", "backward_weights", False,
            "ConvolutionBackwardWeights under the older specification's names (ConvolutionBackpropFilters-1).",
            "filter_delta = d<conv(input_forward, W), output_delta>/d W",
            (InputSpec("input_forward", "x"), InputSpec("output_delta", "y"),
             InputSpec("filter_shape", "shape", required=False)),
            InputSpec("filter_delta", "w"),
            _GEOMETRY + (GROUPS, DATA_FORMAT, _weights_format("filter_format", ("OIX", "XIO")),
                         _shape_attr("filter_shape", "filter_delta")),
            versioned_name="ConvolutionBackpropFilters-1",
        ),
        OpDef(
            "ConvTranspose", "conv_transpose", "backward_data", True,
            "Transposed convolution (the data gradient of a convolution), optionally with bias.",
            "dst = conv_backward_data(src, W) (+ bias); O_T = S*(I_T - 1) + EK - PB - PE + output_padding",
            (InputSpec("src", "y"), InputSpec("weights", "w"), InputSpec("bias", "bias", required=False)),
            InputSpec("dst", "x"),
            _GEOMETRY + (OUTPUT_PADDING, GROUPS, DATA_FORMAT, CONVT_WEIGHTS_FORMAT),
        ),
        OpDef(
            "ConvTransposeBackwardData", "conv_transpose_backward_data", "forward", True,
            "Gradient of a transposed convolution with respect to its input: a forward convolution.",
            "diff_src = conv(diff_dst, W) with the same attributes",
            (InputSpec("diff_dst", "x"), InputSpec("weights", "w")),
            InputSpec("diff_src", "y"),
            _GEOMETRY + (GRADIENT_OUTPUT_PADDING, GROUPS, DATA_FORMAT, CONVT_WEIGHTS_FORMAT),
        ),
        OpDef(
            "ConvTransposeBackwardWeights", "conv_transpose_backward_weights", "backward_weights", True,
            "Gradient of a transposed convolution with respect to its weights.",
            "diff_weights = d<conv_transpose(src, W), diff_dst>/d W = conv_backward_weights(x=diff_dst, dy=src)",
            (InputSpec("src", "y"), InputSpec("diff_dst", "x"), InputSpec("weights_shape", "shape", required=False)),
            InputSpec("diff_weights", "w"),
            _GEOMETRY + (GRADIENT_OUTPUT_PADDING, GROUPS, DATA_FORMAT, CONVT_WEIGHTS_FORMAT,
                         _shape_attr("weights_shape", "diff_weights")),
        ),
    )
}

_ALIASES = {d.versioned_name: d.kind for d in OPS.values() if d.versioned_name}


def get_opdef(kind: str) -> OpDef:
    """The definition of ``kind`` (also accepts versioned names such as ConvolutionBackpropFilters-1)."""
    if not isinstance(kind, str):
        raise UnknownOpError(None, f"op kind {kind!r} is not a string: expected one of {', '.join(OPS)}")
    definition = OPS.get(_ALIASES.get(kind, kind))
    if definition is None:
        raise UnknownOpError(None, f"unknown op kind {kind!r}: expected one of {', '.join(OPS)}")
    return definition
