"""Shape inference: from an op, its attributes and its input shapes to a canonical problem.

Every op of the family is one of three problems on an underlying forward convolution
``y = conv(x, w)`` (canonical NCX/OIX notation, G groups, ICg = IC/G, OCg = OC/G)::

    y[n, g*OCg+oc, o] = sum_{ic, k} x_pad[n, g*ICg+ic, o*S + k*D - PB] * w[g*OCg+oc, ic, k]

- forward:          y  from x, w
- backward_data:    dx = d<y, dy>/dx from dy, w
- backward_weights: dw = d<y, dy>/dw from x, dy

Sizes per spatial axis: I (x), O (y), K, S, D, PB, PE, EK = (K-1)*D + 1. Every op relates them by
``O = floor((I + PB + PE - EK) / S) + 1`` except ConvTranspose (whose src is the convolution's y),
which sets ``I = S*(O - 1) + EK - PB - PE + output_padding`` (any output_padding >= 0). The
ConvTranspose gradients take the same relation: on an axis whose output_padding P is at least S,
diff_dst's size D must be exactly that of the forward; where P < S every D from
``S*(O-1) + EK - PB - PE`` up to S - 1 more is accepted (oneDNN's range; P itself is in it).
Either way every window lies inside the padded input: ``S*(O-1) + EK <= I + PB + PE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
import numpy as np

from .attributes import Attrs, fits_rank, per_axis
from .dtypes import dtype_name
from .errors import AttributeValueError, ConvgradError, DTypeError, InputError, ShapeError
from .limits import check_sizes
from .opdefs import InputSpec, OpDef

__all__ = ["ConvGeometry", "Problem", "TensorInfo", "build_problem", "auto_pads", "input_size_range",
           "transposed_input_size",
           "data_shape", "weights_shape", "split_data_shape", "split_weights_shape"]


@dataclass(frozen=True)
class ConvGeometry:
    """The underlying forward convolution, in canonical terms."""

    n: int
    groups: int
    ic: int
    oc: int
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    def __post_init__(self) -> None:
        # Hashed once: a warm call looks a geometry up in several memos (plans, loop shapes).
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def icg(self) -> int:
        return self.ic // self.groups

    @property
    def ocg(self) -> int:
        return self.oc // self.groups

    @property
    def padded_size(self) -> tuple[int, ...]:
        """Spatial sizes of the zero-padded input: I + PB + PE."""
        return tuple(i + b + e for i, b, e in zip(self.in_size, self.pads_begin, self.pads_end))

    @property
    def effective_kernel(self) -> tuple[int, ...]:
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the convolution: 2 * N * OC * ICg * prod(K) * prod(O)."""
        return 2 * self.n * self.oc * self.icg * math.prod(self.kernel) * math.prod(self.out_size)

    @property
    def x_shape(self) -> tuple[int, ...]:
        """Canonical (channels-last) shape of x: (N, *I, IC)."""
        return (self.n, *self.in_size, self.ic)

    @property
    def y_shape(self) -> tuple[int, ...]:
        """Canonical (channels-last) shape of y: (N, *O, OC)."""
        return (self.n, *self.out_size, self.oc)

    @property
    def w_shape(self) -> tuple[int, ...]:
        """Canonical (XIO) shape of w: (*K, ICg, OC)."""
        return (*self.kernel, self.icg, self.oc)


@dataclass(frozen=True)
class TensorInfo:
    """What shape inference needs of one input: shape and dtype, or the values of a shape tensor."""

    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    values: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Problem:
    """A fully resolved op invocation: everything but the data."""

    definition: OpDef
    geometry: ConvGeometry
    data_format: str
    weights_format: str
    dtype: np.dtype
    output_shape: tuple[int, ...]
    has_bias: bool = False

    @property
    def op(self) -> str:
        return self.definition.kind

    @property
    def task(self) -> str:
        return self.definition.task

    @property
    def pads_begin(self) -> tuple[int, ...]:
        return self.geometry.pads_begin

    @property
    def pads_end(self) -> tuple[int, ...]:
        return self.geometry.pads_end

    @property
    def output_dtype(self) -> np.dtype:
        return self.dtype

    @property
    def flops(self) -> int:
        return self.geometry.flops

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The op's data and weights tensors, inputs then output, by name: their shapes in the op's
        layouts (bias and shape inputs aside)."""
        g, d = self.geometry, self.definition
        by_role = {"x": data_shape(g.n, g.ic, g.in_size, self.data_format),
                   "y": data_shape(g.n, g.oc, g.out_size, self.data_format),
                   "w": weights_shape(g.oc, g.icg, g.kernel, self.weights_format)}
        return {spec.name: by_role[spec.role] for spec in (*d.inputs, d.output) if spec.role in by_role}

    def __repr__(self) -> str:
        g = self.geometry
        return (f"Problem({self.op}: {self.definition.output.name} {self.output_shape} {dtype_name(self.dtype)}, "
                f"pads_begin={list(g.pads_begin)}, pads_end={list(g.pads_end)}, groups={g.groups}, "
                f"{self.data_format}/{self.weights_format})")


# ---------------------------------------------------------------------------------------------
# Layout of shapes
# ---------------------------------------------------------------------------------------------
def split_data_shape(shape: tuple[int, ...], data_format: str) -> tuple[int, int, tuple[int, ...]]:
    """(N, C, spatial) of a data tensor shape in NCX or NXC."""
    if data_format == "NCX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


def data_shape(n: int, c: int, spatial: tuple[int, ...], data_format: str) -> tuple[int, ...]:
    """Data tensor shape in NCX or NXC."""
    return (n, c, *spatial) if data_format == "NCX" else (n, *spatial, c)


def _spatial_first(weights_format: str) -> bool:
    return weights_format[0] == "X"


def split_weights_shape(shape: tuple[int, ...], weights_format: str) -> tuple[int, int, tuple[int, ...]]:
    """(A, B, K) of a weights shape: (OC, ICg, K) for OIX/XIO; for IOX/XOI the same numbers,
    since the IOX weights of a ConvTranspose are the OIX weights of its convolution."""
    if _spatial_first(weights_format):
        return shape[-1], shape[-2], tuple(shape[:-2])
    return shape[0], shape[1], tuple(shape[2:])


def weights_shape(oc: int, icg: int, kernel: tuple[int, ...], weights_format: str) -> tuple[int, ...]:
    """Weights shape in the given format from canonical (OC, ICg, K)."""
    return (*kernel, icg, oc) if _spatial_first(weights_format) else (oc, icg, *kernel)


# ---------------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------------
def auto_pads(mode: str, in_size: tuple[int | None, ...] | None, strides: tuple[int, ...],
              eff_kernel: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Pads for a non-``none`` auto_pad (SEMANTICS.md).

    valid: 0. same_*: total = max(0, EK - S) if I % S == 0 else max(0, EK - I % S), where I is the
    convolution's input size (``None`` for ConvTranspose, which uses max(0, EK - S); a ``None``
    entry does so on one axis). same_upper puts the odd extra pad at the end, same_lower at the beginning.
    """
    rank = len(strides)
    if mode == "valid":
        return (0,) * rank, (0,) * rank
    begin, end = [], []
    for axis in range(rank):
        s, ek = strides[axis], eff_kernel[axis]
        rem = 0 if in_size is None or in_size[axis] is None else in_size[axis] % s
        total = max(0, ek - s) if rem == 0 else max(0, ek - rem)
        lo = total // 2 if mode == "same_upper" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    return tuple(begin), tuple(end)


def input_size_range(out_size: tuple[int, ...], strides: tuple[int, ...], eff_kernel: tuple[int, ...],
                     pads_begin: tuple[int, ...], pads_end: tuple[int, ...], mode: str,
                     output_padding: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(smallest, largest) convolution input size I per axis whose output size is ``out_size``:
    ``floor((I + PB + PE - EK) / S) + 1 = O`` holds for I from ``S*(O-1) + EK - PB - PE`` up to
    ``S - 1`` more (PB = PE = 0 for auto_pad valid). With same_* the pads follow I and
    O = ceil(I / S), so I runs from ``S*(O-1) + 1`` to ``S*O``. The lower bound is raised to 1
    where the upper one allows.

    ``output_padding`` (the ConvTranspose gradients): an axis whose value P is not 0 has the
    ConvTranspose's own pads under same_* (max(0, EK - S) in all), and where P >= S it accepts
    exactly the forward's size ``S*(O-1) + EK - PB - PE + P`` (:func:`transposed_input_size`)."""
    rank = len(out_size)
    output_padding = output_padding or (0,) * rank
    fixed_pads = auto_pads(mode, None, strides, eff_kernel) if mode != "none" else (pads_begin, pads_end)
    lo, hi = [], []
    for axis, (s, o, k, p) in enumerate(zip(strides, out_size, eff_kernel, output_padding)):
        if mode.startswith("same") and not p:
            lo.append(s * (o - 1) + 1)
            hi.append(s * o)
            continue
        low = s * (o - 1) + k - fixed_pads[0][axis] - fixed_pads[1][axis] + (p if p >= s else 0)
        lo.append(low)
        hi.append(low if p >= s else low + s - 1)
    return tuple(max(1, low) if high >= 1 else low for low, high in zip(lo, hi)), tuple(hi)


def transposed_input_size(diff_dst_size: int, stride: int, eff_kernel: int, pad_begin: int, pad_end: int,
                          output_padding: int) -> int | None:
    """The ConvTranspose input size I on one axis for its gradients' diff_dst size D, or None if
    none fits: where output_padding P >= S, D = S*(I-1) + EK - PB - PE + P exactly (the forward's
    size: nothing else tells I); where P < S, I = floor((D + PB + PE - EK) / S) + 1 (every D of
    oneDNN's range, P's own among them)."""
    span = diff_dst_size + pad_begin + pad_end - eff_kernel
    if output_padding >= stride:
        span -= output_padding
        if span % stride:
            return None
    return span // stride + 1 if span >= 0 else None


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------
def _check_positive(op: str, name: str, shape: tuple[int, ...], allow_zero_batch: bool) -> None:
    dims = shape[1:] if allow_zero_batch else shape
    if any(d < 1 for d in dims) or (allow_zero_batch and shape[0] < 0):
        raise ShapeError(op, name, f"has shape {list(shape)}: expected positive sizes"
                         + (" (a batch of 0 is allowed)" if allow_zero_batch else ""))


def _rank_piece(index: int, name: str, value: int | tuple[int, ...], attribute: bool) -> str:
    """One piece of the rank-disagreement message, e.g. "'src' has 2 spatial axes" (the first),
    "'weights' 2", "'dst_shape' 1 ([2, 7, 5])", "'strides' 1 value ([2])"."""
    if attribute:
        return f"'{name}' {len(value)} value{'s' if len(value) != 1 else ''} ({list(value)})"
    count = value if isinstance(value, int) else len(value) - 2
    text = f"'{name}' has {count} spatial ax{'is' if count == 1 else 'es'}" if index == 0 else f"'{name}' {count}"
    return text if isinstance(value, int) else f"{text} ({list(value)})"


class _Inference:
    """One shape-inference run (holds the op's context for error messages)."""

    def __init__(self, definition: OpDef, attrs: Attrs, inputs: list[TensorInfo | None], lenient: bool) -> None:
        self.d = definition
        self.op = definition.kind
        self.attrs = attrs
        self.lenient = lenient
        self.data_format = attrs.get("data_format", "NXC")
        wf = definition.weights_format_attr
        self.weights_format = attrs.get(wf, definition.attr(wf).default)
        self.given: dict[str, tuple[InputSpec, TensorInfo]] = {}
        self._collect(inputs)

    def _collect(self, inputs: list[TensorInfo | None]) -> None:
        specs = self.d.inputs
        if len(inputs) > len(specs):
            raise InputError(self.op, None, f"takes at most {len(specs)} inputs "
                             f"({', '.join(s.name for s in specs)}); {len(inputs)} were given")
        for spec, info in zip(specs, inputs):
            if info is not None:
                self.given[spec.role] = (spec, info)
        for spec in specs:
            if spec.required and spec.role not in self.given:
                raise InputError(self.op, spec.name, "is required but was not given")

    def run(self) -> Problem:
        rank = self._rank()
        dtype = self._dtype()
        shapes = self._role_shapes(rank)
        n, ic, oc, icg, kernel, in_size, out_size = self._channels(shapes)
        strides = per_axis(self.d, self.attrs, "strides", rank, self.lenient)
        dilations = per_axis(self.d, self.attrs, "dilations", rank, self.lenient)
        out_pad = per_axis(self.d, self.attrs, "output_padding", rank) if "output_padding" in self.d.attr_names \
            else (0,) * rank
        eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
        pads_begin, pads_end = self._pads(rank, in_size, strides, eff, out_pad)
        in_size, out_size = self._sizes(in_size, out_size, strides, eff, pads_begin, pads_end, out_pad)
        geometry = ConvGeometry(n, self.attrs.get("groups", 1), ic, oc, in_size, out_size, kernel,
                                strides, dilations, pads_begin, pads_end)
        out_role = self.d.output.role
        output_shape = {
            "x": lambda: data_shape(n, ic, in_size, self.data_format),
            "y": lambda: data_shape(n, oc, out_size, self.data_format),
            "w": lambda: weights_shape(oc, icg, kernel, self.weights_format),
        }[out_role]()
        return Problem(self.d, geometry, self.data_format, self.weights_format, dtype, output_shape,
                       has_bias="bias" in self.given)

    def _rank(self) -> int:
        """The spatial rank r, the one place that checks it: the first input (rank 3 to 5) gives r;
        every other data input and the shape (r + 2 axes or values) and every per-axis list
        attribute (r values, see :func:`fits_rank`) must agree, else one error names every piece
        and its rank, in argument order (an :class:`AttributeValueError` if only attributes
        disagree). A tensor of rank outside 3 to 5 is malformed whatever the others say."""
        first = next(iter(self.given.values()))[1]
        for spec, info in self.given.values():
            ndim = None if spec.role in ("bias", "shape") else len(info.shape)
            if ndim is not None and not 3 <= ndim <= 5:
                raise ShapeError(self.op, spec.name, f"has shape {list(info.shape)} (rank {ndim}): expected "
                                 "rank 3, 4 or 5 (N, C and 1, 2 or 3 spatial axes)")
        rank = len(first.shape) - 2
        # (name, spatial axes of a tensor or the values of a shape or list attribute, agrees, is an attribute)
        pieces: list[tuple[str, int | tuple[int, ...], bool, bool]] = [
            (spec.name, len(info.shape) - 2, len(info.shape) - 2 == rank, False)
            for spec, info in self.given.values() if spec.role not in ("bias", "shape")]
        shape = self.given["shape"][1].values if "shape" in self.given else self.attrs.get(self.d.shape_attr)
        if shape is not None and len(shape) >= 3:  # shorter: not a shape at all (see _role_shapes)
            name = str(self.d.shape_attr)  # the shape input bears its attribute's name (opdefs)
            pieces.append((name, tuple(shape), len(shape) - 2 == rank, False))
        ignored = ("pads_begin", "pads_end") if self.attrs.get("auto_pad", "none") != "none" else ()
        pieces += [(spec.name, self.attrs[spec.name], fits_rank(spec, self.attrs[spec.name], rank), True)
                   for spec in self.d.attributes
                   if spec.per_axis and isinstance(self.attrs.get(spec.name), tuple) and spec.name not in ignored]
        if all(piece[2] for piece in pieces):
            return rank
        message = "inputs and attributes disagree on the spatial rank: " + ", ".join(
            _rank_piece(i, name, value, attribute) for i, (name, value, _, attribute) in enumerate(pieces))
        if all(agrees for _, _, agrees, attribute in pieces if not attribute):
            name, value = next((name, value) for name, value, agrees, _ in pieces if not agrees)
            raise AttributeValueError(self.op, name, list(value), f"{rank} values, one per spatial axis of the "
                                      f"{rank}-D problem ({message})")
        raise ShapeError(self.op, None, message)

    def _dtype(self) -> np.dtype:
        first_spec, first = next(iter(self.given.values()))
        dtype = first.dtype
        for spec, info in self.given.values():
            if spec.role == "shape":
                continue
            if info.dtype != dtype:
                raise DTypeError(self.op, spec.name, f"has dtype {dtype_name(info.dtype)}: expected "
                                 f"{dtype_name(dtype)} like input '{first_spec.name}' (all data inputs share a dtype)")
            if spec.role == "bias" and len(info.shape) != 1:
                raise ShapeError(self.op, spec.name, f"has shape {list(info.shape)} (rank {len(info.shape)}): "
                                 "expected rank 1")
        return dtype

    def _role_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        """Shapes of x, y, w as far as known (the shape input/attribute supplies one of them)."""
        shapes = {role: info.shape for role, (_, info) in self.given.items() if role in ("x", "y", "w")}
        shape_attr = self.d.shape_attr
        if shape_attr is None:
            return shapes
        target = self.d.output.role
        if "shape" in self.given:
            spec, info = self.given["shape"]
            values, source = info.values, f"input '{spec.name}'"
        elif shape_attr in self.attrs:
            values, source = self.attrs[shape_attr], f"attribute '{shape_attr}'"
        else:
            raise InputError(self.op, shape_attr, f"is missing: give it as input 2 or as attribute "
                             f"'{shape_attr}' (the shape of {self.d.output.name})")
        batch_min = 1 if target == "w" else 0  # a data shape may have a batch of 0, like the data inputs
        if len(values) != rank + 2 or values[0] < batch_min or any(v < 1 for v in values[1:]):
            fmt = self.data_format if target != "w" else self.weights_format
            raise ShapeError(self.op, None, f"{source} = {list(values)}: expected {rank + 2} positive sizes "
                             f"(the {fmt} shape of {self.d.output.name} for a {rank}-D problem"
                             + (", a batch of 0 is allowed)" if batch_min == 0 else ")"))
        shapes[target] = tuple(values)
        return shapes

    def _channels(self, shapes: dict[str, tuple[int, ...]]):
        groups = self.attrs.get("groups", 1)
        names = {spec.role: spec.name for spec, _ in self.given.values()}
        names.setdefault(self.d.output.role, self.d.shape_attr or self.d.output.name)
        w_oc, icg, kernel = split_weights_shape(shapes["w"], self.weights_format)
        _check_positive(self.op, names["w"], shapes["w"], False)
        n = ic = in_size = out_size = None
        oc = w_oc
        if "x" in shapes:
            _check_positive(self.op, names["x"], shapes["x"], True)
            n, ic, in_size = split_data_shape(shapes["x"], self.data_format)
        if "y" in shapes:
            _check_positive(self.op, names["y"], shapes["y"], True)
            n_y, oc, out_size = split_data_shape(shapes["y"], self.data_format)
            if n is not None and n_y != n:
                raise ShapeError(self.op, names["y"], f"has batch {n_y}: expected {n}, the batch of '{names['x']}'")
            n = n_y
        wfmt = self.weights_format
        o_name, i_name = ("I", "O") if self.d.transposed else ("O", "I")
        if oc != w_oc:
            raise ShapeError(self.op, names["w"], f"has shape {list(shapes['w'])} ({wfmt}): its {o_name} axis is "
                             f"{w_oc}, expected {oc}, the channels of '{names['y']}'")
        if oc % groups:
            raise AttributeValueError(self.op, "groups", groups, f"a divisor of the {oc} channels of '{names['y']}'")
        if ic is None:
            ic = icg * groups
        elif ic % groups:
            raise AttributeValueError(self.op, "groups", groups, f"a divisor of the {ic} channels of '{names['x']}'")
        elif ic != icg * groups:
            raise ShapeError(self.op, names["w"], f"has shape {list(shapes['w'])} ({wfmt}): its {i_name} axis is "
                             f"{icg}, expected {ic} / groups = {ic // groups} (the channels of '{names['x']}' "
                             f"divided by groups={groups})")
        return n, ic, oc, icg, kernel, in_size, out_size

    def _pads(self, rank: int, in_size, strides, eff, out_pad) -> tuple[tuple[int, ...], tuple[int, ...]]:
        mode = self.attrs.get("auto_pad", "none")
        if mode != "none":
            if self.d.transposed and in_size is not None:  # a gradient: P != 0 keeps the forward's pads
                in_size = tuple(None if p else i for i, p in zip(in_size, out_pad))
            return auto_pads(mode, in_size, strides, eff)
        return (per_axis(self.d, self.attrs, "pads_begin", rank, self.lenient),
                per_axis(self.d, self.attrs, "pads_end", rank, self.lenient))

    def _sizes(self, in_size, out_size, strides, eff, pb, pe, out_pad):
        """(I, O) of the convolution. ConvTranspose: I from its formula. Every other op: O from
        the convolution formula, checked against the given O; for ConvTransposeBackwardData/Weights
        x is diff_dst, and O follows from it and output_padding (:func:`transposed_input_size`;
        the trailing rows no window reads get no gradient)."""
        names = {spec.role: spec.name for spec, _ in self.given.values()}
        names.setdefault("x", self.d.shape_attr)  # y is given wherever its name is used
        if in_size is None:  # ConvTranspose: output size from the formula
            size = tuple(st * (o - 1) + k - b - e + p for o, st, k, b, e, p in zip(out_size, strides, eff, pb, pe, out_pad))
            if any(s < 1 for s in size):
                raise ShapeError(self.op, names["y"], f"has spatial size {list(out_size)}: the output size "
                                 f"S*(I-1) + EK - PB - PE + output_padding = {list(size)} must be positive")
            return size, tuple(out_size)
        span = [i + b + e - k for i, b, e, k in zip(in_size, pb, pe, eff)]
        expected = tuple(s // st + 1 for s, st in zip(span, strides))
        if self.d.transposed:
            fitted = tuple(transposed_input_size(*sizes) for sizes in zip(in_size, strides, eff, pb, pe, out_pad))
            if out_size is not None and tuple(out_size) != fitted:
                self._transposed_size_error(names, in_size, out_size, strides, eff, pb, pe, out_pad)
            if None in fitted:
                raise ShapeError(self.op, names["x"], f"has spatial size {list(in_size)}: no ConvTranspose input size "
                                 "I gives it as D = S*(I-1) + EK - PB - PE + P, I >= 1 (P = output_padding "
                                 "where it is >= S, else any P from 0 to S - 1): D + PB + PE - EK - P = "
                                 f"{[sp - (p if p >= st else 0) for sp, p, st in zip(span, out_pad, strides)]} must be "
                                 f">= 0, and a multiple of S where P >= S (S={list(strides)}, EK={list(eff)}, "
                                 f"PB={list(pb)}, PE={list(pe)}, P={list(out_pad)})")
            return tuple(in_size), fitted
        if any(s < 0 for s in span):
            raise ShapeError(self.op, names["x"], f"has spatial size {list(in_size)}: with pads_begin "
                             f"{list(pb)}, pads_end {list(pe)} and effective kernel {list(eff)} "
                             "(dilations applied) the output size would be below 1")
        if out_size is not None and tuple(out_size) != expected:
            raise ShapeError(self.op, names["y"], f"has spatial size {list(out_size)}: expected {list(expected)}"
                             f" = floor((I + PB + PE - EK) / S) + 1 for I={list(in_size)}, PB={list(pb)}, "
                             f"PE={list(pe)}, EK={list(eff)}, S={list(strides)}")
        return tuple(in_size), expected


    def _transposed_size_error(self, names, in_size, out_size, strides, eff, pb, pe, out_pad):
        mode = self.attrs.get("auto_pad", "none")
        lo, hi = input_size_range(tuple(out_size), strides, eff, pb, pe, mode, out_pad)
        rule = (f"S*(I-1) + EK - PB - PE + P where output_padding P >= S, else from S*(I-1) + EK - PB - PE (S*(I-1) + 1 "
                f"with auto_pad {mode}, whose pads then follow D) up to S - 1 more (the rows an output_padding < S "
                f"adds); S={list(strides)}, EK={list(eff)}, PB={list(pb)}, PE={list(pe)}, P={list(out_pad)}")
        raise ShapeError(self.op, names["x"], f"has spatial size {list(in_size)}: expected a size from {list(lo)} "
                         f"to {list(hi)} per axis, the sizes D of the ConvTranspose output for its input size "
                         f"I={list(out_size)} of '{names['y']}': {rule}")


def _layout_hint(definition: OpDef, attrs: Attrs, inputs: list[TensorInfo | None], lenient: bool) -> str | None:
    """"did you mean data_format='NCX', weights_format='OIX'?" where the shapes that failed fit other
    formats (PyTorch's NCX with OIX/IOX first): arrays in PyTorch's layout under the defaults."""
    wf = definition.weights_format_attr
    given = (attrs.get("data_format", "NXC"), attrs.get(wf, definition.attr(wf).default))
    choices = definition.attr(wf).choices
    for fmt, wfmt in ((f, w) for f in ("NCX", "NXC") for w in sorted(choices)):  # OIX/IOX before XIO/XOI
        if (fmt, wfmt) == given:
            continue
        try:
            _Inference(definition, {**attrs, "data_format": fmt, wf: wfmt}, inputs, lenient).run()
        except ConvgradError:
            continue
        changes = [f"{name}={value!r}" for name, value, old in (("data_format", fmt, given[0]), (wf, wfmt, given[1]))
                   if value != old]
        return f"did you mean {', '.join(changes)}?"
    return None


def build_problem(definition: OpDef, attrs: Attrs, inputs: list[TensorInfo | None], lenient: bool) -> Problem:
    """Resolve an op invocation into a :class:`Problem`, or raise a convgrad error saying why not
    (including sizes beyond int64 and an output over the memory budget: nothing is allocated)."""
    bias = next((i for s, i in zip(definition.inputs, inputs) if s.role == "bias" and i is not None), None)
    try:
        problem = _Inference(definition, attrs, list(inputs), lenient).run()
    except (ShapeError, AttributeValueError) as exc:
        hint = _layout_hint(definition, attrs, list(inputs), lenient)
        if hint:
            exc.args = (f"{exc.args[0]} ({hint})",)
        raise
    check_sizes(problem)
    if bias is not None:
        channels = problem.geometry.oc if definition.output.role == "y" else problem.geometry.ic
        if bias.shape != (channels,):
            raise ShapeError(definition.kind, "bias", f"has shape {list(bias.shape)}: expected [{channels}], "
                             f"one value per channel of {definition.output.name}")
    return problem
