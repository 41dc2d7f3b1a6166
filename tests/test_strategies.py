"""Every strategy of the fast engine, forced, on every op, every weights format with several tiles
(16) of channels on each side, every dtype and both data layouts, against the float64 reference
engine, with convgrad's allocations NaN-poisoned so that a missing write cannot pass by luck.

The strategies come from ``convgrad.engines.fast.STRATEGIES`` (and the ``gemm`` strategy's
variants) and are forced with ``forced_strategy``; a strategy that does not apply to a problem falls back to the selection rule
(the pair is then only a check of whatever ran), and the test asserts that each strategy really
ran on some of the cases, so that one that always silently falls back is caught.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from poison import poisoned_allocations

import convgrad as cg
from convgrad.dtypes import DATA_DTYPES
from convgrad.engines import fast
from convgrad.engines.fast import STRATEGIES, forced_strategy
from convgrad.opdefs import ops_of

OPS = sorted(ops_of("convolution"))

#: (name, data_format, n, groups, ICg, OCg, spatial size, kernel, strides, dilations, pads_begin,
#: pads_end). Channels per group 17-35: two or three tiles of 16 on each side of the weights.
PROBLEMS = [
    ("2-D", "NXC", 2, 1, 20, 18, (7, 6), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1)),
    ("1-D grouped", "NCX", 2, 2, 17, 19, (9,), (3,), (1,), (1,), (1,), (2,)),
    ("3-D", "NXC", 1, 1, 18, 33, (4, 3, 5), (2, 2, 2), (1, 2, 1), (1, 1, 1), (0, 1, 0), (1, 0, 0)),
    ("1x1 strided", "NXC", 2, 1, 20, 33, (6, 5), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),
    ("1x1 NCX", "NCX", 2, 1, 17, 20, (12, 11), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
]
DTYPES = ("f32", "f64", "bf16", "f16")
#: Per-element tolerance relative to the reference value: one unit in the last place of the
#: dtype (the reference rounds its exact f64 sum once; the engine rounds an f32 or f64 sum that
#: may lie on the other side of a rounding boundary, so the two may differ by one ulp), plus an
#: absolute part for the accumulation error of a sum of at most ~700 terms in f32 (700 * 2^-24 of
#: the largest value ~ 4e-5), f64 far below.
ULP = {"f32": 2.0 ** -23, "f64": 2.0 ** -52, "bf16": 2.0 ** -7, "f16": 2.0 ** -10}
ACCUMULATION = {"f32": 5e-5, "f64": 1e-12, "bf16": 5e-5, "f16": 5e-5}


def _attrs(kind: str, problem: tuple, wfmt: str) -> dict:
    _, fmt, _, groups, _, _, size, kernel, strides, dilations, pb, pe = problem
    d = cg.OPS[kind]
    attrs = dict(strides=list(strides), dilations=list(dilations), pads_begin=list(pb), pads_end=list(pe),
                 groups=groups, data_format=fmt, **{d.weights_format_attr: wfmt})
    if d.transposed:
        span = [i + b + e - (k - 1) * dl - 1 for i, b, e, k, dl in zip(size, pb, pe, kernel, dilations)]
        attrs["output_padding"] = [s % st for s, st in zip(span, strides)]
    return attrs


def _inputs(kind: str, problem: tuple, wfmt: str, dtype: np.dtype, rng: np.random.Generator) -> list:
    """Random non-zero inputs of ``kind`` in spec order, shapes from the convolution's own
    shape inference (``Op.infer`` of the forward op), weights shapes by hand."""
    _, fmt, n, groups, icg, ocg, size, kernel, strides, dilations, pb, pe = problem
    ic, oc = groups * icg, groups * ocg
    x = (n, ic, *size) if fmt == "NCX" else (n, *size, ic)
    w = (oc, icg, *kernel) if wfmt[0] != "X" else (*kernel, icg, oc)
    conv_fmt = "OIX" if wfmt[0] != "X" else "XIO"
    y = cg.Op("Convolution", **dict(_attrs("Convolution", problem, conv_fmt))).infer(x, w).output_shape
    d = cg.OPS[kind]
    shapes = {"x": x, "y": y, "w": w}  # a ConvTranspose's IOX/XOI weights are its convolution's OIX/XIO
    out = []
    for spec in d.inputs:
        if spec.role == "bias":
            continue
        if spec.role == "shape":
            out.append(np.array(shapes[d.output.role], np.int64))
            continue
        shape = shapes[spec.role]
        out.append((rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype))
    return out


@contextlib.contextmanager
def _recorded(ran: Counter) -> Iterator[None]:
    """Count the plans the engine selects for calls about to run (not for memory estimates): each
    strategy's name, and a ``gemm`` plan's variant too."""
    planned = fast.planned

    @functools.wraps(planned)
    def spy(*args, tune=False, **kwargs):
        hit = planned(*args, tune=tune, **kwargs)
        if tune:
            ran[hit[1].strategy] += 1
            if hit[1].param("variant"):
                ran[hit[1].param("variant")] += 1
        return hit
    fast.planned = spy
    try:
        yield
    finally:
        fast.planned = planned


def _check(got: np.ndarray, want: np.ndarray, dtype_name: str, msg: str) -> None:
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.dtype == want.dtype and got64.shape == want64.shape, msg
    assert not np.isnan(got64).any(), f"{msg}: NaN in the result (an element never written)"
    scale = float(np.abs(want64).max(initial=0.0))
    bound = ULP[dtype_name] * np.abs(want64) + ACCUMULATION[dtype_name] * scale
    worst = np.abs(got64 - want64) - bound
    assert (worst <= 0).all(), f"{msg}: off by {np.abs(got64 - want64).max():.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("strategy", (*STRATEGIES, *fast.gemm.VARIANTS))
def test_every_strategy_against_the_reference(strategy: str, rng: np.random.Generator) -> None:
    ran: Counter = Counter()
    for problem in PROBLEMS:
        for kind in OPS:
            d = cg.OPS[kind]
            for wfmt in (("IOX", "XOI") if d.transposed else ("OIX", "XIO")):
                op = cg.Op(kind, **_attrs(kind, problem, wfmt))
                for dtype_name in DTYPES:
                    inputs = _inputs(kind, problem, wfmt, DATA_DTYPES[dtype_name], rng)
                    want = op(*inputs, engine="reference")
                    with forced_strategy(strategy), poisoned_allocations(), _recorded(ran):
                        got = op(*inputs, engine="fast")
                    _check(got, want, dtype_name, f"{problem[0]}: {kind} {dtype_name} {problem[1]}/{wfmt} "
                           f"forced {strategy}")
    assert ran[strategy] > 0, f"strategy {strategy!r} never ran when forced: {dict(ran)}"


#: Problems where one side of a GEMM is a single row or column: one input channel, one output
#: channel. BLAS is not called for such operands (``blas.addmm`` declines), so NumPy's fallback runs.
NARROW = [
    ("1x1 one input channel", "NXC", 3, 1, 1, 5, (4, 5), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
    ("3x3 one output channel", "NCX", 2, 1, 6, 1, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ("3x3 unpadded", "NXC", 1, 1, 5, 7, (6, 5), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0)),  # x is its own frame
]


def _no_blas(*args, **kwargs) -> bool:
    return False


@pytest.mark.parametrize("strategy", (*STRATEGIES, *fast.gemm.VARIANTS))
@pytest.mark.parametrize("blas", ["direct BLAS", "NumPy fallback"])
def test_every_strategy_on_single_channels_and_without_blas(strategy: str, blas: str, rng: np.random.Generator,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The NumPy fallbacks of the BLAS calls (a single channel; a BLAS that declines every call,
    as on a NumPy without a loadable one), forced strategies, f32 and bf16, against the reference."""
    if blas == "NumPy fallback":
        monkeypatch.setattr(fast.blas, "addmm", _no_blas)
    problems = NARROW + (PROBLEMS[3:5] if blas == "NumPy fallback" else [])
    for problem in problems:
        for kind in OPS:
            d = cg.OPS[kind]
            wfmt = "IOX" if d.transposed else "OIX"
            op = cg.Op(kind, **_attrs(kind, problem, wfmt))
            for dtype_name in ("f32", "bf16"):
                inputs = _inputs(kind, problem, wfmt, DATA_DTYPES[dtype_name], rng)
                want = op(*inputs, engine="reference")
                with forced_strategy(strategy), poisoned_allocations():
                    got = op(*inputs, engine="fast")
                _check(got, want, dtype_name, f"{problem[0]}: {kind} {dtype_name} forced {strategy}, {blas}")
