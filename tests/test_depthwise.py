"""The depthwise loops (``direct`` loops=depthwise): the register-blocked kernels of
:mod:`convgrad.engines.fast.depthwise_kernels` (NXC f32 data, and bf16/f16 read as it lies) and the
numba loops they leave to (NCX data, f64, the portable family), all three directions against the
float64 reference engine: strides, dilations, asymmetric pads, 1-D/2-D/3-D, channel tails, NaN and
Inf, and NaN-poisoned allocations."""

from __future__ import annotations

import dataclasses
import itertools

import ml_dtypes
import numpy as np
import pytest

from convgrad.dtypes import DATA_DTYPES, compute_dtype
from convgrad.engines import get_engine
from convgrad.engines.fast import Plan, depthwise, depthwise_kernels, forced_plan, isa
from convgrad.engines.fast.tuning import TUNING
from convgrad.problem import ConvGeometry
from engine_support import geometry, task_inputs
from poison import poisoned_allocations

FAST, REF = get_engine("fast"), get_engine("reference")
TASKS = ("forward", "backward_data", "backward_weights")
DEPTHWISE = Plan.of("direct", loops="depthwise")

#: (in_size, kernel, strides, dilations, pads_begin, pads_end)
SHAPES = {
    "3x3": ((7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "3x3 stride 2, asymmetric pads": ((9, 8), (3, 3), (2, 2), (1, 1), (1, 0), (0, 2)),
    "5x5 dilation 2": ((11, 10), (5, 5), (1, 1), (2, 2), (4, 3), (4, 5)),
    "5x5 stride 2 dilation 2": ((12, 13), (5, 5), (2, 2), (2, 2), (3, 4), (2, 3)),
    "1x1": ((5, 6), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
    "1x1 stride 2 (inputs no tap reads)": ((5, 7), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    "3x1 stride (2, 1) pads": ((8, 5), (3, 1), (2, 1), (1, 1), (2, 0), (1, 1)),
    "kernel beyond the input": ((3, 2), (5, 5), (1, 1), (1, 1), (2, 2), (2, 3)),
    "1-D stride 2": ((13,), (3,), (2,), (1,), (1,), (2,)),
    "1-D dilation 2": ((11,), (5,), (1,), (2,), (3,), (4,)),
    "3-D": ((4, 5, 6), (3, 3, 3), (1, 2, 1), (1, 1, 2), (1, 0, 2), (1, 1, 2)),
}
CHANNELS = (1, 15, 16, 17, 33, 64)


def _cases(rows: list[tuple], default) -> list:
    """pytest parameters of ``rows``, those for which ``default(*row)`` is false marked
    ``exhaustive`` (conftest.py): each kernel variant costs seconds to compile, so the default
    suite takes a cross product's 16-bit cases pairwise (every shape with some 16-bit dtype and
    channel count, every dtype and channel count with some shape)."""
    return [pytest.param(*row, marks=() if default(*row) else pytest.mark.exhaustive) for row in rows]


#: The 16-bit dtype the default suite runs shape ``NARROW[i]`` with at 15 (and 33) channels (the
#: other one at 32: two vectors).
NARROW = ["3x3", "3x3 stride 2, asymmetric pads", "5x5 stride 2 dilation 2", "3-D"]


def _narrow_dtype(shape: str, channels: int) -> str:
    return "bf16" if (NARROW.index(shape) % 2 == 0) == (channels != 32) else "f16"


def _geometry(shape: str, channels: int, n: int = 2) -> ConvGeometry:
    in_size, kernel, strides, dilations, pb, pe = SHAPES[shape]
    return geometry(n, channels, 1, 1, in_size, kernel, strides, dilations, pb, pe)


def _check(got: np.ndarray, want: np.ndarray, rtol: float, msg: str) -> None:
    """Within ``rtol`` of the result's largest value (the sums' own rounding), NaN and Inf alike."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, msg
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=msg)


@pytest.fixture
def kernel_calls(monkeypatch) -> dict[str, int]:
    """Counts the register-blocked drivers the depthwise loops ask for (so a test can tell that
    the kernels, not the numba loops, computed its results)."""
    calls = {"gather": 0, "weights": 0}
    for name, driver in (("gather", depthwise_kernels.gather_driver), ("weights", depthwise_kernels.weights_driver)):
        def counted(*args, _name=name, _driver=driver):
            calls[_name] += 1
            return _driver(*args)
        monkeypatch.setattr(depthwise_kernels, f"{name}_driver", counted)
    return calls


def _kernel_default(shape: str, channels: int) -> bool:
    """The default suite's pairs: each shape at one channel count, each count on one or two shapes
    (every count is a register block and tail; every shape a tap pattern; the tests below run
    more shapes at 17 and 33 channels, and the long rows at 16, 17, 32 and 40); and 3x3 at 64
    channels: 16-lane sliding windows of a kernel row over four vectors."""
    i, j = sorted(SHAPES).index(shape), CHANNELS.index(channels)
    return j == i % len(CHANNELS) or (shape, channels) == ("3x3", 64)


@pytest.mark.parametrize("shape, channels", _cases(list(itertools.product(sorted(SHAPES), CHANNELS)),
                                                   _kernel_default))
def test_kernels_against_reference(shape, channels, rng, kernel_calls):
    """NXC f32: the register-blocked kernels, all three directions."""
    g = _geometry(shape, channels)
    inputs = task_inputs(g, rng, np.float32, False)
    with forced_plan(DEPTHWISE):
        for task in TASKS:
            _check(getattr(FAST, task)(g, *inputs[task]), getattr(REF, task)(g, *inputs[task]), 2e-6,
                   f"{shape} C={channels} {task}")
    assert kernel_calls == {"gather": 2, "weights": 1} or isa.family() == "portable"


#: Each shape's 16-bit dtype in NXC in the default suite (3-D's bf16 at 17 channels: the kernels
#: test_every_result_is_written compiles too).
LAYOUT_SHAPES = {"3x3 stride 2, asymmetric pads": "f16", "5x5 dilation 2": "bf16", "1-D stride 2": "bf16", "3-D": "bf16"}


@pytest.mark.parametrize("shape, channels_first, dtype_name", _cases(
    list(itertools.product(LAYOUT_SHAPES, (False, True), ("f32", "bf16", "f16", "f64"))),
    lambda shape, first, dtype: first or dtype in ("f32", "f64", LAYOUT_SHAPES[shape])))
def test_layouts_and_dtypes_against_reference(shape, channels_first, dtype_name, rng):
    """Through the engine (results in the accumulation dtype: f32 for bf16/f16 data, which the API
    rounds later): NXC and NCX, every dtype."""
    g, dtype = _geometry(shape, 17), DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, channels_first)
    rtol = 1e-12 if dtype_name == "f64" else 2e-6
    with forced_plan(DEPTHWISE):
        for task in TASKS:
            got = getattr(FAST, task)(g, *inputs[task])
            assert got.dtype == compute_dtype(dtype)
            _check(got, getattr(REF, task)(g, *inputs[task]), rtol, f"{shape} {dtype_name} {task}")


@pytest.mark.parametrize("shape, dtype_name", _cases(
    list(itertools.product(["3x3", "5x5 stride 2 dilation 2", "3-D"], ("bf16", "f16"))),
    lambda shape, dtype: dtype == _narrow_dtype(shape, 33)))
def test_narrow_data_sums_in_f32(shape, dtype_name, rng, kernel_calls):
    """bf16/f16 data widened to f32 once: the f32 results (before the API rounds them) equal the
    sums of the widened values within f32 rounding."""
    g, dtype = _geometry(shape, 33), DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, False)
    for task in TASKS:
        a, b = inputs[task]
        got = depthwise.run(g, a, b, task, np.dtype(np.float32))
        assert got.dtype == np.float32
        want = getattr(REF, task)(g, *(v.astype(np.float64) for v in inputs[task]))
        _check(got, want, 2e-6, f"{shape} {dtype_name} {task}")
    assert kernel_calls == {"gather": 2, "weights": 1} or isa.family() == "portable"


def _bits(a: np.ndarray) -> np.ndarray:
    """The bits of a 16-bit float array, every NaN as one pattern (NaN payloads are not compared)."""
    bits = a.view(np.uint16).copy()
    bits[np.isnan(a.astype(np.float32))] = 0x7FFF
    return bits


def _narrow_read_default(shape: str, channels: int, dtype: str) -> bool:
    """The default suite's cases of the rounded reads: each shape once, each (channel count, dtype)
    pair once (a masked tail and two whole vectors, each 16-bit dtype's loads and rounded stores),
    the 16-bit dtype of :func:`_narrow_dtype`; the shapes' other channel count ``exhaustive``
    (their tap patterns: every f32 test, and the 16-bit sums above)."""
    return dtype == _narrow_dtype(shape, channels) and (channels == 32) == (NARROW.index(shape) >= 2)


@pytest.mark.parametrize("shape, channels, dtype_name", _cases(
    list(itertools.product(NARROW, (15, 32), ("bf16", "f16"))), _narrow_read_default))
def test_narrow_data_read_where_it_lies_and_rounded_once(shape, channels, dtype_name, rng, kernel_calls, monkeypatch):
    """bf16/f16 NXC data: the kernels read it without a widened copy (``casts.astype`` is never
    asked), and a rounded data result equals, bit for bit, the f32 sums of the widened data
    rounded afterwards (once, to nearest even); subnormal inputs and results, overflow to Inf, NaN
    and Inf inputs included."""
    g, dtype = _geometry(shape, channels), DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, False)
    limits = ml_dtypes.finfo(dtype) if dtype_name == "bf16" else np.finfo(dtype)
    tiny = float(limits.smallest_subnormal)
    x, w = inputs["forward"]
    dy = inputs["backward_data"][0]
    flat_x, flat_dy = x.reshape(-1), dy.reshape(-1)
    flat_x[::7] = (flat_x[::7].astype(np.float32) * tiny * 3).astype(dtype)   # subnormal data
    flat_dy[::5] = (flat_dy[::5].astype(np.float32) * float(limits.max) / 2).astype(dtype)  # overflows
    flat_x[11], flat_dy[13], flat_x[-3] = np.nan, np.inf, -np.inf
    widened = {task: tuple(v.astype(np.float32) for v in pair) for task, pair in inputs.items()}
    want = {task: depthwise.run(g, *widened[task], task, np.dtype(np.float32)) for task in TASKS}
    kernel_calls.update(gather=0, weights=0)
    monkeypatch.setattr(depthwise.casts, "astype", lambda *a: pytest.fail("16-bit data widened in a copy"))
    for task in TASKS:
        a, b = inputs[task]
        kept = (a.copy(), b.copy())
        got = depthwise.run(g, a, b, task, np.dtype(np.float32), rounded=True)
        assert np.array_equal(_bits(a), _bits(kept[0])) and np.array_equal(_bits(b), _bits(kept[1]))
        if task == "backward_weights":  # a small f32 sum, rounded by the API
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want[task], err_msg=f"{shape} {dtype_name} {task}")
            continue
        assert got.dtype == dtype and got.shape == want[task].shape
        np.testing.assert_array_equal(_bits(got), _bits(want[task].astype(dtype)), err_msg=f"{shape} {dtype_name} {task}")
    assert kernel_calls["gather"] == 2 and kernel_calls["weights"] == 1 or isa.family() == "portable"


@pytest.mark.parametrize("family", ["avx512", "avx2", "portable"])
@pytest.mark.parametrize("shape", ["3x3 stride 2, asymmetric pads", "1-D dilation 2", "3-D"])
def test_every_kernel_family(shape, family, rng):
    """The 16- and 8-lane kernels (and the portable family's numba loops) agree with the reference."""
    if family not in isa.supported():
        pytest.skip(f"the host cannot run {family}")
    before = isa.set_family(family)
    try:
        g = _geometry(shape, 33)
        inputs = task_inputs(g, rng, np.float32, False)
        with forced_plan(DEPTHWISE):
            for task in TASKS:
                _check(getattr(FAST, task)(g, *inputs[task]), getattr(REF, task)(g, *inputs[task]), 2e-6,
                       f"{shape} {family} {task}")
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("shape", ["3x3", "3x3 stride 2, asymmetric pads", "3-D"])
def test_nan_and_inf_propagate_as_in_the_reference(shape, channels_first, rng):
    """A NaN or Inf reaches exactly the results whose sums read it; a tap in the padding adds
    nothing, so an Inf weight never meets a padded zero (no NaN at the edges)."""
    g = _geometry(shape, 17)
    inputs = task_inputs(g, rng, np.float32, channels_first)
    x, w = inputs["forward"]
    dy = inputs["backward_data"][0]
    x[(0,) * (x.ndim - 1) + (3,)] = np.nan                     # a corner of the first image
    x[(1, *(s // 2 for s in x.shape[1:-1]), 16)] = np.inf      # the middle of the second, the channel tail
    dy[(1, *(s - 1 for s in dy.shape[1:-1]), 5)] = -np.inf     # the far corner
    w[(0,) * (w.ndim - 2) + (0, 16)] = np.inf                  # the first tap: in the padding at the edges
    with forced_plan(DEPTHWISE):
        for task in TASKS:
            got = np.asarray(getattr(FAST, task)(g, *inputs[task]), np.float64)
            want = getattr(REF, task)(g, *inputs[task])
            assert np.isnan(want).any() or np.isinf(want).any()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{shape} {task} NaN")
            np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{shape} {task} +Inf")
            np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{shape} {task} -Inf")
            finite = np.isfinite(want)
            _check(got[finite], want[finite], 2e-6, f"{shape} {task}")


@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("shape", ["1x1 stride 2 (inputs no tap reads)", "kernel beyond the input", "3-D"])
def test_every_result_is_written(shape, channels_first, dtype_name, rng):
    """With convgrad's allocations NaN-filled, no result keeps a NaN: every output is written
    (the data gradient's inputs that no tap reads are zeros)."""
    g, dtype = _geometry(shape, 17), DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, channels_first)
    with forced_plan(DEPTHWISE), poisoned_allocations():
        for task in TASKS:
            got = getattr(FAST, task)(g, *inputs[task])
            assert not np.isnan(np.asarray(got, np.float64)).any(), f"{shape} {task}"
            _check(got, getattr(REF, task)(g, *inputs[task]), 2e-6, f"{shape} {task}")


@pytest.mark.parametrize("kernel,channels,width,slide,want", [
    ((1, 3, 3), 32, 16, False, (9, 2, 0)), ((1, 3, 3), 1024, 16, False, (3, 4, 0)), ((1, 3, 3), 64, 8, False, (3, 3, 0)),
    ((1, 3, 3), 64, 16, False, (9, 3, 0)), ((1, 3, 3), 128, 16, False, (3, 4, 0)), ((1, 5, 5), 256, 16, False, (5, 4, 0)),
    ((1, 7, 7), 256, 16, False, (7, 3, 0)),
    ((1, 3, 3), 8, 8, False, (9, 1, 0)), ((1, 5, 5), 64, 16, False, (25, 1, 0)), ((3, 3, 3), 64, 16, False, (27, 1, 0)),
    ((1, 1, 1), 17, 16, False, (1, 1, 0)), ((1, 1, 1), 256, 16, False, (1, 4, 0)), ((1, 7, 7), 256, 8, False, (7, 1, 0)),
    ((1, 1, 31), 64, 16, False, (1, 4, 0)),
    ((1, 3, 3), 32, 16, True, (9, 1, 3)), ((1, 3, 3), 1024, 16, True, (3, 4, 3)), ((1, 3, 3), 64, 8, True, (3, 2, 3)),
    ((1, 5, 5), 64, 16, True, (5, 2, 5)), ((3, 3, 3), 64, 16, True, (3, 4, 3)), ((1, 1, 1), 17, 16, True, (1, 1, 0)),
    ((1, 3, 1), 64, 16, True, (3, 4, 0)), ((1, 1, 31), 64, 16, True, (1, 4, 0)),
])
def test_weights_block_fits_the_registers(kernel, channels, width, slide, want):
    """Sliding (stride and dilation 1 along the row): of all taps' and a kernel row's
    accumulators and windows (with a dy vector per vector) that fit, the more accumulators. Otherwise all taps' accumulators
    where they fit for a cache line of channels (two 8-wide vectors where there are two; a dy
    vector per vector and an x vector), else a kernel row's, else as for one vector, else one
    tap's; but on 16 lanes from 8 vectors of channels a kernel row of 4 vectors where it fits.
    Vectors up to 4 and up to the channels' full vectors."""
    taps, vecs, window = depthwise_kernels.reduce_block(kernel, channels, width, slide)
    assert (taps, vecs, window) == want
    regs = 32 if width == 16 else 16
    assert (2 * taps + 1) * vecs <= regs if window else taps * vecs + vecs + 1 <= regs


#: Rows longer than one :func:`gather` block (up to 16 positions): unmasked interior blocks,
#: masked edge blocks, a last block cut at the row's end; strides whose phases have different tap
#: counts (or none), dilations whose phases' taps are sparse (a step of -D/gcd(S, D)).
LONG_ROWS = {
    "3x3 row of 40": ((3, 40), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    "3x3 stride 2 row of 45": ((4, 45), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    "1x5 dilation 3, asymmetric pads": ((3, 43), (1, 5), (1, 1), (1, 3), (0, 7), (0, 2)),
    "1-D 5 stride 3 dilation 2": ((50,), (5,), (3,), (2,), (4,), (2,)),
    "1-D 7 stride 2 dilation 2": ((61,), (7,), (2,), (2,), (6,), (3,)),
    "1-D 1 stride 3 (phases without taps)": ((38,), (1,), (3,), (1,), (0,), (0,)),
}


def _long_index(shape: str) -> int:
    return sorted(LONG_ROWS).index(shape)


def _long_default(shape: str, channels: int, dtype: str) -> bool:
    """The default suite's long rows: each shape in f32 at one of the one-vector counts (16, 17,
    40; each count on two shapes) and in bf16 at another on every other shape, f32 in two vectors
    (32) on the others (bf16 in two: the narrow tests)."""
    i = _long_index(shape)
    if channels == 32:
        return dtype == "f32" and i % 2 == 1
    counts = (16, 17, 40)
    if dtype == "f32":
        return channels == counts[(i + 1) % 3]
    return channels == counts[i % 3] and i % 2 == 0


@pytest.mark.parametrize("shape", ["3x3 stride 2, asymmetric pads", "5x5 stride 2 dilation 2"])
@pytest.mark.parametrize("channels", [48, 64])
def test_gather_weights_blocked_by_channels(shape, channels, rng, kernel_calls):
    """Forward and data gradient where a block is one position of several vectors and the weights
    are blocked by them (8-wide vectors: 48 channels in three blocks of 16, 64 in two of 32;
    strides whose phases start at other taps), against the reference."""
    g = _geometry(shape, channels)
    rows, vecs = depthwise_kernels.gather_block(16, 3, 8, channels)
    assert (rows, vecs) == (1, 2 if channels == 48 else 4)
    inputs = task_inputs(g, rng, np.float32, False)
    with forced_plan(DEPTHWISE):
        for task in ("forward", "backward_data"):
            got = getattr(FAST, task)(g, *inputs[task])
            _check(got, getattr(REF, task)(g, *(v.astype(np.float64) for v in inputs[task])), 2e-6,
                   f"{shape} C={channels} {task}")
    assert kernel_calls["gather"] == 2 or isa.family() == "portable"


@pytest.mark.parametrize("shape, channels, dtype_name", _cases(
    list(itertools.product(sorted(LONG_ROWS), (16, 17, 32, 40), ("f32", "bf16"))),
    lambda shape, channels, dtype: _long_default(shape, channels, dtype)))
def test_gather_blocks_of_long_rows(shape, channels, dtype_name, rng, kernel_calls):
    """Forward and data gradient on rows of several blocks (random non-zero inputs; bf16 read in
    place, widened in the registers), against the reference: every block kind and the channel
    tail (f16's loads: the tests above)."""
    in_size, kernel, strides, dilations, pb, pe = LONG_ROWS[shape]
    g, dtype = geometry(2, channels, 1, 1, in_size, kernel, strides, dilations, pb, pe), DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, False)
    for task in ("forward", "backward_data"):
        got = depthwise.run(g, *inputs[task], task, np.dtype(np.float32))
        want = getattr(REF, task)(g, *(v.astype(np.float64) for v in inputs[task]))
        _check(got, want, 2e-6, f"{shape} C={channels} {dtype_name} {task}")
    assert kernel_calls["gather"] == 2 or isa.family() == "portable"


@pytest.mark.parametrize("shape, channels, dtype_name", _cases(
    list(itertools.product(sorted(LONG_ROWS), (16, 17, 40), ("f32", "bf16"))),
    # each shape's bf16 at one of the channel counts (a register block of 1, 2 or 3 vectors), f32 at the others
    lambda shape, channels, dtype: (dtype == "bf16") == ((16, 17, 40).index(channels) == _long_index(shape) % 3)))
def test_weights_of_long_rows(shape, channels, dtype_name, rng, kernel_calls):
    """The weights gradient on rows of many positions (the sliding windows of stride-1 rows: the
    masked edges, the windows' first vectors, many steps), against the reference."""
    in_size, kernel, strides, dilations, pb, pe = LONG_ROWS[shape]
    g, dtype = geometry(2, channels, 1, 1, in_size, kernel, strides, dilations, pb, pe), DATA_DTYPES[dtype_name]
    x, dy = task_inputs(g, rng, dtype, False)["backward_weights"]
    got = depthwise.run(g, x, dy, "backward_weights", np.dtype(np.float32))
    _check(got, REF.backward_weights(g, x.astype(np.float64), dy.astype(np.float64)), 2e-6,
           f"{shape} C={channels} {dtype_name}")
    assert kernel_calls["weights"] == 1 or isa.family() == "portable"


@pytest.mark.parametrize("stride", [1, 2, 3, 4])
@pytest.mark.parametrize("dilation", [1, 2, 3])
@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
def test_gather_phases_are_the_taps(kernel, dilation, stride):
    """Each phase's taps (k = kfirst + j*P read position m + tk0 + j*step of the source, forward:
    p*S + tk0 + j*step) are exactly the (k, source position) pairs of :func:`.geometry.tap`."""
    size, pad = 11, 2
    for transposed in (False, True):
        out_size = size if transposed else 9
        phases, step, mul, period, spread = depthwise_kernels.gather_phases(out_size, kernel, stride, dilation, pad,
                                                                             transposed)
        got, want = set(), set()
        for r, kfirst, taps, tk0, count in phases.tolist():
            assert count == len(range(r, out_size, spread))
            got |= {(r + spread * m, kfirst + j * period, m * mul + tk0 + j * step)
                    for m in range(count) for j in range(taps)}
        for a in range(out_size):
            for k in range(kernel):
                i = a + pad - k * dilation if transposed else a * stride + k * dilation - pad
                if transposed and i % stride == 0:
                    want.add((a, k, i // stride))
                elif not transposed:
                    want.add((a, k, i))
        assert got == want, (transposed, phases, step, mul, period)


@pytest.mark.parametrize("channels", [1, 16, 24, 32, 48, 64])
@pytest.mark.parametrize("count", [1, 7, 9, 14, 28, 56, 112])
@pytest.mark.parametrize("taps,width", [(1, 16), (3, 16), (7, 16), (3, 8), (5, 8)])
def test_gather_block_fits_the_registers(count, taps, width, channels):
    """On 8-wide vectors, channels of an even number of whole vectors: one position of 4 vectors
    where they divide by 4, else of 2. Otherwise up to 16 positions per block, the fewest padded
    ones; two vectors of channels exactly where the channels are two vectors (and 4 positions
    still fit): the accumulators, a kernel row's weights and the source vectors within the
    vector registers."""
    rows, vecs = depthwise_kernels.gather_block(count, taps, width, channels)
    vectors = channels // width if channels % width == 0 else 0
    if width == 8 and vectors and vectors % 2 == 0:
        assert (rows, vecs) == (1, 4 if vectors % 4 == 0 else 2)
        return
    regs = 32 if width == 16 else 16
    assert vecs == (2 if channels == 2 * width and 2 * 4 + 3 * taps + 3 <= regs else 1)
    assert 4 <= rows <= 16 and vecs * (rows + taps + 1) + 1 <= regs
    assert -(-count // rows) * rows - count == min(-(-count // r) * r - count for r in range(4, rows + 1))


@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
def test_strided_weights_gradient_of_many_channels(dtype_name, rng):
    """On 16 lanes a strided weights gradient of 8 or more vectors of channels runs a kernel row
    of 4 vectors a call (``reduce_block``), the channels past whole blocks one vector at a time
    (here 136 = 2 blocks and a half vector): against the reference."""
    g = geometry(2, 136, 1, 1, (9, 11), (3, 3), (2, 2), (1, 1), (1, 0), (0, 2))
    x, dy = task_inputs(g, rng, DATA_DTYPES[dtype_name], False)["backward_weights"]
    with forced_plan(DEPTHWISE):
        got = FAST.backward_weights(g, x, dy)
    want = REF.backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    _check(got, want, 2e-6 if dtype_name == "f32" else 1e-5, dtype_name)
    assert depthwise_kernels.reduce_block((1, 3, 3), 136, 16) == (3, 4, 0)


def _placed(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``a`` starting ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_weights_blocks_start_on_a_vector_boundary(dtype_name, strides, rng, kernel_calls):
    """From ``TUNING.depthwise_align_vectors`` vectors of channels, the weights gradient's blocks
    start where the data's channels reach a vector boundary: the channels before it in one
    vector, the rest past whole blocks in a block with a short last vector or single vectors.
    x and dy at every element offset within a vector, channel counts of both rests (sliding
    windows and strided rows), against the reference; the head as defined."""
    if isa.family() not in isa.WIDTH:
        pytest.skip("no register-blocked kernels on the portable family")
    width, dtype = isa.WIDTH[isa.family()], DATA_DTYPES[dtype_name]
    size = np.dtype(dtype).itemsize
    vectors = TUNING.depthwise_align_vectors
    for channels in (vectors * width, vectors * width + width + 3):
        g = geometry(2, channels, 1, 1, (5, 6), (3, 3), strides, (1, 1), (1, 1), (1, 0))
        x, dy = task_inputs(g, rng, dtype, False)["backward_weights"]
        want = REF.backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
        for offset in range(0, width * size, 4 if size == 4 else 6):
            px, pdy = _placed(x, offset), _placed(dy, offset)
            assert depthwise._head(px, width) == (-offset % (width * size) // size if channels % width == 0 else 0)
            with forced_plan(DEPTHWISE):
                got = FAST.backward_weights(g, px, pdy)
            _check(got, want, 2e-6 if dtype_name == "f32" else 1e-5, f"{dtype_name} C={channels} offset {offset}")
    assert kernel_calls["weights"] > 0


@pytest.mark.parametrize("task, strides", [("forward", (2, 2)), ("backward_data", (1, 1)), ("backward_data", (2, 2))])
def test_gather_blocks_start_on_a_vector_boundary(task, strides, rng, kernel_calls):
    """f32 forward and unit-stride data gradients of ``TUNING.depthwise_align_vectors`` vectors
    of channels start their one-vector blocks where the source's channels reach a vector
    boundary, the channels before it in a vector of their own, and the result is placed alike
    (its channel ``head`` on a vector boundary too); strided data gradients do not. The source
    at every element offset within a vector, against the reference."""
    if isa.family() not in isa.WIDTH:
        pytest.skip("no register-blocked kernels on the portable family")
    width = isa.WIDTH[isa.family()]
    channels = TUNING.depthwise_align_vectors * width
    g = geometry(2, channels, 1, 1, (6, 7), (3, 3), strides, (1, 1), (1, 1), (1, 0))
    a, b = task_inputs(g, rng, np.float32, False)[task]
    want = getattr(REF, task)(g, a.astype(np.float64), b.astype(np.float64))
    for offset in range(0, 4 * width, 4):
        src = _placed(a, offset)
        head = depthwise._gather_head(g, src, task == "backward_data", width)
        lines = width * 4 == 64 and (task == "forward" or strides == (1, 1))
        assert head == (-offset % (4 * width) // 4 if lines else 0)
        got = depthwise.run(g, src, b, task, np.dtype(np.float32))
        assert (got.ctypes.data + 4 * head) % 64 == 0 or not head
        _check(got, want, 2e-6, f"{task} strides {strides} offset {offset}")
    assert kernel_calls["gather"] > 0


@pytest.mark.parametrize("task", ["forward", "backward_data"])
def test_results_streamed_past_the_caches(task, rng, kernel_calls, monkeypatch):
    """With every result large enough to stream (``TUNING.depthwise_stream_l3`` 0), results whose
    blocks store whole cache lines of a position (f32 vectors; bf16 ones in pairs) are stored
    non-temporally and equal the reference; results elsewhere (placed off a line, a bf16 vector
    alone, channels not whole blocks) are not streamed, and equal it too."""
    if isa.family() not in isa.WIDTH:
        pytest.skip("no register-blocked kernels on the portable family")
    monkeypatch.setattr(depthwise, "TUNING", dataclasses.replace(depthwise.TUNING, depthwise_stream_l3=0.0))
    width = isa.WIDTH[isa.family()]
    for channels, dtype, offset in ((2 * width, np.float32, 0), (TUNING.depthwise_align_vectors * width, np.float32, 16),
                                    (2 * width + 3, np.float32, 0), (2 * width, ml_dtypes.bfloat16, 0),
                                    (3 * width, ml_dtypes.bfloat16, 0)):
        g = geometry(2, channels, 1, 1, (6, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 0))
        a, b = task_inputs(g, rng, dtype, False)[task]
        src = _placed(a, offset)
        want = getattr(REF, task)(g, a.astype(np.float64), b.astype(np.float64))
        got = depthwise.run(g, src, b, task, np.dtype(np.float32), rounded=True)   # bf16 results as bf16
        _check(got, want, 2e-6 if dtype == np.float32 else 1e-2, f"{task} C={channels} {dtype}")
        head = depthwise._gather_head(g, src, task == "backward_data", width)
        vecs = depthwise._gather_plan(g, task == "backward_data", width)[0][1]
        streamed = depthwise._streams(got, head, width, vecs)     # a position's block: whole lines
        assert streamed == (width * vecs * np.dtype(dtype).itemsize % 64 == 0 and channels % (width * vecs) == 0)
        for out_offset in (4, 16):                             # a result placed off a line: not streamed
            out = _placed(np.empty(got.shape, np.float32), out_offset)
            assert not depthwise._streams(out, 0, width, vecs)
            getattr(depthwise, task)(g, src, b, out)
            _check(out, want, 2e-6 if dtype == np.float32 else 1e-5, f"{task} C={channels} out +{out_offset}")
    assert kernel_calls["gather"] > 0
