"""Shared pieces of the reliability tests: fuzz settings, valid random problems, hostile values,
input fingerprints and the result comparison.

``CONVGRAD_FUZZ_EXAMPLES`` scales every fuzz test (``make fuzz`` sets it to 5000).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import convgrad as cg
from convgrad.opdefs import ops_of
from convgrad.dtypes import DATA_DTYPES
from convgrad.problem import auto_pads, data_shape, weights_shape

#: Examples per fuzz test: small in the suite, large with ``CONVGRAD_FUZZ_EXAMPLES``.
FUZZ_EXAMPLES = int(os.environ.get("CONVGRAD_FUZZ_EXAMPLES", "0")) or None


def examples(suite: int, exhaustive: int) -> int:
    """Examples of a random test: ``suite`` in the default suite (each new shape compiles kernel
    variants), ``exhaustive`` with ``CONVGRAD_EXHAUSTIVE=1`` (``make test-all``),
    ``CONVGRAD_FUZZ_EXAMPLES`` where set."""
    return FUZZ_EXAMPLES or (exhaustive if os.environ.get("CONVGRAD_EXHAUSTIVE") == "1" else suite)


def fuzz_settings(default_examples: int) -> settings:
    """Bounded settings for one fuzz test (no deadline: the machine may be busy)."""
    return settings(max_examples=FUZZ_EXAMPLES or default_examples, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])


TOLERANCE = {"f64": 1e-10, "f32": 1e-4, "f16": 4e-3, "bf16": 2e-2}


def fingerprint(value: Any, seen: frozenset[int] = frozenset()) -> Any:
    """What must not change about an input: bytes, shape, strides, dtype and flags of an array
    (and of the arrays inside lists and tuples)."""
    if id(value) in seen:
        return "<cycle>"
    if isinstance(value, np.ndarray):
        distinct = value[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in value.strides)]
        data = repr(value.tolist()) if value.dtype.hasobject else \
            hashlib.sha256(np.ascontiguousarray(distinct).tobytes()).hexdigest()  # broadcast: its values once
        return (data, value.shape, value.strides, value.dtype.str, value.flags.writeable,
                value.flags.c_contiguous, value.flags.f_contiguous)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(fingerprint(v, seen | {id(value)}) for v in value)
    return repr(value)


def assert_close(got: np.ndarray, want: np.ndarray, dtype_name: str) -> None:
    """``got`` equals ``want`` within the dtype's tolerance (relative to the largest value)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)))
    tol = TOLERANCE[dtype_name]
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# Valid random problems
# ---------------------------------------------------------------------------------------------
@dataclass
class Call:
    """One op's attributes and inputs (spec order)."""

    kind: str
    attrs: dict[str, Any]
    inputs: list[Any]

    def op(self) -> cg.Op:
        return cg.Op(self.kind, **self.attrs)


@dataclass
class Case(Call):
    """A valid invocation of one op, with the expected output shape and dtype."""

    output_shape: tuple[int, ...]
    dtype: str


LAYOUTS = ("c", "fortran", "strided", "reversed", "readonly")


def relayout(array: np.ndarray, how: str) -> np.ndarray:
    """The same values as a differently laid-out array: C, Fortran, strided view, view with
    negative strides, read-only."""
    if how == "fortran":
        return np.asfortranarray(array)
    if how == "strided":
        big = np.zeros((*array.shape[:-1], 2 * array.shape[-1]), dtype=array.dtype)
        big[..., ::2] = array
        return big[..., ::2]
    if how == "reversed":
        return np.flip(np.flip(array, 0).copy(), 0)
    if how == "readonly":
        array = array.copy()
        array.setflags(write=False)
    return array


def random_case(rng: np.random.Generator, kind: str | None = None, max_rank: int = 3) -> Case:
    """A random valid invocation of ``kind`` (default: a random op) covering every attribute,
    layout, dtype, shape route (attribute, s32/s64 tensor, list, both) and input memory layout."""
    pick = lambda options: options[rng.integers(len(options))]  # noqa: E731
    ints = lambda lo, hi, size=None: rng.integers(lo, hi + 1, size).tolist()  # noqa: E731
    kind = kind or pick(sorted(ops_of("convolution")))
    d = cg.OPS[kind]
    rank = ints(1, max_rank)
    n, groups, icg, ocg = ints(0, 2), ints(1, 3), ints(1, 3), ints(1, 3)
    kernel, strides, dilations = ints(1, 3, rank), ints(1, 3, rank), ints(1, 2, rank)
    eff = [(k - 1) * dd + 1 for k, dd in zip(kernel, dilations)]
    in_size = [e + ints(0, 4) for e in eff]
    mode = pick(["none", "none", "valid", "same_upper", "same_lower"])
    if mode == "none":
        pb, pe = tuple(ints(0, 2, rank)), tuple(ints(0, 2, rank))
    else:
        pb, pe = auto_pads(mode, None if kind == "ConvTranspose" else tuple(in_size), tuple(strides), tuple(eff))
    span = [i + b + e - k for i, b, e, k in zip(in_size, pb, pe, eff)]
    out_size = [s // st_ + 1 for s, st_ in zip(span, strides)]
    out_pad = [s % st_ for s, st_ in zip(span, strides)]  # makes the transposed formula give in_size
    dtype = pick(list(DATA_DTYPES))
    fmt, wfmt = pick(["NCX", "NXC"]), pick(d.attr(d.weights_format_attr).choices)
    ic, oc = icg * groups, ocg * groups
    shapes = {"x": data_shape(n, ic, tuple(in_size), fmt), "y": data_shape(n, oc, tuple(out_size), fmt),
              "w": weights_shape(oc, icg, tuple(kernel), wfmt)}
    attrs: dict[str, Any] = {
        "strides": strides, "dilations": dilations, "groups": groups, "data_format": fmt,
        "pads_begin": list(pb) + [0] * pick([0, 12 - rank]), "pads_end": list(pe) + [0] * pick([0, 12 - rank]),
        "auto_pad": pick([mode, mode.upper()]), d.weights_format_attr: wfmt,  # oneDNN writes 12-entry lists
    }
    if "output_padding" in d.attr_names:  # the ConvTranspose gradients: any below S (docs/semantics.md)
        attrs["output_padding"] = out_pad if kind == "ConvTranspose" else [0] * rank if not d.transposed \
            or mode.startswith("same") else [ints(0, st_ - 1) for st_ in strides]
    np_dtype = DATA_DTYPES[dtype]
    inputs: list[Any] = []
    for spec in d.inputs:
        if spec.role == "shape":
            values = list(shapes[d.output.role])
            route = pick(["attr", "int32", "int64", "list", "both"])
            if route in ("attr", "both"):
                attrs[d.shape_attr] = values
            inputs.append(None if route == "attr" else values if route == "list"
                          else np.array(values, dtype="int64" if route == "int64" else "int32"))
        elif spec.role == "bias":
            if rng.integers(2):
                channels = oc if d.output.role == "y" else ic
                inputs.append(relayout(rng.standard_normal(channels).astype(np_dtype), pick(LAYOUTS)))
        else:
            inputs.append(relayout(rng.standard_normal(shapes[spec.role]).astype(np_dtype), pick(LAYOUTS)))
    while inputs and inputs[-1] is None and rng.integers(2):
        inputs.pop()
    return Case(kind, attrs, inputs, tuple(shapes[d.output.role]), dtype)


def valid_cases(max_rank: int = 3) -> st.SearchStrategy[Case]:
    """Hypothesis strategy of :func:`random_case` (the failing case is printed in full)."""
    return st.integers(0, 2**63).map(lambda seed: random_case(np.random.default_rng(seed), max_rank=max_rank))


# ---------------------------------------------------------------------------------------------
# Hostile values
# ---------------------------------------------------------------------------------------------
class RaisingArray:
    """``__array__`` raises."""

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise RuntimeError("no array for you")


class RaisingDLPack:
    """``__dlpack__`` raises an unexpected exception type."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        raise KeyError("dlpack")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class RaisingSequence:
    """A sequence whose length and items raise."""

    def __len__(self) -> int:
        raise ZeroDivisionError("len")

    def __getitem__(self, index: Any) -> Any:
        raise IndexError(index)


class RaisingNumber:
    """Comparisons, truth value and conversions raise."""

    def __eq__(self, other: object) -> bool:
        raise ArithmeticError("eq")

    __ne__ = __lt__ = __gt__ = __le__ = __ge__ = __eq__
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise ArithmeticError("bool")

    def __index__(self) -> int:
        raise OverflowError("index")

    __int__ = __float__ = __index__


numbers.Integral.register(RaisingNumber)  # claims to be an integer, but int() fails


class RaisingMapping(Mapping):
    """A mapping whose every access raises."""

    def __getitem__(self, key: Any) -> Any:
        raise LookupError(key)

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("iter")

    def __len__(self) -> int:
        raise RuntimeError("len")


def _self_containing_list() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


_WEIRD = st.sampled_from([RaisingArray, RaisingDLPack, RaisingSequence, RaisingNumber, RaisingMapping, object,
                          _self_containing_list]).map(lambda make: make())
_ODD_DTYPES = st.sampled_from(["f4", "f8", "f2", "i4", "i8", "u1", "?", "c8", "c16", ">f4", "<f8", "M8[s]",
                               "m8[s]", "U3", "S2", "O", "V4", "bfloat16"])


def _arrays() -> st.SearchStrategy[np.ndarray]:
    def make(dtype: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
        dt = np.dtype(DATA_DTYPES["bf16"] if dtype == "bfloat16" else dtype)
        if dt.kind in "fc":
            return np.full(shape, fill, dtype=dt)
        return np.zeros(shape, dtype=dt)
    return st.builds(make, _ODD_DTYPES, hnp.array_shapes(min_dims=0, max_dims=6, min_side=0, max_side=3),
                     st.floats(allow_nan=True, allow_infinity=True, width=16))


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=4),
    st.complex_numbers(max_magnitude=1e3), st.just(Ellipsis), st.just(slice(1, 2)),
    st.sampled_from(["f32", "bf16", "NCX", "nxc", "same_upper", "VALID", "reference", "", "none"]),
    st.sampled_from([np.float32(1.5), np.int32(2), np.int64(-1), np.bool_(True), np.float64("nan")]),
)

#: Any Python value a confused caller might pass: scalars, containers, arrays, generators, objects.
hostile = st.recursive(
    st.one_of(_SCALARS, _arrays(), _WEIRD, st.builds(lambda n: (i for i in range(n)), st.integers(0, 4)),
              st.frozensets(st.integers(0, 3), max_size=3)),
    lambda children: st.one_of(st.lists(children, max_size=5), st.tuples(children, children),
                               st.dictionaries(st.text(max_size=3), children, max_size=3)),
    max_leaves=8,
)



# ---------------------------------------------------------------------------------------------
# Absurdly large problems (issue 14): every call must fail at once, naming a tensor and its size
# ---------------------------------------------------------------------------------------------
#: At least this many values in the huge tensor: beyond any memory budget (40 TB in f32).
HUGE = 10**13
#: Values whose bytes (8 a value at least) pass int64: shape inference itself must refuse.
ASTRONOMIC = 2 * 10**18
_HUGE_WAYS = ("output", "weights", "channels", "shape_length", "beyond_int64")
_BROADCAST_DTYPES = ("f32", "f16", "bf16", "f64", ">f4")  # >f4: a byte-swapped view, swapped compactly


@dataclass
class HugeCase(Call):
    """A consistent call whose result or working set cannot fit: ``names`` are the op's tensors
    (and shape), one of which the error must name; ``way`` says which tensor is absurd."""

    names: tuple[str, ...]
    way: str


def _spread(draw: Any, total: int, axes: int) -> list[int]:
    """``axes`` sizes whose product is at least ``total``, each a random bit above the even share."""
    base = math.ceil(total ** (1 / axes))
    while base**axes < total:
        base += 1
    return [base + draw(st.integers(0, base // 2)) for _ in range(axes)]


def _broadcast(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A read-only zero-stride view of one non-zero value: any size, no memory."""
    dt = np.dtype(DATA_DTYPES[dtype] if dtype in DATA_DTYPES else dtype)
    return np.broadcast_to(np.full((), 0.5, dt), shape)


@st.composite
def huge_cases(draw: Any) -> HugeCase:
    """One op on a consistent problem (stride S, kernel K, pads 0, I = S*(O-1) + K) in which one
    tensor is absurd: the output (huge declared shape, or a huge kernel for the weights
    gradients), the weights input (a huge kernel), huge channel counts, a shape tensor of
    millions of values, or a declared shape past int64. Data inputs are zero-stride broadcast
    views; shapes come as attribute or s32 tensor (attribute where a value passes s32)."""
    kind = draw(st.sampled_from(ops_of("convolution")), label="kind")
    d = cg.OPS[kind]
    rank = draw(st.integers(1, 3), label="rank")
    way = draw(st.sampled_from(_HUGE_WAYS), label="way")
    if way == "weights" and all(s.role != "w" for s in d.inputs):
        way = "output"
    if way == "shape_length" and d.shape_attr is None or way == "beyond_int64" and d.output.role != "x":
        way = "channels"
    small = st.integers(1, 3)
    n, icg, ocg = draw(small), draw(small), draw(small)
    kernel, strides, out = [draw(small) for _ in range(rank)], [1] * rank, [draw(st.integers(1, 2)) for _ in range(rank)]
    role = d.output.role if way in ("output", "beyond_int64") else "w" if way == "weights" else None
    if role == "x":  # a huge input side from huge strides: y and w stay small
        out = [draw(st.integers(2, 3)) for _ in range(rank)]
        strides = _spread(draw, (ASTRONOMIC if way == "beyond_int64" else HUGE) // (n * icg), rank)
    elif role == "y":
        out = _spread(draw, HUGE // (n * ocg), rank)
    elif role == "w":
        kernel = _spread(draw, HUGE // (icg * ocg), rank)
    elif way == "channels":
        icg = ocg = _spread(draw, HUGE // math.prod(kernel), 2)[0]
    in_size = [s * (o - 1) + k for s, o, k in zip(strides, out, kernel)]
    dtype = draw(st.sampled_from(_BROADCAST_DTYPES), label="dtype")
    shapes = {"x": data_shape(n, icg, tuple(in_size), "NXC"), "y": data_shape(n, ocg, tuple(out), "NXC"),
              "w": weights_shape(ocg, icg, tuple(kernel), "XIO" if not d.transposed else "XOI")}
    attrs: dict[str, Any] = {"strides": strides, "dilations": [1] * rank, "pads_begin": [0] * rank,
                             "pads_end": [0] * rank}
    inputs: list[Any] = []
    for spec in d.inputs:
        if spec.role == "shape":
            values = list(shapes[d.output.role])
            if way == "shape_length":
                inputs.append(np.broadcast_to(np.int32(1), (draw(st.integers(13, 10**9), label="length"),)))
            elif max(values) > 2**31 - 1 or draw(st.booleans(), label="shape as attribute"):
                attrs[d.shape_attr] = values
            else:
                inputs.append(np.array(values, dtype=np.int32))
        elif spec.role != "bias":
            inputs.append(_broadcast(shapes[spec.role], dtype))
    names = tuple(s.name for s in (*d.inputs, d.output))
    return HugeCase(kind, attrs, inputs, names, way)
