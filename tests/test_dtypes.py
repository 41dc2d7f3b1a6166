"""bf16 / f16 / f32 results against the float64 torch result of the same inputs, rounded once."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad.dtypes import round_to
from convgrad.engines import default_engine_name

from oracle import (BF16, OPS, Case, Geometry, as_bits, fresh_rng, magnitude, random_tensors, reduction_length,
                    round_nearest, torch_results)

DTYPES = {"bf16": BF16, "f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
GEOM = Geometry(n=3, groups=2, icg=6, ocg=5, in_size=(9, 11), kernel=(3, 2), strides=(2, 1), dilations=(1, 2),
                pads_begin=(1, 0), pads_end=(0, 1))


def round_once(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return values.astype(dtype) if dtype == np.float32 else round_nearest(values, dtype)


@pytest.mark.parametrize("engine", sorted({default_engine_name(), "reference"}))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", OPS)
def test_low_precision_matches_rounded_f64(kind, dtype, engine):
    dtype = DTYPES[dtype]
    case = Case(kind, GEOM, "NXC", bias=True, shape_via="input")
    rng, seed = fresh_rng()
    results = torch_results(GEOM, random_tensors(GEOM, rng, dtype))  # inputs representable in dtype
    inputs = case.inputs(results, dtype=dtype)
    got = case.run(inputs, engine=engine)
    exact = case.expected(results)
    want = round_once(exact, dtype)
    msg = f"{kind} {dtype} engine={engine} seed={seed}"
    assert got.dtype == dtype and got.shape == want.shape, msg
    if engine == "reference":  # computes in f64 and rounds once: at most 1 ulp from the torch result
        ulps = np.abs(as_bits(got) - as_bits(want))
        assert ulps.max() <= 1, f"{msg}: {ulps.max()} ulps"
        assert (ulps == 0).mean() > 0.9, msg  # 1-ulp differences are rare (ties broken by f64 noise)
    # any engine (may accumulate in f32): 1 ulp of the result plus f32 accumulation error
    eps, eps32 = ml_dtypes.finfo(dtype).eps, np.finfo(np.float32).eps
    tiny = ml_dtypes.finfo(dtype).smallest_subnormal
    tol = eps * np.abs(want.astype(np.float64)) + reduction_length(case) * eps32 * magnitude(case, results) + tiny
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert (err <= tol).all(), f"{msg}: max error {err.max():.3g}"


def test_round_to_avoids_double_rounding():
    value = 1 + 2**-8 + 2**-40  # f64 -> f32 gives the tie 1 + 2**-8, which RNE would send to 1
    got = round_to(np.array([value, -value]), BF16)
    assert got.dtype == BF16
    assert got.astype(np.float64).tolist() == [1 + 2**-7, -(1 + 2**-7)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_round_to_is_round_to_nearest_even(dtype):
    dtype = DTYPES[dtype]
    rng, seed = fresh_rng()
    top = 20 if dtype == BF16 else 10  # f16 overflows at 65504
    grid = (rng.standard_normal(4000) * 2.0 ** rng.integers(-20, top, 4000)).astype(dtype)
    lo = grid.astype(np.float64)
    bits = np.ascontiguousarray(grid).view(np.uint16)
    hi = (bits + np.uint16(1)).view(dtype).astype(np.float64)
    ok = np.isfinite(hi)
    mid = ((lo[ok] + hi[ok]) / 2)  # exact ties, and values just off them
    values = np.concatenate([mid, mid * (1 + 2.0**-45), mid * (1 - 2.0**-45), lo * (1 + 2.0**-35),
                             rng.standard_normal(1000)])
    got = round_to(values, dtype)
    want = round_nearest(values, dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(as_bits(got), as_bits(want), err_msg=f"seed={seed}")


def test_reference_engine_rounds_once_through_an_op():
    # one output element whose exact value is 1 + 2**-8 + 2**-40: f32 accumulation loses the 2**-40
    x = np.array([1.0, 2.0**-8, 2.0**-40]).astype(BF16).reshape(1, 1, 3)  # NXC, 1 spatial, 3 channels
    w = np.ones((1, 3, 1), dtype=BF16)  # XIO
    got = cg.convolution(x, w, strides=[1], engine="reference")
    assert got.dtype == BF16 and got.astype(np.float64).ravel().tolist() == [1 + 2**-7]
    default = cg.convolution(x, w, strides=[1])
    assert np.abs(default.astype(np.float64) - (1 + 2**-7)).max() <= 2**-7  # at most 1 ulp


@pytest.mark.parametrize("strategy", ["direct", "jit", "frame", "output_rows", "pointwise"])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("kind", ["Convolution", "ConvTranspose", "ConvolutionBackwardData"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_results_with_a_bias_are_rounded_once(dtype, kind, kernel, strategy):
    """Every strategy that rounds as it stores does so only where nothing is added after it: a
    result plus a bias of its own size is the nearest value to the exact sum, except within the
    f32 accumulation error of a midpoint (rounding first, then adding, is off by one unit in
    about a tenth of the values here)."""
    from convgrad.engines.fast import forced_strategy
    dtype = DTYPES[dtype]
    rng, seed = fresh_rng()
    c_in, c_out = 24, 16
    src = rng.standard_normal((2, 7, 6, c_in)).astype(dtype)
    w_shape = (kernel, kernel, c_out, c_in) if kind == "ConvTranspose" else (kernel, kernel, c_in, c_out)
    w = rng.standard_normal(w_shape).astype(dtype)
    attrs = dict(strides=2, pads_begin=kernel // 2, pads_end=kernel // 2)
    bias = (rng.standard_normal(c_out) * np.sqrt(c_in * kernel * kernel)).astype(dtype)

    def run(x, weights, b, engine=None):
        if kind == "Convolution":
            return cg.convolution(x, weights, b, engine=engine, **attrs)
        if kind == "ConvTranspose":
            return cg.conv_transpose(x, weights, b, engine=engine, **attrs)
        return cg.convolution_backward_data(x[..., :c_out], weights, (2, 13, 11, c_in), engine=engine, **attrs)

    wide = [a.astype(np.float64) for a in (src, w, bias)]
    exact = run(*wide, engine="reference")
    magnitude = run(*(np.abs(a) for a in wide), engine="reference")
    with forced_strategy(strategy):
        got = run(src, w, bias)
    assert got.dtype == dtype and got.shape == exact.shape
    want = round_nearest(exact, dtype)
    off = got.view(np.uint16) != want.view(np.uint16)
    midpoint = (got.astype(np.float64) + want.astype(np.float64)) / 2
    slack = 2 * c_in * kernel * kernel * np.finfo(np.float32).eps * magnitude
    assert (np.abs(exact - midpoint) <= slack)[off].all(), \
        f"{kind} {strategy} seed={seed}: {off.sum()} of {off.size} values not the nearest to the exact result"
