"""Hypothesis property tests on random valid problems: torch agreement and adjointness.

Adjointness (with the same attributes, auto_pad included):
    <conv(x, w), dy> = <x, conv_bwd_data(dy, w)> = <w, conv_bwd_weights(x, dy)>
    <conv_transpose(a, w), b> = <a, conv_transpose_bwd_data(b, w)> = <w, conv_transpose_bwd_weights(a, b)>
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import convgrad as cg
from convgrad.engines import default_engine_name

from oracle import (AUTO_PADS, OPS, WEIGHTS_FORMATS, Case, Geometry, check, data_layout, fresh_rng,
                    random_tensors, resolve_pads, torch_results, weights_layout)
from reliability_support import examples

#: 40 examples per property in the default suite (each new shape compiles kernel variants: 65 s
#: of a cold suite at 150 on a Zen 3, 22 s of the adjointness alone at 60); ``make test-all`` 150,
#: ``CONVGRAD_FUZZ_EXAMPLES`` that many.
SETTINGS = settings(max_examples=examples(40, 150),
                    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def geometries(draw, kind: str) -> tuple[Geometry, str]:
    """A random valid geometry whose pads are what ``kind`` resolves for a random auto_pad."""
    rank = draw(st.integers(1, 3))
    axis = st.integers(1, 3)
    kernel = tuple(draw(axis) for _ in range(rank))
    strides = tuple(draw(axis) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    in_size = tuple(draw(st.integers(1, 9 if rank < 3 else 6)) for _ in range(rank))
    pads = [tuple(draw(st.integers(0, 2)) for _ in range(rank)) for _ in "be"]
    auto_pad = draw(st.sampled_from(AUTO_PADS))
    pb, pe = resolve_pads(kind, auto_pad, in_size, kernel, strides, dilations, *pads)
    geom = Geometry(draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)),
                    draw(st.integers(1, 3)), in_size, kernel, strides, dilations, pb, pe)
    assume(geom.valid)
    return geom, auto_pad


@st.composite
def cases(draw) -> Case:
    kind = draw(st.sampled_from(OPS))
    geom, auto_pad = draw(geometries(kind))
    return Case(kind, geom, draw(st.sampled_from(("NCX", "NXC"))), draw(st.sampled_from(WEIGHTS_FORMATS[kind])),
                auto_pad, bias=draw(st.booleans()), shape_via=draw(st.sampled_from(("input", "attr"))),
                api=draw(st.sampled_from(("op", "functional"))))


@SETTINGS
@given(cases())
def test_random_problem_matches_torch(case: Case):
    rng, seed = fresh_rng()
    results = torch_results(case.geom, random_tensors(case.geom, rng))
    for engine in sorted({default_engine_name(), "reference"}):
        got = check(case, results, seed, engine)
    problem = cg.Op(case.kind, **case.attrs()).infer(*case.inputs(results))
    assert problem.output_shape == got.shape


def _dot(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """<a, b> and the sum of |terms| (the scale of its rounding error)."""
    return float(np.vdot(a, b)), float(np.vdot(np.abs(a), np.abs(b)))


def _assert_equal_products(products: list[tuple[float, float]], msg: str) -> None:
    scale = max(s for _, s in products)
    values = [v for v, _ in products]
    assert np.allclose(values, values[0], rtol=0, atol=1e-12 * scale + 1e-300), f"{values} {msg}"


@SETTINGS
@given(geometries("Convolution"), st.sampled_from(("NCX", "NXC")), st.sampled_from(("OIX", "XIO")))
def test_adjointness_convolution(geometry, data_format, wfmt):
    geom, auto_pad = geometry
    rng, seed = fresh_rng()
    t = random_tensors(geom, rng)
    x, w, dy = data_layout(t["x"], data_format), weights_layout(t["w"], wfmt), data_layout(t["dy"], data_format)
    attrs = dict(strides=geom.strides, dilations=geom.dilations, groups=geom.groups, data_format=data_format,
                 auto_pad=auto_pad, pads_begin=geom.pads_begin, pads_end=geom.pads_end)
    y = cg.convolution(x, w, weights_format=wfmt, **attrs)
    dx = cg.convolution_backward_data(dy, w, x.shape, weights_format=wfmt, **attrs)
    dw = cg.convolution_backward_weights(x, dy, w.shape, weights_format=wfmt, **attrs)
    dw_filters = cg.convolution_backprop_filters(x, dy, w.shape, filter_format=wfmt, **attrs)
    _assert_equal_products([_dot(y, dy), _dot(x, dx), _dot(w, dw), _dot(w, dw_filters)], f"{geom} seed={seed}")


@SETTINGS
@given(geometries("ConvTranspose"), st.sampled_from(("NCX", "NXC")), st.sampled_from(("IOX", "XOI")))
def test_adjointness_conv_transpose(geometry, data_format, wfmt):
    geom, auto_pad = geometry
    # ConvTranspose resolves same_* pads from max(0, EK - S), its backward ops from their diff_dst size:
    # with the same attributes they agree only where those rules do.
    assume((geom.pads_begin, geom.pads_end) == resolve_pads(
        "ConvTransposeBackwardData", auto_pad, geom.in_size, geom.kernel, geom.strides, geom.dilations,
        geom.pads_begin, geom.pads_end))
    rng, seed = fresh_rng()
    t = random_tensors(geom, rng)
    a, w = data_layout(t["dy"], data_format), weights_layout(t["w"], wfmt)  # a: ConvTranspose src
    attrs = dict(strides=geom.strides, dilations=geom.dilations, groups=geom.groups, data_format=data_format,
                 auto_pad=auto_pad, pads_begin=geom.pads_begin, pads_end=geom.pads_end,
                 output_padding=geom.extra, weights_format=wfmt)
    out = cg.conv_transpose(a, w, **attrs)
    assert out.shape == data_layout(t["x"], data_format).shape
    b = data_layout(t["x"], data_format)
    da = cg.conv_transpose_backward_data(b, w, **attrs)
    dw = cg.conv_transpose_backward_weights(a, b, w.shape, **attrs)
    _assert_equal_products([_dot(out, b), _dot(a, da), _dot(w, dw)], f"{geom} seed={seed}")
