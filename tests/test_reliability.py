"""Reliability of the library API (issue 5), case by case: inputs never modified, the memory
guard, degenerate and odd inputs, NaN/Inf, threads. The random part is test_reliability_fuzz.py."""

from __future__ import annotations

import threading
import time
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from reliability_support import LAYOUTS, Case, fingerprint, random_case, relayout

import convgrad as cg
from convgrad.opdefs import ops_of
from convgrad import limits
from convgrad.dtypes import as_array
from convgrad.engines.reference import ReferenceEngine

OPS = sorted(ops_of("convolution"))
_ATTRS = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])


def _case(kind: str, seed: int = 0, **overrides: Any) -> Case:
    """A valid case of ``kind`` with contiguous, writeable, non-empty f32/f64 inputs."""
    rng = np.random.default_rng(seed)
    while True:
        case = random_case(rng, kind)
        arrays = [a for a in case.inputs if isinstance(a, np.ndarray)]
        if case.dtype in ("f32", "f64") and all(a.flags.c_contiguous and a.flags.writeable and a.size
                                                for a in arrays):
            case.attrs.update(overrides)
            return case


@pytest.fixture(autouse=True)
def default_budget() -> Any:
    """Every test starts and ends with the default memory budget."""
    limits.set_memory_budget(None)
    yield
    limits.set_memory_budget(None)


# ---------------------------------------------------------------------------------------------
# Inputs are never modified
# ---------------------------------------------------------------------------------------------
def _memmap(path: Any, array: np.ndarray, mode: str) -> np.memmap:
    stored = np.memmap(path, dtype=array.dtype, mode="w+", shape=array.shape)
    stored[...] = array
    stored.flush()
    del stored
    return np.memmap(path, dtype=array.dtype, mode=mode, shape=array.shape)


@pytest.mark.parametrize("how", [*LAYOUTS, "memmap_r", "memmap_rplus", "memmap_c"])
@pytest.mark.parametrize("kind", OPS)
def test_inputs_are_never_modified(kind: str, how: str, tmp_path: Any) -> None:
    case = _case(kind, seed=OPS.index(kind))
    inputs: list[Any] = []
    for i, value in enumerate(case.inputs):
        if isinstance(value, np.ndarray) and how.startswith("memmap"):
            value = _memmap(tmp_path / f"in{i}.bin", value, {"memmap_r": "r", "memmap_rplus": "r+",
                                                              "memmap_c": "c"}[how])
        elif isinstance(value, np.ndarray):
            value = relayout(value, how)
        inputs.append(value)
    expected = case.op()(*case.inputs)
    before = [fingerprint(v) for v in inputs]
    files = {p: p.read_bytes() for p in tmp_path.iterdir()}
    result = case.op()(*inputs)
    assert [fingerprint(v) for v in inputs] == before
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert type(result) is np.ndarray and result.flags.c_contiguous and result.flags.writeable
    np.testing.assert_array_equal(result, expected)
    assert not any(np.shares_memory(result, v) for v in inputs if isinstance(v, np.ndarray))


def _close_to_reference(got: np.ndarray, op: cg.Op, inputs: list[Any]) -> None:
    """``got`` against the reference engine on the same inputs (exact f64 sums, rounded once):
    within one ulp of each value (the two roundings may fall on either side of a boundary) plus
    the accumulation error of short sums in f32 (f64 for f64 data) relative to the largest value."""
    want = op(*inputs, engine="reference")
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = float(ml_dtypes.finfo(got.dtype).eps)
    accumulation = 2.0 ** -52 if got.dtype == np.float64 else 2.0 ** -23
    scale = float(np.abs(want.astype(np.float64)).max(initial=1.0))
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=eps, atol=64 * accumulation * scale)


@pytest.mark.parametrize("kind", OPS)
def test_broadcast_inputs_with_zero_strides(kind: str) -> None:
    """Inputs broadcast along every axis but one (zero strides), with random values along that
    axis: the same results as their dense copies, on the reference engine."""
    case = _case(kind)
    rng = np.random.default_rng()
    for axis in (0, -1):
        broadcast = []
        for a in case.inputs:
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                line = [1] * a.ndim
                line[axis] = a.shape[axis]
                a = np.broadcast_to(rng.uniform(-1, 1, line).astype(a.dtype), a.shape)
                assert 0 in a.strides
            broadcast.append(a)
        dense = [np.array(a) if isinstance(a, np.ndarray) else a for a in broadcast]
        got = case.op()(*broadcast)
        _close_to_reference(got, case.op(), dense)


def test_torch_tensors_are_read_not_written() -> None:
    torch = pytest.importorskip("torch")
    case = _case("ConvolutionBackwardWeights")
    tensors = [torch.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a for a in case.inputs]
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in tensors]
    np.testing.assert_array_equal(case.op()(*tensors), case.op()(*case.inputs))
    assert all(torch.equal(t, b) for t, b in zip(tensors, before) if isinstance(t, torch.Tensor))
    with pytest.raises(cg.InputTypeError, match="requires grad"):
        case.op()(tensors[0].requires_grad_(), *tensors[1:])


# ---------------------------------------------------------------------------------------------
# Memory guard and absurd sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [("100", 100), ("2GiB", 2 * 2**30), ("512 mib", 512 * 2**20),
                                           ("1.5GB", 1_500_000_000), ("3k", 3000), (" 7B ", 7)])
def test_parse_size(text: str, expected: int) -> None:
    assert limits.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1GiB", "1 parsec", "1e9", "GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(cg.ResourceError, match="not understood"):
        limits.parse_size(text)


@pytest.mark.parametrize("value", [-1, 1.5, True, np.bool_(True), [1], "lots", np.int64(-2)])
def test_set_memory_budget_rejects(value: Any) -> None:
    with pytest.raises(cg.ResourceError):
        limits.set_memory_budget(value)


def test_default_budget_is_half_the_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVGRAD_MEMORY_BUDGET", raising=False)
    assert 0 < limits.memory_budget() <= limits.available_memory() * limits.DEFAULT_FRACTION
    monkeypatch.setenv("CONVGRAD_MEMORY_BUDGET", "3GiB")
    assert limits.memory_budget() == 3 * 2**30
    cg.set_memory_budget("1MiB")
    assert limits.memory_budget() == 2**20  # the call wins over the environment


@pytest.mark.parametrize("kind", OPS)
def test_over_budget_raises_a_clear_error_before_allocating(kind: str) -> None:
    case = _case(kind)
    op = case.op()
    problem = op.infer(*case.inputs)
    needed = limits.estimate_bytes(problem, cg.get_engine("reference"))
    cg.set_memory_budget(needed - 1)
    with pytest.raises(cg.ResourceError) as info:
        op(*case.inputs, engine="reference")
    message = str(info.value)
    assert f"{needed} bytes" in message and f"{needed - 1} bytes" in message
    assert "set_memory_budget" in message and "CONVGRAD_MEMORY_BUDGET" in message
    cg.set_memory_budget(needed)
    op(*case.inputs, engine="reference")


def test_env_budget_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case("ConvolutionBackwardWeights")
    monkeypatch.setenv("CONVGRAD_MEMORY_BUDGET", "10B")
    with pytest.raises(cg.ResourceError, match="over the memory budget of 10 B"):
        case.op()(*case.inputs)


#: Python-level allocations of a call that do not scale with the problem (einsum paths, views).
_FIXED_OVERHEAD = 64 * 2**10


_MEDIUM = [(1, 1, 1), (2, 1, 2), (1, 2, 4), (3, 2, 1)]  # strides, dilations, groups


def _medium(kind: str, strides: int, dilations: int, groups: int, seed: int = 0) -> tuple[cg.Op, list[Any]]:
    """A 2-D problem of ``kind`` large enough for its arrays to dominate the memory use and for
    NumPy to release the GIL: NCX data (4, 16, 24, 20), 3x3 OIX/IOX weights, random f32 values."""
    attrs = dict(strides=[strides] * 2, dilations=[dilations] * 2, pads_begin=[1, 2], pads_end=[2, 0],
                 groups=groups, data_format="NCX")
    x, w = (4, 16, 24, 20), (16, 16 // groups, 3, 3)
    y = cg.Op("Convolution", weights_format="OIX", **attrs).infer(x, w).output_shape
    d = cg.OPS[kind]
    if d.transposed:  # the output_padding that makes the transposed size formula give x
        span = [i + b + e - 2 * dilations - 1 for i, b, e in zip(x[2:], attrs["pads_begin"], attrs["pads_end"])]
        attrs["output_padding"] = [s % strides for s in span]
    op = cg.Op(kind, **attrs, **{d.weights_format_attr: "IOX" if d.transposed else "OIX"})
    shapes = {"x": x, "y": y, "w": w, "shape": x if d.output.role == "x" else w}
    rng = np.random.default_rng(seed)
    return op, [rng.standard_normal(shapes[s.role]).astype(np.float32) if s.role != "shape"
                else list(shapes["shape"]) for s in d.inputs if s.role != "bias"]


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("strides,dilations,groups", _MEDIUM)
def test_reference_memory_estimate_bounds_the_real_peak(kind: str, strides: int, dilations: int,
                                                        groups: int) -> None:
    op, inputs = _medium(kind, strides, dilations, groups)
    problem, arrays = op.prepare(*inputs)
    estimate = limits.estimate_bytes(problem, ReferenceEngine())
    tracemalloc.start()
    try:
        cg.execution.execute(problem, arrays, ReferenceEngine())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= estimate + _FIXED_OVERHEAD


def test_memmap_larger_than_the_budget_is_refused_before_reading(tmp_path: Any) -> None:
    x = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=(64, 32, 32, 1024))  # 256 MiB, sparse
    cg.set_memory_budget("64MiB")
    tracemalloc.start()
    try:
        with pytest.raises(cg.ResourceError, match="running this problem on the reference engine"):
            cg.convolution(x, np.ones((3, 3, 1024, 8), np.float32), strides=[1, 1], engine="reference")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_absurd_output_is_inferred_but_not_run_and_nothing_is_allocated() -> None:
    op = cg.Op("ConvolutionBackwardData", **_ATTRS)
    shapes = ((10**6, 1000, 1000, 8), (1, 1, 8, 8), [10**6, 1000, 1000, 8])  # an 8e12-element output
    # A small input whose ConvTranspose output (1 x 20001 x 20001 x 8 f32 = 12.8 GB) is over the 1 GiB budget.
    transpose = cg.Op("ConvTranspose", strides=[20_000, 20_000], pads_begin=[0, 0], pads_end=[0, 0],
                      dilations=[1, 1])
    src, w = np.ones((1, 2, 2, 8), np.float32), np.ones((1, 1, 8, 8), np.float32)
    cg.set_memory_budget("1GiB")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        assert op.infer(*shapes).output_shape == shapes[0]  # pure shape inference: any representable size
        assert transpose.infer(src, w).output_shape == (1, 20_001, 20_001, 8)
        with pytest.raises(cg.ResourceError, match="over the memory budget"):
            transpose(src, w)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1 and peak < 2**20


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_weights_gradient_of_a_huge_broadcast_view_fails_at_once(engine: str) -> None:
    """Issue 14: a 1x10^6x10^6x1 broadcast src, a 1x1x1x1 diff_dst and weights_shape
    [10^6, 10^6, 1, 1] (a 10^12-tap kernel) used to hang planning the kernel's taps."""
    x = np.broadcast_to(np.float32(1), (1, 10**6, 10**6, 1))
    start = time.perf_counter()
    with pytest.raises(cg.ResourceError, match=r"'diff_weights' \[1000000, 1000000, 1, 1\] \(1e\+12 values\)"):
        cg.convolution_backward_weights(x, np.ones((1, 1, 1, 1), np.float32), [10**6, 10**6, 1, 1], strides=[1, 1],
                                        engine=engine)
    assert time.perf_counter() - start < 1


def test_huge_weights_input_fails_at_once_naming_every_tensor() -> None:
    """A small result from a 10^12-tap broadcast kernel: the engine's working set (its weights
    converted) is over budget, and the estimate costs no per-tap work."""
    w = np.broadcast_to(np.float32(1), (10**6, 10**6, 1, 1))
    x = np.broadcast_to(np.float32(1), (1, 10**6, 10**6, 1))
    start = time.perf_counter()
    for engine in ("fast", "reference"):
        with pytest.raises(cg.ResourceError, match=r"on the \w+ engine \(tensors 'src' \[1, 1000000, 1000000, 1\] "
                                                   r"\(1e\+12 values\), 'weights' .*'dst' \[1, 1, 1, 1\] \(1 value\)"):
            cg.convolution(x, w, strides=[1, 1], engine=engine)
    assert time.perf_counter() - start < 1


def test_huge_lists_and_shape_tensors_are_refused_before_reading() -> None:
    huge = np.broadcast_to(np.int64(1), (10**9,))
    start = time.perf_counter()
    with pytest.raises(cg.AttributeValueError, match="'strides'.*at most 12 values"):
        cg.Op("Convolution", strides=huge)
    with pytest.raises(cg.ShapeError, match="'dst_shape' has 1000000000 values"):
        cg.Op("ConvolutionBackwardData", **_ATTRS)(np.ones((1, 2, 2, 3), np.float32),
                                                   np.ones((1, 1, 3, 3), np.float32), huge)
    assert time.perf_counter() - start < 1


def test_byte_swapped_broadcast_view_is_converted_compactly() -> None:
    """A big-endian zero-stride view is swapped once per distinct value, not per element (10^12
    elements here), and stays a broadcast view; the op then refuses it for memory at once."""
    x = np.broadcast_to(np.arange(3, dtype=">f4").reshape(1, 1, 3), (2, 5 * 10**11, 3))
    tracemalloc.start()
    try:
        native = as_array(x, "Convolution", "src")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert native.dtype == np.float32 and native.shape == x.shape and native.strides[:2] == (0, 0)
    np.testing.assert_array_equal(native[1, -1], [0, 1, 2])
    assert peak < 2**16
    with pytest.raises(cg.ResourceError, match="'dst' \\[2, 500000000000, 2\\]"):
        cg.convolution(x, np.ones((1, 3, 2), np.float32), strides=[1])


@pytest.mark.parametrize("values,error,match", [
    ([2**31, 1, 1, 1], cg.InputError, "fit in s32"),
    ([-(2**31) - 1, 1, 1, 1], cg.InputError, "fit in s32"),
    (np.array([np.nan, 1, 1, 1]), cg.DTypeError, "nan"),
    (np.array([np.inf, 1, 1, 1]), cg.DTypeError, "inf"),
    (np.array([2.5, 1, 1, 1]), cg.DTypeError, "2.5"),
    ([True, True, True, True], cg.DTypeError, "bool"),
])
def test_bad_shape_tensors(values: Any, error: type, match: str) -> None:
    op = cg.Op("ConvolutionBackwardData", **_ATTRS)
    with pytest.raises(error, match=match):
        op(np.ones((1, 2, 2, 3), np.float32), np.ones((1, 1, 3, 3), np.float32), values)


@pytest.mark.parametrize("attrs,shapes", [
    (dict(_ATTRS, pads_begin=[2**62, 2**62], pads_end=[2**62, 2**62]), ((1, 4, 4, 2), (3, 3, 2, 2))),
    (_ATTRS, ((2**62, 4, 4, 2), (3, 3, 2, 2))),
    (_ATTRS, ((2**70, 4, 4, 2), (3, 3, 2, 2))),
    (_ATTRS, ((0, 2**40, 2**40, 2), (1, 1, 2, 2))),  # found by fuzzing: NumPy refuses it despite the 0
])
def test_sizes_beyond_int64_are_shape_errors(attrs: dict[str, Any], shapes: Any) -> None:
    with pytest.raises(cg.ShapeError, match="beyond int64"):
        cg.Op("Convolution", **attrs).infer(*shapes)


def test_transposed_output_beyond_int64() -> None:
    op = cg.Op("ConvTranspose", **dict(_ATTRS, strides=[2**62, 2**62]))
    with pytest.raises(cg.ShapeError, match="beyond int64"):
        op.infer((1, 4, 4, 2), (3, 3, 2, 2))


# ---------------------------------------------------------------------------------------------
# Degenerate and odd input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", OPS)
def test_batch_zero(kind: str) -> None:
    rng = np.random.default_rng(1)
    case = random_case(rng, kind)
    while case.output_shape[0] if cg.OPS[kind].output.role != "w" else case.inputs[0].shape[0]:
        case = random_case(rng, kind)
    result = case.op()(*case.inputs)
    assert result.shape == case.output_shape
    if cg.OPS[kind].output.role == "w":
        assert result.size and not result.any()  # the gradient of an empty batch is all zeros
    else:
        assert result.size == 0


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("axis", ["channels", "spatial"])
def test_zero_channels_or_spatial_are_shape_errors(kind: str, axis: str) -> None:
    case = _case(kind)
    d = cg.OPS[kind]
    inputs = list(case.inputs)
    i = next(i for i, s in enumerate(d.inputs) if s.role in ("x", "y"))
    shape = list(inputs[i].shape)
    channel_axis = 1 if case.attrs["data_format"] == "NCX" else len(shape) - 1
    shape[channel_axis if axis == "channels" else (2 if channel_axis == 1 else 1)] = 0
    inputs[i] = np.ones(shape, inputs[i].dtype)
    with pytest.raises(cg.ShapeError):
        case.op()(*inputs)


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (1, 1, 1, 1, 1, 1)])
def test_wrong_rank(kind: str, shape: tuple[int, ...]) -> None:
    case = _case(kind)
    with pytest.raises(cg.ShapeError, match="rank"):
        case.op()(np.ones(shape, np.float32), *case.inputs[1:])


@pytest.mark.parametrize("kind", OPS)
def test_wrong_number_of_inputs(kind: str) -> None:
    case = _case(kind)
    d = cg.OPS[kind]
    with pytest.raises(cg.InputError, match="required"):
        case.op()(case.inputs[0])
    with pytest.raises(cg.InputError, match="at most"):
        case.op()(*case.inputs, *[None] * (len(d.inputs) - len(case.inputs)), case.inputs[0])
    with pytest.raises(cg.InputTypeError):
        getattr(cg, d.function)(*case.inputs, *[None] * 4, strides=case.attrs["strides"])


@pytest.mark.parametrize("dtype", ["?", "i4", "i8", "u1", "c8", "c16", "O", "U1", "M8[s]", "V4"])
def test_unsupported_dtypes(dtype: str) -> None:
    case = _case("Convolution")
    with pytest.raises(cg.DTypeError, match="dtype"):
        case.op()(np.zeros(case.inputs[0].shape, dtype), *case.inputs[1:])


def test_mixed_dtypes() -> None:
    case = _case("ConvolutionBackwardWeights")
    other = np.float16 if case.inputs[0].dtype != np.float16 else np.float32
    with pytest.raises(cg.DTypeError, match="share a dtype"):
        case.op()(case.inputs[0], case.inputs[1].astype(other), *case.inputs[2:])


def test_byte_swapped_arrays_are_accepted() -> None:
    case = _case("ConvolutionBackwardData")
    swapped = [a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder != ">" else "<"))
               if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in case.inputs]
    _close_to_reference(case.op()(*swapped), case.op(), case.inputs)


def test_masked_arrays_are_refused() -> None:
    case = _case("Convolution")
    masked = np.ma.masked_array(case.inputs[0], mask=np.zeros(case.inputs[0].shape, bool))
    with pytest.raises(cg.InputTypeError, match="masked"):
        case.op()(masked, *case.inputs[1:])


@pytest.mark.parametrize("shape", [(float("inf"), 4, 4, 2), (float("nan"), 4, 4, 2), (1.5, 4, 4, 2),
                                   ("1", 4, 4, 2), (True, 4, 4, 2), ((1,), 4, 4, 2)])
def test_non_integer_declared_shapes(shape: tuple[Any, ...]) -> None:
    op = cg.Op("Convolution", **_ATTRS)
    with pytest.raises(cg.InputError, match="expected an array or a shape"):
        op.infer(shape, (3, 3, 2, 2))


def test_attributes_as_mapping_and_duplicates() -> None:
    assert cg.Op("Convolution", _ATTRS).attrs == cg.Op("Convolution", **_ATTRS).attrs
    assert cg.Op("Convolution", {"strides": [1, 1]}, dilations=[2, 2], lenient=True).attrs == {
        "strides": (1, 1), "dilations": (2, 2)}  # lenient: the pads may be omitted
    with pytest.raises(cg.AttributeValueError, match="'strides' .* both in the attribute mapping and a keyword"):
        cg.Op("Convolution", {"strides": [1, 1]}, strides=[1, 1])
    with pytest.raises(cg.InputTypeError, match="mapping"):
        cg.Op("Convolution", [("strides", [1, 1])])
    with pytest.raises(cg.InputTypeError, match="at most one attribute mapping"):
        cg.Op("Convolution", {}, {})
    with pytest.raises(cg.UnknownOpError):
        cg.Op()
    with pytest.raises(cg.UnknownAttributeError, match="'Strides'"):
        cg.Op("Convolution", Strides=[1, 1])
    with pytest.raises(cg.UnknownAttributeError):
        cg.Op("Convolution", {1: 2})
    with pytest.raises(cg.InputTypeError, match="lenient"):
        cg.Op("Convolution", lenient="yes")
    with pytest.raises(cg.AttributeTypeError, match="weights_shape"):
        cg.Op("ConvolutionBackwardWeights", weights_shape=np.array(3))


@pytest.mark.parametrize("name,value,error", [
    ("strides", [1.0, 1.0], cg.AttributeTypeError), ("strides", "11", cg.AttributeTypeError),
    ("strides", {1: 1}, cg.AttributeTypeError), ("strides", [0, 1], cg.AttributeValueError),
    ("groups", 2.5, cg.AttributeTypeError), ("groups", True, cg.AttributeTypeError),
    ("auto_pad", b"valid", cg.AttributeTypeError), ("auto_pad", "sideways", cg.AttributeValueError),
    ("pads_begin", [-1, 0], cg.AttributeValueError), ("strides", [2**64, 1], cg.AttributeValueError),
    ("data_format", None, None),
])
def test_wrong_attribute_types(name: str, value: Any, error: type | None) -> None:
    if error is None:
        cg.Op("Convolution", lenient=True, **{name: value})  # None means "not given"
        return
    with pytest.raises(error, match=name):
        cg.Op("Convolution", **{name: value})


# ---------------------------------------------------------------------------------------------
# NaN and Inf: IEEE arithmetic
# ---------------------------------------------------------------------------------------------
def _conv1d(x: list[float], w: list[float], dtype: Any = np.float32) -> np.ndarray:
    return cg.convolution(np.array(x, dtype).reshape(1, 1, -1), np.array(w, dtype).reshape(1, 1, -1),
                          strides=[1], data_format="NCX", weights_format="OIX").ravel()


@pytest.mark.parametrize("x,w,expected", [
    ([1, np.nan, 3], [1, 1], [np.nan, np.nan]),
    ([np.inf, 1, 1], [1, 1], [np.inf, 2]),
    ([np.inf, 1], [0, 1], [np.nan]),  # 0 * inf = nan inside the sum
    ([np.inf, -np.inf], [1, 1], [np.nan]),  # inf - inf = nan
    ([-np.inf, 1, 2], [2, 1], [-np.inf, 4]),
])
def test_nan_and_inf_propagate_like_ieee(x: list[float], w: list[float], expected: list[float]) -> None:
    np.testing.assert_array_equal(_conv1d(x, w), np.array(expected, np.float32))


def test_no_warnings_or_floating_point_errors_whatever_numpy_settings() -> None:
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(_conv1d([np.inf, 1], [0, 1])).all()
        assert np.isinf(_conv1d([60000, 60000], [2, 2], np.float16)).all()  # f16 overflow rounds to inf
        assert _conv1d([1e-30, 1], [1e-30, 0])[0] == 0  # underflow to 0


@pytest.mark.parametrize("kind", OPS)
def test_nan_in_any_op_gives_nan_not_an_exception(kind: str) -> None:
    case = _case(kind)
    inputs = [a.copy() if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in case.inputs]
    inputs[0][...] = np.nan  # every element: one alone may sit where no window reads (a stride's gap)
    result = case.op()(*inputs)
    # NaN wherever a NaN is read; the rest read only padding: exact zeros (values: test_guarantees.py)
    assert (np.isnan(result) | (result == 0)).all() and (np.isnan(result).any() or not result.size)


# ---------------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------------
def test_threads_give_the_serial_results() -> None:
    rng = np.random.default_rng(5)
    calls = [(c.op(), c.inputs) for c in (random_case(rng, kind) for kind in OPS for _ in range(4))]
    calls += [_medium(kind, *geometry, seed=i) for i, (kind, geometry) in enumerate(zip(OPS * 4, _MEDIUM * 7))]
    serial = [op(*inputs) for op, inputs in calls]
    barrier = threading.Barrier(8)

    def run(index: int) -> list[tuple[int, np.ndarray]]:
        barrier.wait()
        return [(i, calls[i][0](*calls[i][1])) for i in range(index, len(calls), 8)]

    with ThreadPoolExecutor(8) as pool:
        parallel = dict(pair for chunk in pool.map(run, range(8)) for pair in chunk)
    for i, expected in enumerate(serial):
        assert parallel[i].dtype == expected.dtype and parallel[i].tobytes() == expected.tobytes(), calls[i][0]


def test_threads_with_different_budgets_and_errors() -> None:
    good = _case("ConvolutionBackwardWeights")
    expected = good.op()(*good.inputs)

    def run(index: int) -> Any:
        if index % 2:
            return good.op()(*good.inputs)
        try:
            return cg.Op("Convolution", strides=[0])
        except cg.ConvgradError as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(64)))
    for i, r in enumerate(results):
        if i % 2:
            np.testing.assert_array_equal(r, expected)
        else:
            assert isinstance(r, cg.AttributeValueError)


def test_bf16_inputs_work() -> None:
    case = _case("ConvolutionBackwardWeights")
    inputs = [a.astype(ml_dtypes.bfloat16) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
              for a in case.inputs]
    got = case.op()(*inputs)
    assert got.dtype == ml_dtypes.bfloat16
    _close_to_reference(got, case.op(), inputs)
