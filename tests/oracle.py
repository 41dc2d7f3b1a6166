"""PyTorch float64 autograd as the outside oracle, and the glue from its results to every op.

Everything here is written from SEMANTICS.md, independently of ``convgrad``'s own shape inference:
a :class:`Geometry` is the underlying forward convolution ``y = conv(x, w)`` (NCX / OIX, explicit
resolved pads); :func:`torch_results` computes y, dy-gradients gx and gw with torch autograd;
:class:`Case` maps those onto one op (which tensor is which input/output, in which layout, with
which attributes) and runs convgrad through either API.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

import convgrad as cg

OPS = ("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvolutionBackpropFilters",
       "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
TRANSPOSED = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
BF16 = np.dtype(ml_dtypes.bfloat16)
torch.set_num_threads(1)  # two xdist workers share two cores

# Which canonical tensor feeds each input (spec index order) and which one the output is.
# "xshape"/"wshape" are the shapes of x / w given as input 2 or as the shape attribute.
IO = {
    "Convolution": (("x", "w", "bias"), "y"),
    "ConvolutionBackwardData": (("dy", "w", "xshape"), "gx"),
    "ConvolutionBackwardWeights": (("x", "dy", "wshape"), "gw"),
    "ConvolutionBackpropFilters": (("x", "dy", "wshape"), "gw"),
    "ConvTranspose": (("dy", "w", "bias"), "gx"),
    "ConvTransposeBackwardData": (("x", "w"), "y"),
    "ConvTransposeBackwardWeights": (("dy", "x", "wshape"), "gw"),
}
SHAPE_ATTR = {"ConvolutionBackwardData": "dst_shape", "ConvolutionBackwardWeights": "weights_shape",
              "ConvolutionBackpropFilters": "filter_shape", "ConvTransposeBackwardWeights": "weights_shape"}
WEIGHTS_FORMATS = {kind: (("IOX", "XOI") if kind in TRANSPOSED else ("OIX", "XIO")) for kind in OPS}


def fresh_rng() -> tuple[np.random.Generator, int]:
    """An unseeded generator and the seed that reproduces it (put the seed in assertion messages)."""
    seed = int(np.random.SeedSequence().entropy)
    return np.random.default_rng(seed), seed


def function_of(kind: str):
    return getattr(cg, cg.OPS[kind].function)


# ---------------------------------------------------------------------------------------------
# The underlying convolution
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    n: int
    groups: int
    icg: int
    ocg: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def ic(self) -> int:
        return self.groups * self.icg

    @property
    def oc(self) -> int:
        return self.groups * self.ocg

    @property
    def eff(self) -> tuple[int, ...]:
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def span(self) -> tuple[int, ...]:
        return tuple(i + b + e - k for i, b, e, k in zip(self.in_size, self.pads_begin, self.pads_end, self.eff))

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(s // st + 1 for s, st in zip(self.span, self.strides))

    @property
    def extra(self) -> tuple[int, ...]:
        """output_padding that makes ConvTranspose of the output give back in_size."""
        return tuple(s % st for s, st in zip(self.span, self.strides))

    @property
    def valid(self) -> bool:
        return all(s >= 0 for s in self.span)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.ic, *self.in_size)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.oc, *self.out_size)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.oc, self.icg, *self.kernel)


def same_total(kind: str, size: int, stride: int, eff: int) -> int:
    """Total auto_pad same_* padding along one axis (SEMANTICS.md)."""
    rem = 0 if kind == "ConvTranspose" else size % stride
    return max(0, eff - stride) if rem == 0 else max(0, eff - rem)


def resolve_pads(kind: str, auto_pad: str, in_size, kernel, strides, dilations, pads_begin, pads_end):
    """The pads the op must use: explicit ones for none, else computed (odd extra: upper->end, lower->begin)."""
    if auto_pad == "none":
        return tuple(pads_begin), tuple(pads_end)
    if auto_pad == "valid":
        return (0,) * len(kernel), (0,) * len(kernel)
    begin, end = [], []
    for i, k, s, d in zip(in_size, kernel, strides, dilations):
        total = same_total(kind, i, s, (k - 1) * d + 1)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "same_upper" else big)
        end.append(total - begin[-1])
    return tuple(begin), tuple(end)


# ---------------------------------------------------------------------------------------------
# Torch results and layouts
# ---------------------------------------------------------------------------------------------
def random_tensors(geom: Geometry, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
    """Random non-zero x, w, dy, bias (NCX / OIX), representable in ``dtype``, as float64."""
    def draw(shape):
        values = rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
        return values.astype(dtype).astype(np.float64)
    return {"x": draw(geom.x_shape), "w": draw(geom.w_shape), "dy": draw(geom.y_shape),
            "bias_y": draw((geom.oc,)), "bias_x": draw((geom.ic,))}


def torch_conv(geom: Geometry, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    pad = [p for b, e in zip(reversed(geom.pads_begin), reversed(geom.pads_end)) for p in (b, e)]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[geom.rank]
    return conv(F.pad(x, pad), w, stride=geom.strides, dilation=geom.dilations, groups=geom.groups)


def torch_results(geom: Geometry, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """y = conv(x, w), gx = d<y, dy>/dx, gw = d<y, dy>/dw (float64 autograd), plus the inputs."""
    x = torch.tensor(tensors["x"], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(tensors["w"], dtype=torch.float64, requires_grad=True)
    y = torch_conv(geom, x, w)
    assert tuple(y.shape) == geom.y_shape
    (y * torch.tensor(tensors["dy"])).sum().backward()
    return dict(tensors, y=y.detach().numpy(), gx=x.grad.numpy(), gw=w.grad.numpy())


def data_layout(a: np.ndarray, data_format: str) -> np.ndarray:
    """An NCX array in ``data_format``."""
    return a if data_format == "NCX" else np.moveaxis(a, 1, -1)


def weights_layout(w: np.ndarray, weights_format: str) -> np.ndarray:
    """OIX weights of the convolution in any weights format (IOX/XOI of a ConvTranspose are OIX/XIO)."""
    return w if weights_format[0] != "X" else np.transpose(w, (*range(2, w.ndim), 1, 0))


# ---------------------------------------------------------------------------------------------
# One op on one geometry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One op invocation whose expected result the oracle knows.

    ``geom`` holds the resolved pads; ``auto_pad`` != none makes the op compute them itself (the
    explicit ``given_pads`` passed with it must then be ignored).
    """

    kind: str
    geom: Geometry
    data_format: str = "NCX"
    weights_format: str | None = None
    auto_pad: str = "none"
    bias: bool = False
    shape_via: str = "input"  # or "attr"
    api: str = "op"  # or "functional"
    given_pads: tuple | None = None  # None: the resolved pads; (): none; else (begin, end) to be ignored
    extra_attrs: dict = field(default_factory=dict)

    @property
    def has_bias(self) -> bool:
        return self.bias and "bias" in IO[self.kind][0]

    @property
    def wfmt(self) -> str:
        return self.weights_format or WEIGHTS_FORMATS[self.kind][0]

    def attrs(self) -> dict:
        g = self.geom
        attrs = dict(strides=list(g.strides), dilations=list(g.dilations), auto_pad=self.auto_pad, groups=g.groups,
                     data_format=self.data_format)
        if self.given_pads != ():  # () = leave the pads out (allowed when auto_pad is not none)
            pads = self.given_pads or (g.pads_begin, g.pads_end)
            attrs.update(pads_begin=list(pads[0]), pads_end=list(pads[1]))
        attrs["filter_format" if self.kind == "ConvolutionBackpropFilters" else "weights_format"] = self.wfmt
        if self.kind in TRANSPOSED or self.kind == "ConvolutionBackwardData":
            attrs["output_padding"] = list(g.extra)
        if self.shape_via == "attr" and self.kind in SHAPE_ATTR:
            attrs[SHAPE_ATTR[self.kind]] = list(self._shape_value())
        attrs.update(self.extra_attrs)
        return attrs

    def _shape_value(self) -> tuple[int, ...]:
        return self.layout("gx" if IO[self.kind][1] == "gx" else "gw", None)

    def layout(self, name: str, results: dict | None):
        """A canonical tensor (or, with results None, its shape) in this op's layout."""
        g = self.geom
        if name in ("w", "gw"):
            value = results[name] if results is not None else np.empty(g.w_shape)
            out = weights_layout(value, self.wfmt)
        else:
            shape = {"x": g.x_shape, "gx": g.x_shape, "y": g.y_shape, "dy": g.y_shape}[name]
            value = results[name] if results is not None else np.empty(shape)
            out = data_layout(value, self.data_format)
        return out if results is not None else out.shape

    def inputs(self, results: dict, dtype=np.float64) -> list:
        names, _ = IO[self.kind]
        values = []
        for name in names:
            if name == "bias":
                if self.has_bias:
                    values.append(results["bias_y" if self.kind == "Convolution" else "bias_x"].astype(dtype))
            elif name in ("xshape", "wshape"):
                if self.shape_via == "input":
                    values.append(np.array(self._shape_value(), dtype=np.int32))
            else:
                values.append(np.ascontiguousarray(self.layout(name, results)).astype(dtype))
        return values

    def expected(self, results: dict) -> np.ndarray:
        out = IO[self.kind][1]
        value = results[out]
        if self.has_bias:
            bias = results["bias_y" if self.kind == "Convolution" else "bias_x"]
            value = value + bias.reshape(-1, *(1,) * self.geom.rank)
        return np.ascontiguousarray(self.layout(out, dict(results, **{out: value})))

    def run(self, inputs: list, engine=None) -> np.ndarray:
        attrs = self.attrs()
        if self.api == "op":
            return cg.Op(self.kind, **attrs)(*inputs, engine=engine)
        # The functional API is lenient: leave out what it defaults (pads 0, dilations 1, auto_pad none).
        for name, default in (("pads_begin", 0), ("pads_end", 0), ("dilations", 1)):
            if name in attrs and all(v == default for v in attrs[name]):
                del attrs[name]
        shape = attrs.pop(SHAPE_ATTR.get(self.kind), None)
        if shape is not None:  # the functional API takes the shape positionally
            inputs = [*inputs, tuple(shape)]
        return function_of(self.kind)(*inputs, **attrs, engine=engine)

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)


def tolerance_f64(want: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """Absolute tolerance for a float64 result: a few ulps of the sum of |terms|."""
    return 64 * np.finfo(np.float64).eps * (np.abs(want) + magnitude) + 1e-300


def magnitude(case: Case, results: dict) -> np.ndarray:
    """sum |terms| of every output element: the same problem on absolute values (for tolerances)."""
    absolute = {k: np.abs(v) for k, v in results.items() if k in ("x", "w", "dy", "bias_x", "bias_y")}
    return case.expected(torch_results(case.geom, absolute))


def reduction_length(case: Case) -> int:
    """Longest sum behind one output element (for tolerances)."""
    g = case.geom
    out = IO[case.kind][1]
    if out == "y":
        return g.icg * math.prod(g.kernel)
    if out == "gx":
        return g.ocg * math.prod(g.kernel)
    return g.n * math.prod(g.out_size)


def check(case: Case, results: dict, seed: int, engine=None) -> np.ndarray:
    """Run ``case`` on the oracle's f64 inputs and compare with torch; returns the output."""
    got = case.run(case.inputs(results), engine=engine)
    want = case.expected(results)
    msg = f"{case} engine={engine} seed={seed}"
    assert got.shape == want.shape and got.dtype == np.float64, msg
    err = np.abs(got - want)
    tol = tolerance_f64(want, magnitude(case, results))
    assert (err <= tol).all(), f"{msg}: max error {err.max():.3g}"
    return got


def tensor_hash(a) -> tuple:
    """Everything about an input that a call must leave alone."""
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype, a.numpy().tobytes() if a.dtype != torch.bfloat16
                else a.view(torch.int16).numpy().tobytes())
    if not isinstance(a, np.ndarray):
        return repr(a)
    return (a.shape, a.strides, a.dtype, a.flags.writeable, a.tobytes())


# ---------------------------------------------------------------------------------------------
# Geometries with odd auto_pad totals
# ---------------------------------------------------------------------------------------------
GROUP_KINDS = {"g1": (1, 3, 4), "grouped": (2, 2, 3), "depthwise": (3, 1, 2)}  # (groups, icg, ocg)


def make_geometry(kind: str, rank: int, group_kind: str, strides, dilations, kernel, pads, auto_pad: str,
                  sizes=(5, 8, 7), n: int = 2) -> Geometry:
    """A valid geometry for ``kind`` in which N, IC, OC and the spatial sizes all differ; for same_*
    the dilation/kernel/size are nudged until every axis has an odd total padding (so the
    upper/lower split matters)."""
    groups, icg, ocg = GROUP_KINDS[group_kind]
    used = {n, groups * icg, groups * ocg}
    axes = []
    for axis in range(rank):
        s, d0, k0, i0 = strides[axis], dilations[axis], kernel[axis], sizes[axis]
        pb, pe = pads[0][axis], pads[1][axis]
        for d, k, i in itertools.product((d0, d0 + 1), range(k0, k0 + 4), range(i0, i0 + 4 * s + 8)):
            eff = (k - 1) * d + 1
            if auto_pad.startswith("same"):
                ok = same_total(kind, i, s, eff) % 2 == 1 and i + same_total(kind, i, s, eff) >= eff
            else:
                ok = i + (pb + pe if auto_pad == "none" else 0) >= eff
            if ok and i not in used:
                break
        used.add(i)
        axes.append((s, d, k, i))
    strides, dilations, kernel, in_size = (tuple(a[j] for a in axes) for j in range(4))
    pb, pe = resolve_pads(kind, auto_pad, in_size, kernel, strides, dilations, pads[0][:rank], pads[1][:rank])
    geom = Geometry(n, groups, icg, ocg, in_size, kernel, strides, dilations, pb, pe)
    assert geom.valid, geom
    return geom


def as_bits(a: np.ndarray) -> np.ndarray:
    """Monotonic integers of a 16- or 32-bit float array: neighbouring values differ by 1."""
    a = np.ascontiguousarray(a)
    width = 8 * a.dtype.itemsize
    bits = a.view(np.uint16 if width == 16 else np.uint32).astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def round_nearest(values: np.ndarray, dtype) -> np.ndarray:
    """Round float64 to a 16-bit float dtype once, to nearest even, independently of convgrad:
    take the (possibly double-rounded) cast and its two neighbours, keep the nearest."""
    dtype = np.dtype(dtype)
    values = np.asarray(values, dtype=np.float64)
    first = values.astype(dtype).view(np.uint16).astype(np.int64)
    best = first.copy()
    best_err = np.full(values.shape, np.inf)
    for delta in (-1, 0, 1):
        bits = first + delta
        ok = (bits >= 0) & (bits <= 0xFFFF)
        cand = np.where(ok, bits, first).astype(np.uint16).view(dtype).astype(np.float64)
        with np.errstate(invalid="ignore"):
            err = np.abs(values - cand)
        err[~ok | ~np.isfinite(cand)] = np.inf
        better = (err < best_err) | ((err == best_err) & (bits % 2 == 0))
        best = np.where(better, bits, best)
        best_err = np.where(better, err, best_err)
    return best.astype(np.uint16).view(dtype)
