"""Declarative definitions of every op: the single source of truth.

Each :class:`OpDef` lists the op's inputs in the specification's index order, its output, and its
attributes with type, default, range and required status. Attribute validation
(:mod:`convgrad.attributes`), shape inference (:mod:`convgrad.problem` for the convolutions,
:mod:`convgrad.tensor_ops` for the rest), the functional API, the generated docs and the CLI's
attribute parsing all read these tables; nothing repeats them.

Ops come in families (:data:`FAMILIES`): the seven convolution ops, and the ops that sit around
convolutions in real graphs: element-wise ops and their backward ops, binary ops, BiasAdd and its
backward op, TypeCast, and the layout ops Reorder, StaticReshape and StaticTranspose. An op's
``algorithm`` names its math in :mod:`convgrad.eltwise`, :mod:`convgrad.binary` or
:mod:`convgrad.layout_ops`.

Every convolution op reduces to one canonical problem on an underlying forward convolution
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

AttrType = Literal["s64", "s64[]", "string", "f32", "bool"]
#: Convolution roles (x, y, w, bias, shape) and the other ops' (data: a data tensor with a batch axis,
#: operand: a binary op's second input, which may broadcast).
Role = Literal["x", "y", "w", "bias", "shape", "data", "operand"]
Task = Literal["forward", "backward_data", "backward_weights"]
Family = Literal["convolution", "eltwise", "eltwise_backward", "binary", "bias_add", "bias_add_backward",
                 "typecast", "reorder", "reshape", "transpose"]

__all__ = ["AttrSpec", "InputSpec", "OpDef", "OPS", "FAMILIES", "SWAPPABLE_FAMILIES", "get_opdef", "ops_of",
           "AUTO_PAD_VALUES", "MAX_NDIMS"]

#: Families whose ops share inputs, output and shape rule, so benchdnn's --op-kind may swap one kind
#: of the family for another.
SWAPPABLE_FAMILIES = ("eltwise", "eltwise_backward", "binary")
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]

AUTO_PAD_VALUES = ("none", "same_upper", "same_lower", "valid")
#: The most dimensions oneDNN has (DNNL_MAX_NDIMS): no list attribute or shape given to an op is
#: longer (oneDNN writes unset lists as this many zeros).
MAX_NDIMS = 12


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: oneDNN name, type, default, and the rule its values follow.

    ``minimum`` bounds every number (1 = positive, 0 = non-negative); ``nonzero`` refuses 0 (a
    divisor). ``per_axis`` lists hold one value per spatial axis; ``full_shape`` lists are a whole
    tensor shape (rank + 2 values); other lists say what they hold in ``meaning``. ``choices`` are
    matched case-insensitively and normalised to the spelling given here.
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
    nonzero: bool = False
    meaning: str = ""

    def expected(self) -> str:
        """Human-readable description of the accepted values (used in errors, docs, CLI)."""
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices) + " (any letter case)"
        if self.type == "bool":
            return "true or false"
        sign = {1: "positive", 0: "non-negative", None: ""}[self.minimum]
        if self.type == "f32":
            number = "a non-zero finite number" if self.nonzero else f"a {sign} finite number"
            return number.replace("a  ", "a ")
        if self.type == "s64":
            return f"a {sign} integer".replace("a  ", "a ")
        what = self.meaning or ("one per spatial axis" if self.per_axis else "the full tensor shape")
        return f"a list of {sign} integers, {what}".replace("of  ", "of ")


@dataclass(frozen=True)
class InputSpec:
    """One input or output tensor of an op, and its role (in the canonical convolution for those).

    ``positive``: the op's math needs positive values there (Log, Sqrt, Pow): the graph runner's
    random data for such a graph input is positive."""

    name: str
    role: Role
    required: bool = True
    description: str = ""
    positive: bool = False


@dataclass(frozen=True)
class OpDef:
    """The complete definition of one op kind.

    ``task`` and ``transposed`` describe a convolution op's canonical problem (``None``/False for
    the other families); ``algorithm`` names the math of the other families' ops."""

    kind: str
    function: str
    task: Task | None
    transposed: bool
    summary: str
    math: str
    inputs: tuple[InputSpec, ...]
    output: InputSpec
    attributes: tuple[AttrSpec, ...] = field(default=())
    versioned_name: str | None = None
    family: Family = "convolution"
    algorithm: str = ""

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
#: On the ConvTranspose gradients: the forward's, which relates diff_dst's size to src's.
GRADIENT_OUTPUT_PADDING = AttrSpec(
    "output_padding", "s64[]", "The forward ConvTranspose's output_padding P. Where P >= S, diff_dst's size D "
    "must be the forward's, S*(I-1) + EK - PB - PE + P; where P < S, any D with floor((D + PB + PE - EK) / S) "
    "+ 1 = I is accepted, up to S - 1 more than S*(I-1) + EK - PB - PE (the extra rows get no gradient).",
    default=None, minimum=0, per_axis=True)


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

# ---------------------------------------------------------------------------------------------
# The ops around convolutions (oneDNN's doc/graph/operations pages and src/graph/interface/op_def.hpp;
# where those differ, docs/semantics.md says which is followed)
# ---------------------------------------------------------------------------------------------
AUTO_BROADCAST = AttrSpec("auto_broadcast", "string", "How the two inputs' shapes are matched: numpy "
                          "(multi-directional broadcasting) or none (the shapes must be equal).",
                          default="numpy", choices=("none", "numpy"))
BIAS_DATA_FORMAT = AttrSpec("data_format", "string", "Where the channel axis is: axis 1 (NCX) or the last "
                            "axis (NXC).", default="NXC", choices=("NCX", "NXC"))
USE_DST = AttrSpec("use_dst", "bool", "If true, input 0 is the forward op's dst; else its src.", default=True)
_SRC = InputSpec("src", "data")


def _alpha(description: str, minimum: int | None = None) -> AttrSpec:
    return AttrSpec("alpha", "f32", description, required=True, minimum=minimum)


def _beta(description: str, required: bool = True, default: float | None = None, nonzero: bool = False) -> AttrSpec:
    return AttrSpec("beta", "f32", description, required=required, default=default, nonzero=nonzero)


_CLAMP = (AttrSpec("min", "f32", "Lower bound of the output.", required=True),
          AttrSpec("max", "f32", "Upper bound of the output (at least min).", required=True))
_HARD_SIGMOID = (_alpha("alpha in the formula."), _beta("beta in the formula."))
_ELU_ALPHA = _alpha("Scale for the negative factor.", minimum=0)
_SOFTPLUS_BETA = _beta("beta in the formula.", required=False, default=1.0, nonzero=True)
_GELU_MODE = AttrSpec("mode", "string", "gelu_erf: the exact GELU; gelu_tanh: its tanh approximation.",
                      default="gelu_erf", choices=("gelu_erf", "gelu_tanh"))


def _eltwise(kind: str, function: str, summary: str, math: str, *attributes: AttrSpec,
             positive: bool = False) -> OpDef:
    return OpDef(kind, function, None, False, summary, math, (InputSpec("src", "data", positive=positive),),
                 InputSpec("dst", "data"), attributes, family="eltwise", algorithm=function)


def _eltwise_backward(forward: str, function: str, math: str, *attributes: AttrSpec, use_dst: bool = False,
                      positive: bool = False) -> OpDef:
    first = (InputSpec("src_or_dst", "data", positive=positive,
                       description="the forward op's dst if use_dst (the default), else its src") if use_dst
             else InputSpec("src", "data", positive=positive))
    return OpDef(f"{forward}Backward", f"{function}_backward", None, False, f"Gradient of {forward} with respect "
                 "to its src" + (" (from its src or, with use_dst, its dst)." if use_dst else "."), math,
                 (first, InputSpec("diff_dst", "data")), InputSpec("diff_src", "data"),
                 attributes + ((USE_DST,) if use_dst else ()), family="eltwise_backward", algorithm=function)


def _binary(kind: str, function: str, math: str) -> OpDef:
    return OpDef(kind, function, None, False, f"Element-wise {function.replace('_', ' ')} of two tensors, with "
                 "numpy broadcasting unless auto_broadcast is none.", math,
                 (InputSpec("src_0", "data"), InputSpec("src_1", "operand")), InputSpec("dst", "data"),
                 (AUTO_BROADCAST,), family="binary", algorithm=function)


def _layout(kind: str, function: str, family: Family, summary: str, math: str, *attributes: AttrSpec) -> OpDef:
    return OpDef(kind, function, None, False, summary, math, (_SRC,), InputSpec("dst", "data"), attributes,
                 family=family, algorithm=function)


_DD = "diff_src = diff_dst * "
AROUND_CONVOLUTIONS: tuple[OpDef, ...] = (
    _eltwise("ReLU", "relu", "Rectified linear unit.", "dst = src if src > 0 else 0"),
    _eltwise_backward("ReLU", "relu", _DD + "(1 if v > 0 else 0), v = src or dst", use_dst=True),
    _eltwise("LeakyReLU", "leaky_relu", "ReLU with a slope alpha for negative inputs.",
             "dst = src if src >= 0 else alpha * src", _alpha("The coefficient of leakage.")),
    _eltwise("Sigmoid", "sigmoid", "Logistic sigmoid.", "dst = 1 / (1 + exp(-src))"),
    _eltwise_backward("Sigmoid", "sigmoid", _DD + "d * (1 - d), d = dst or sigmoid(src)", use_dst=True),
    _eltwise("Tanh", "tanh", "Hyperbolic tangent.", "dst = tanh(src)"),
    _eltwise_backward("Tanh", "tanh", _DD + "(1 - d) * (1 + d), d = dst or tanh(src)", use_dst=True),
    _eltwise("Elu", "elu", "Exponential linear unit.", "dst = src if src > 0 else alpha * (exp(src) - 1)",
             _ELU_ALPHA),
    _eltwise_backward("Elu", "elu", _DD + "(1 if src > 0 else alpha * exp(src)); from dst: "
                      "(1 if dst > 0 else dst + alpha)", _ELU_ALPHA, use_dst=True),
    _eltwise("GELU", "gelu", "Gaussian error linear unit, exact (gelu_erf) or its tanh approximation (gelu_tanh).",
             "gelu_erf: dst = 0.5 * src * (1 + erf(src / sqrt(2))); gelu_tanh: dst = 0.5 * src * "
             "(1 + tanh(sqrt(2 / pi) * (src + 0.044715 * src^3)))", _GELU_MODE),
    _eltwise_backward("GELU", "gelu", _DD + "d GELU(src) / d src (of the mode's formula)", _GELU_MODE),
    _eltwise("HardSigmoid", "hard_sigmoid", "Piecewise-linear sigmoid.", "dst = max(0, min(1, alpha * src + beta))",
             *_HARD_SIGMOID),
    _eltwise_backward("HardSigmoid", "hard_sigmoid", _DD + "(alpha if 0 < alpha * src + beta < 1 else 0)",
                      *_HARD_SIGMOID),
    _eltwise("HardSwish", "hard_swish", "Hard swish.", "dst = src * min(max(src + 3, 0), 6) / 6"),
    _eltwise_backward("HardSwish", "hard_swish", _DD + "(0 if src <= -3 else 1 if src >= 3 else src / 3 + 0.5)"),
    _eltwise("Mish", "mish", "Mish activation.", "dst = src * tanh(ln(1 + exp(src)))"),
    _eltwise_backward("Mish", "mish", _DD + "(t + src * sigmoid(src) * (1 - t^2)), t = tanh(ln(1 + exp(src)))"),
    _eltwise("SoftPlus", "soft_plus", "Smooth ReLU.", "dst = ln(1 + exp(beta * src)) / beta", _SOFTPLUS_BETA),
    _eltwise_backward("SoftPlus", "soft_plus", _DD + "sigmoid(beta * src)", _SOFTPLUS_BETA),
    _eltwise("Clamp", "clamp", "Clipping to [min, max].", "dst = min(max(src, min), max)", *_CLAMP),
    _eltwise_backward("Clamp", "clamp", _DD + "(1 if min < v < max else 0), v = src or dst", *_CLAMP, use_dst=True),
    _eltwise("Abs", "abs", "Absolute value.", "dst = |src|"),
    _eltwise_backward("Abs", "abs", _DD + "sign(src) (0 at src = 0)"),
    _eltwise("Square", "square", "Square.", "dst = src^2"),
    _eltwise("Sqrt", "sqrt", "Square root.", "dst = sqrt(src)", positive=True),
    _eltwise_backward("Sqrt", "sqrt", _DD + "1 / (2 * d), d = dst or sqrt(src)", use_dst=True, positive=True),
    _eltwise("Exp", "exp", "Exponential.", "dst = exp(src)"),
    _eltwise("Log", "log", "Natural logarithm.", "dst = ln(src)", positive=True),
    _eltwise("Pow", "pow", "Power with a constant exponent.", "dst = src^beta",
             _beta("The exponent, beta in the formula."), positive=True),
    _eltwise("Round", "round", "Rounding to the nearest integer, ties to even.", "dst = round_half_even(src)"),
    _eltwise("Reciprocal", "reciprocal", "Reciprocal (Inf at 0).", "dst = 1 / src"),
    _binary("Add", "add", "dst = src_0 + src_1"),
    _binary("Subtract", "subtract", "dst = src_0 - src_1"),
    _binary("Multiply", "multiply", "dst = src_0 * src_1"),
    _binary("Divide", "divide", "dst = src_0 / src_1"),
    _binary("Maximum", "maximum", "dst = max(src_0, src_1)"),
    _binary("Minimum", "minimum", "dst = min(src_0, src_1)"),
    _binary("SquaredDifference", "squared_difference", "dst = (src_0 - src_1)^2"),
    OpDef("BiasAdd", "bias_add", None, False, "Adds a 1-D bias along the channel axis.",
          "dst[n, c, x] = src[n, c, x] + bias[c] (channel axis per data_format)",
          (_SRC, InputSpec("bias", "bias")), InputSpec("dst", "data"), (BIAS_DATA_FORMAT,),
          family="bias_add", algorithm="bias_add"),
    OpDef("BiasAddBackward", "bias_add_backward", None, False, "Gradient of BiasAdd with respect to its bias.",
          "diff_bias[c] = sum over every other axis of diff_dst[n, c, x] (channel axis per data_format)",
          (InputSpec("diff_dst", "data"),), InputSpec("diff_bias", "bias"), (BIAS_DATA_FORMAT,),
          family="bias_add_backward", algorithm="bias_add_backward"),
    _layout("TypeCast", "type_cast", "typecast", "Converts src to another data type, rounding to nearest even.",
            "dst = round_to_dtype(src)",
            AttrSpec("dtype", "string", "convgrad's name for dst's data type, which oneDNN takes from the dst "
                     "logical tensor (graph files need no attribute).", required=True,
                     choices=("f32", "bf16", "f16", "f64"))),
    _layout("Reorder", "reorder", "reorder", "Copies src into dst's memory layout (same shape and data type).",
            "dst = src"),
    _layout("StaticReshape", "static_reshape", "reshape", "Gives src a new shape with the same number of elements.",
            "dst = src viewed in row-major order with the new shape",
            AttrSpec("shape", "s64[]", "The shape of dst: -1 (at most once) is inferred from the element count; "
                     "0 copies src's size on that axis if special_zero, else is a size of 0.", required=True,
                     meaning="the dst shape, -1 at most once"),
            AttrSpec("special_zero", "bool", "Whether a 0 in shape copies src's size on that axis.", required=True)),
    _layout("StaticTranspose", "static_transpose", "transpose", "Permutes the axes of src.",
            "dst.shape[i] = src.shape[order[i]]; dst[..., i_k, ...] = src[..., i_order[k], ...]",
            AttrSpec("order", "s64[]", "dst axis i is src axis order[i]; negative values count from the end.",
                     required=True, meaning="a permutation of the axes (negative: counting from the end)")),
)
OPS.update((d.kind, d) for d in AROUND_CONVOLUTIONS)

_ALIASES = {d.versioned_name: d.kind for d in OPS.values() if d.versioned_name}


def get_opdef(kind: str) -> OpDef:
    """The definition of ``kind`` (also accepts versioned names such as ConvolutionBackpropFilters-1)."""
    if not isinstance(kind, str):
        raise UnknownOpError(None, f"op kind {kind!r} is not a string: expected one of {', '.join(OPS)}")
    definition = OPS.get(_ALIASES.get(kind, kind))
    if definition is None:
        raise UnknownOpError(None, f"unknown op kind {kind!r}: expected one of {', '.join(OPS)}")
    return definition


def ops_of(*families: str) -> list[str]:
    """The op kinds of the given families, in table order."""
    return [d.kind for d in OPS.values() if d.family in families]
