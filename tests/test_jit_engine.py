"""The fast engine's ``jit`` strategy: micro-kernels, the three tasks and the ISA families.

Every kernel family this machine can run is forced in turn (``isa.set_family``): ``avx2``
(8-wide) where the CPU has AVX2+FMA, ``avx512`` (16-wide) where it has AVX-512F or else through
LLVM's legalisation onto AVX2 (same code path, split vectors), ``avx512_bf16`` likewise (its bf16
dot-product kernel, for bf16 forward and backward data, through its plain-IR stand-in where the
CPU lacks the instruction), and ``portable`` (no JIT kernels: the BLAS-based strategies). The
oracle is the float64 reference engine.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import convgrad as cg
from convgrad import casts, layout
from convgrad.dtypes import DATA_DTYPES
from convgrad.engines import get_engine
from convgrad.engines.fast import Features, Plan, forced_strategy, geometry, isa, jit, microkernel, select
from convgrad.problem import ConvGeometry
from engine_support import MUTATION_SLACK
from engine_support import geometry as _geometry

TASKS = ("forward", "backward_data", "backward_weights")
JIT_FAMILIES = [f for f in ("avx2", "avx512", "avx512_bf16") if f in isa.supported() or "avx2" in isa.supported()]
TOLERANCE = {"f32": 2e-5, "bf16": 2e-2, "f16": 2e-3, "f64": 1e-10}


@pytest.fixture(params=JIT_FAMILIES)
def family(request):
    """Run the test once per JIT family this machine can run (the AVX-512 ones possibly emulated)."""
    before = isa.set_family(request.param, allow_emulated=True)
    yield request.param
    isa.set_family(before)




#: Odd geometries: channel tails of every block (1..3 vectors and partial ones), kernels larger
#: than the input (padding), strides larger than the kernel, outputs of size 1, many groups,
#: dilations, asymmetric pads, 1-D/2-D/3-D.
CASES = {
    "3x3 tails": _geometry(2, 1, 5, 11, (7, 9), (3, 3), pb=(1, 1), pe=(1, 1)),
    "grouped strided": _geometry(2, 2, 9, 20, (8, 7), (3, 2), (2, 3), (1, 2), (1, 0), (2, 1)),
    "1-D kernel > input": _geometry(1, 3, 4, 3, (5,), (7,), pb=(3,), pe=(3,)),
    "3-D": _geometry(2, 1, 3, 17, (4, 5, 6), (2, 3, 2), (2, 1, 3), (1, 1, 2), (1, 0, 1), (0, 2, 1)),
    "stride > kernel": _geometry(3, 1, 6, 24, (9, 10), (2, 2), (3, 4), pe=(1, 0)),
    "output 1": _geometry(2, 1, 7, 9, (3, 3), (3, 3)),
    "many groups": _geometry(2, 12, 2, 3, (6, 5), (3, 3), pb=(1, 1), pe=(1, 1)),
    "wide 1x1": _geometry(2, 1, 40, 50, (6, 7), (1, 1)),
    "strided 1x1": _geometry(2, 1, 20, 36, (7, 9), (1, 1), (2, 3)),      # last positions read by none
    "3-D strided 1x1": _geometry(1, 1, 5, 17, (3, 5, 4), (1, 1, 1), (2, 1, 3)),
}


def _inputs(g: ConvGeometry, rng: np.random.Generator, dtype) -> dict[str, tuple[np.ndarray, ...]]:
    x, w, dy = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in (g.x_shape, g.w_shape, g.y_shape))
    x, w, dy = (a.astype(dtype) for a in (x, w, dy))
    return {"forward": (x, w), "backward_data": (dy, w), "backward_weights": (x, dy)}


def _close(got: np.ndarray, want: np.ndarray, tol: float, msg: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, msg
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), err_msg=msg)


@pytest.mark.parametrize("width, rows, vecs", [(w, *b) for w, blocks in microkernel.BLOCKS.items() for b in blocks])
def test_microkernel_blocks_against_numpy(width, rows, vecs, rng):
    """c[r, v*W + l] += sum_t sum_i a[ta[t] + r*lda + i*astep] * b[tb[t] + i*bstep + v*W + l] for
    every block shape and width, with offsets, strides, several taps and an accumulated c; no
    taps or an empty reduction leave c as it was."""
    vw, k, lda, astep, bstep, ldc = vecs * width, 13, 3, 5, vecs * width + 4, vecs * width + 8
    a = rng.standard_normal(400).astype(np.float32)
    b = rng.standard_normal(2000).astype(np.float32)
    ta, tb = np.array([0, 7, 2], np.int64), np.array([0, 900, 450], np.int64)
    c = rng.standard_normal(rows * ldc + 10).astype(np.float32)
    want = c.astype(np.float64)
    for t in range(3):
        for r in range(rows):
            for i in range(k):
                row = b[3 + tb[t] + i * bstep:3 + tb[t] + i * bstep + vw].astype(np.float64)
                want[5 + r * ldc:5 + r * ldc + vw] += a[11 + ta[t] + r * lda + i * astep] * row
    got = c.copy()
    call = microkernel.kernel_call(width, rows, vecs)
    call(got, 5, ldc, a, 11, lda, astep, b, 3, bstep, ta, tb, 3, k)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for ntaps, depth in ((0, k), (3, 0)):
        same = c.copy()
        call(same, 5, ldc, a, 11, lda, astep, b, 3, bstep, ta, tb, ntaps, depth)
        np.testing.assert_array_equal(same, c)


@pytest.mark.parametrize("case", sorted(CASES))
def test_tasks_against_reference(case, family, rng):
    """Every task of the jit strategy on the odd geometries, f32, in every JIT family."""
    g, reference = CASES[case], get_engine("reference")
    for task, args in _inputs(g, rng, np.float32).items():
        got = getattr(jit, task)(g, *args)
        assert got.dtype == np.float32
        _close(got, getattr(reference, task)(g, *args), TOLERANCE["f32"], f"{case} {task} {family}")


def test_families_give_identical_bits(rng):
    """The 8- and 16-wide families sum every value in the same order: identical results."""
    if "avx2" not in isa.supported():
        pytest.skip("needs AVX2")
    before = isa.set_family("avx2")
    try:
        for case in ("3x3 tails", "grouped strided", "3-D"):
            g = CASES[case]
            for task, args in _inputs(g, rng, np.float32).items():
                isa.set_family("avx2")
                narrow = getattr(jit, task)(g, *args)
                isa.set_family("avx512", allow_emulated=True)
                np.testing.assert_array_equal(getattr(jit, task)(g, *args), narrow, f"{case} {task}")
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("dims", [2, 3])
def test_taps_reading_rows_of_padding_are_skipped(dtype, dims, rng):
    """Padding is not part of the sums (docs/semantics.md): an output row whose tap reads only
    rows of padding does not compute that tap, so an Inf in the tap's weights reaches the rows
    the tap reads and no others (0 * Inf would be NaN), forward and backward data; the 3-D case
    skips along both outer axes. The kernel's last axis is 1: no column of padding is read."""
    size, kernel, dil, pad = ((6, 32), (3, 1), (3, 1), (3, 0)) if dims == 2 else \
        ((4, 6, 32), (2, 3, 1), (2, 3, 1), (1, 3, 0))     # rows cut, not flattened (fewer taps computed)
    g = _geometry(2, 1, 5, 7, size, kernel, dilations=dil, pb=pad, pe=pad)
    args = _inputs(g, rng, DATA_DTYPES[dtype])
    w = args["forward"][1].copy()
    w[(0,) * (dims - 1)] = np.inf                  # the first tap of the outer axes
    reference = get_engine("reference")
    for task in ("forward", "backward_data"):
        a = args[task][0]
        want = getattr(reference, task)(g, a, w).astype(np.float64)
        got = getattr(jit, task)(g, a, w).astype(np.float64)
        finite = np.isfinite(want)
        assert finite.any() and not finite.all(), f"{task}: the case must put the Inf in some rows only"
        np.testing.assert_array_equal(np.isfinite(got), finite, f"{task} {dtype} {dims}-D")
        _close(got[finite], want[finite], TOLERANCE[dtype], f"{task} {dtype} {dims}-D")


#: Stride-1 geometries whose sources the drivers pad an image at a time per thread: flattened
#: rows and rows cut (dilated), asymmetric and large pads, groups, channel tails, 3-D (even
#: channels per group: whole bf16 pairs).
STAGED = {
    "3x3": ((6, 22), (7, 9), (3, 3), 1, (1, 1), (1, 1), (1, 1)),
    "asymmetric": ((6, 20), (8, 5), (3, 2), 1, (2, 0), (0, 3), (1, 1)),
    "dilated rows": ((4, 34), (9, 12), (3, 3), 1, (2, 2), (2, 2), (3, 2)),
    "groups": ((4, 10), (6, 7), (3, 3), 3, (1, 1), (1, 1), (1, 1)),
    "3-D": ((2, 18), (4, 5, 6), (2, 3, 2), 1, (1, 0, 1), (0, 2, 1), (1, 1, 2)),
}


def _forget_setups() -> None:
    """Drop the drivers' remembered sizes (they hold what ``_stages`` said)."""
    jit._forward_setup.cache_clear()
    jit._data_setup.cache_clear()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", sorted(STAGED))
def test_sources_padded_an_image_at_a_time_per_thread(case, dtype, monkeypatch, rng):
    """Forward and backward data reading sources each thread pads an image at a time into its
    own buffer (more images than threads, an odd count: a thread may start inside an image's
    rows) give the bits of the drivers reading one padded copy of every image, and the
    reference's values; with the packed weights past ``cache_bytes`` (channel blocks outermost)
    the staged source is padded at once, and a strided source (bf16 not on 32-bit units) is
    staged too: same bits. bf16 on the dot product (its stand-in where the CPU lacks it)."""
    (icg, ocg), size, kernel, groups, pb, pe, dil = STAGED[case]
    g = _geometry(2 * jit.pool.threads() + 1, groups, icg, ocg, size, kernel, dilations=dil, pb=pb, pe=pe)
    before = isa.set_family("avx512_bf16", allow_emulated=True) if dtype == "bf16" else None
    staged, stages = [], jit._stages

    class Seen(jit._Staged):
        def __init__(self, *args):
            super().__init__(*args)
            staged.append(self)
    monkeypatch.setattr(jit, "_Staged", Seen)
    try:
        for task, args in _inputs(g, rng, DATA_DTYPES[dtype]).items():
            if task == "backward_weights":
                continue
            monkeypatch.setattr(jit, "_stages", lambda *_: False)
            _forget_setups()
            whole = getattr(jit, task)(g, *args)
            assert not staged
            monkeypatch.setattr(jit, "_stages", stages)
            _forget_setups()
            got = getattr(jit, task)(g, *args)
            assert len(staged) == 1, f"{case} {task}: the source was not staged"
            np.testing.assert_array_equal(got, whole, f"{case} {task} {dtype}")
            plan = Plan.of("jit", **{**jit.complete(Features.of(g, task, args[0].dtype, False), {}), "cache_bytes": 1})
            np.testing.assert_array_equal(getattr(jit, task)(g, *args, plan), whole, f"{case} {task} outer")
            wider = np.zeros((*args[0].shape[:-1], args[0].shape[-1] + 3), args[0].dtype)
            wider[..., 1:-2] = args[0]                # strided, 2 bytes off 32-bit units for bf16
            view = wider[..., 1:-2]
            np.testing.assert_array_equal(getattr(jit, task)(g, view, args[1]), whole, f"{case} {task} view")
            assert len(staged) == 3
            staged.clear()
            want = getattr(get_engine("reference"), task)(g, *(a.astype(np.float64) for a in args))
            _close(got, want, TOLERANCE[dtype], f"{case} {task} {dtype}")
    finally:
        if before is not None:
            isa.set_family(before)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_forced_jit_through_the_api(dtype, data_format, family, rng):
    """The ops with the jit strategy forced, every dtype (f64 keeps the selection rule: the JIT
    kernels accumulate in f32) and both layouts, against the reference engine."""
    dt = cg.dtypes.DATA_DTYPES[dtype]
    attrs = dict(strides=[2, 1], pads_begin=[1, 0], pads_end=[1, 2], dilations=[1, 2], groups=2,
                 data_format=data_format, weights_format="XIO" if data_format == "NXC" else "OIX")
    x_shape, w_shape = ((2, 7, 6, 6), (3, 2, 3, 10)) if data_format == "NXC" else ((2, 6, 7, 6), (10, 3, 3, 2))
    x, w = (rng.uniform(-1, 1, s).astype(dt) for s in (x_shape, w_shape))
    y = cg.Op("Convolution", **attrs)(x, w, engine="reference")
    dy = rng.uniform(-1, 1, y.shape).astype(dt)
    with forced_strategy("jit"):
        chosen = select(Features.of(_geometry(2, 2, 3, 5, (7, 6), (3, 2), (2, 1), (1, 2), (1, 0), (1, 2)), "forward",
                                    dt, data_format == "NCX"))
        assert (chosen.strategy == "jit") == (dtype != "f64")
        got = {"y": cg.Op("Convolution", **attrs)(x, w),
               "dx": cg.Op("ConvolutionBackwardData", **attrs)(dy, w, np.array(x.shape)),
               "dw": cg.Op("ConvolutionBackwardWeights", **attrs)(x, dy, np.array(w.shape))}
    want = {"y": y,
            "dx": cg.Op("ConvolutionBackwardData", **attrs)(dy, w, np.array(x.shape), engine="reference"),
            "dw": cg.Op("ConvolutionBackwardWeights", **attrs)(x, dy, np.array(w.shape), engine="reference")}
    for name in got:
        assert got[name].dtype == dt
        _close(got[name], want[name], TOLERANCE[dtype], f"{name} {dtype} {data_format} {family}")


def test_portable_family_runs_without_jit_kernels(rng):
    """``portable``: the jit strategy never applies (not even forced); results still right."""
    before = isa.set_family("portable")
    try:
        g = CASES["3x3 tails"]
        with forced_strategy("jit"):
            assert all(select(Features.of(g, task, np.float32, False)).strategy != "jit" for task in TASKS)
            fast, reference = get_engine("fast"), get_engine("reference")
            for task, args in _inputs(g, rng, np.float32).items():
                _close(getattr(fast, task)(g, *args), getattr(reference, task)(g, *args), TOLERANCE["f32"], task)
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kernel", ["3x3", "1x1", "1x1 per image"])
def test_workspace_estimate_bounds_the_allocations(task, dtype, kernel, rng):
    """The jit strategy's ``workspace_bytes`` bounds its peak allocations (result excluded for f32),
    for NXC data and NCX data (whose forward and data gradient come back in NCX memory; a 1x1
    layer of few positions per image runs NCX on NXC copies, one of many a GEMM per image)."""
    g = {"3x3": _geometry(3, 2, 10, 13, (9, 11), (3, 3), (2, 1), pb=(1, 1), pe=(1, 1)),
         "1x1": _geometry(4, 1, 64, 512, (7, 7), (1, 1)),
         "1x1 per image": _geometry(2, 1, 24, 40, (33, 33), (1, 1))}[kernel]
    assert kernel == "3x3" or jit.ncx_transposes(g, task, cg.dtypes.DATA_DTYPES[dtype]) == (kernel == "1x1")
    dt = cg.dtypes.DATA_DTYPES[dtype]
    bounds = []
    for ncx in (False, True):
        args = _inputs(g, rng, dt)[task]
        if ncx:             # the data as a canonical view of NCX memory
            data = [np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -1, 1)), 1, -1) for a in args[:2]]
            args = (data[0], data[1] if task == "backward_weights" else args[1])
        plan = Plan.of("jit", **jit.complete(Features.of(g, task, dt, ncx), {}))
        jit.run(plan, g, *args, task)
        tracemalloc.start()
        result = jit.run(plan, g, *args, task)
        peak = tracemalloc.get_traced_memory()[1] - result.nbytes
        tracemalloc.stop()
        f = Features.of(g, task, dt, ncx)
        bounds.append(jit.workspace_bytes(f, Plan.of("jit", **jit.complete(f, {}))))
        assert 0 < peak <= bounds[-1] + MUTATION_SLACK, ncx
        assert layout.channels_first(result) == (ncx and task != "backward_weights" and result.dtype == np.float32)
    with forced_strategy("jit"):
        assert get_engine("fast").workspace_bytes(g, task, dt) == max(bounds)


def test_strategy_forcing_is_checked(monkeypatch):
    """An unknown strategy, by the context manager or the environment, is a clear error."""
    with pytest.raises(cg.ConvgradError, match="not a strategy of the fast engine"):
        with forced_strategy("im2col"):
            pass
    monkeypatch.setenv("CONVGRAD_STRATEGY", "bogus")
    with pytest.raises(cg.ConvgradError, match="'bogus' is not a strategy"):
        select(Features.of(CASES["3x3 tails"], "forward", np.float32, False))
    monkeypatch.setenv("CONVGRAD_STRATEGY", "frame")
    assert select(Features.of(CASES["wide 1x1"], "backward_data", np.float32, False)).param("variant") == "frame"


@pytest.mark.parametrize("features,families", [
    (set(), ["portable"]),
    ({"avx2"}, ["portable"]),                                   # AVX2 without FMA: no avx2 kernels
    ({"avx2", "fma", "sse4.2"}, ["avx2", "portable"]),
    ({"avx512f", "avx2", "fma"}, ["avx512", "avx2", "portable"]),
    ({"avx512f", "avx512bf16", "avx2", "fma"}, ["avx512_bf16", "avx512", "avx2", "portable"]),
    ({"avx512bf16"}, ["portable"]),
])
def test_families_follow_the_cpu_features(features, families, monkeypatch):
    """The families a CPU supports, best first, from its LLVM feature names; the engine uses the
    best unless CONVGRAD_ISA (read at first use) names another."""
    monkeypatch.setattr(isa, "host_features", lambda: frozenset(features))
    assert isa.supported() == families
    monkeypatch.setattr(isa, "_current", [])
    monkeypatch.delenv("CONVGRAD_ISA", raising=False)
    assert isa.family() == families[0]
    monkeypatch.setattr(isa, "_current", [])
    monkeypatch.setenv("CONVGRAD_ISA", "portable")
    assert isa.family() == "portable"


def test_families_and_widths():
    """On this host: portable always last, the engine on the best family or the one CONVGRAD_ISA
    names; widths are 16 / 8."""
    have = isa.supported()
    assert have[-1] == "portable"
    assert isa.family() == (os.environ.get("CONVGRAD_ISA") or have[0])
    assert {isa.WIDTH[f] for f in ("avx512_bf16", "avx512")} == {16} and isa.WIDTH["avx2"] == 8
    assert ("avx2" in have) == ({"avx2", "fma"} <= isa.host_features())


@pytest.mark.parametrize("name, message", [("sse9", "is not a kernel family"),
                                            ("avx512_bf16", "needs CPU features")])
def test_forcing_an_isa_the_cpu_cannot_run_is_a_clear_error(name, message):
    """``CONVGRAD_ISA`` naming an unknown family, or one this CPU lacks, fails with ISAError at
    the first convolution (never an illegal instruction); ``set_family`` likewise."""
    if name in isa.supported():
        pytest.skip(f"this CPU runs {name}")
    code = ("import numpy as np, convgrad as cg\n"
            "try:\n"
            "    cg.Op('Convolution', strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])(\n"
            "        np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 2), np.float32))\n"
            "except cg.ConvgradError as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CONVGRAD_ISA": name},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ISAError") and message in out.stdout, out.stdout
    with pytest.raises(isa.ISAError, match=message):
        isa.set_family(name)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("positions", [1, 3, 5, 37, 4001])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
@pytest.mark.parametrize("rounded", [False, True])
def test_widened_pointwise_gemms_in_chunks(task, positions, strides, rounded, rng):
    """f16 1x1 layers (widened to f32 for the kernels) in chunks (``jit._widened_gemm``: of K for
    a deep weights gradient, else of the larger of M and N, fewer values than chunks included):
    each result value the f32 sum (f16 when ``rounded``: that sum rounded once), and the extra
    memory at most the inputs and output (whole f32 copies and an f32 result took 2.3-3.1x)."""
    g = _geometry(1, 1, 24, 40, (positions, 1), (1, 1), strides)
    args = {k: tuple(rng.uniform(-1, 1, a.shape).astype(np.float16) for a in v) for k, v in _inputs(g, rng, np.float16).items()}
    jit.pointwise(g, *args[task], task, rounded=rounded)
    tracemalloc.start()
    got = jit.pointwise(g, *args[task], task, rounded=rounded)
    peak = tracemalloc.get_traced_memory()[1] - got.nbytes
    tracemalloc.stop()
    want = getattr(get_engine("reference"), task)(g, *(a.astype(np.float64) for a in args[task]))
    assert got.dtype == (np.float16 if rounded else np.float32) and got.shape == want.shape
    if rounded:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float16).astype(np.float64),
                                   rtol=2e-3, atol=2e-3 * max(1.0, np.abs(want).max()))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    if positions > 1000:
        assert peak <= sum(a.nbytes for a in args[task]) + got.nbytes + MUTATION_SLACK, peak


@pytest.mark.parametrize("task", TASKS[:2])
@pytest.mark.parametrize("groups, channels", [(1, 70), (2, 9)])
@pytest.mark.parametrize("rounded", [False, True])
def test_widened_drivers_in_chunks_of_images_and_channels(task, groups, channels, rounded, monkeypatch, rng):
    """f16 forward and backward data of several taps with their f32 copies cut to one image and
    one vector of output channels at a time (``TUNING.widened_bytes`` of 1 byte; grouped: all
    channels): the same result as the reference, rounded once where asked."""
    monkeypatch.setattr(jit, "TUNING", dataclasses.replace(jit.TUNING, widened_bytes=1))
    g = _geometry(3, groups, channels, channels + 5, (6, 5), (3, 3), (2, 1), pb=(1, 1), pe=(1, 0))
    args = _inputs(g, rng, np.float16)[task]
    assert len(jit._chunks(g, np.dtype(np.float16), 1, 1, 1, channels, 16)[0]) == 3
    got = getattr(jit, task)(g, *args, None, rounded)
    want = getattr(get_engine("reference"), task)(g, *(a.astype(np.float64) for a in args))
    _close(got, want, TOLERANCE["f16"], f"{task} groups={groups}")
    assert got.dtype in ((np.float16,) if rounded and casts.bits_kind(np.dtype(np.float16)) else (np.float32,))


@pytest.mark.parametrize("standin", [pytest.param(False, marks=pytest.mark.skipif(not isa.bf16_host(), reason="no AVX512_BF16")),
                                     True], ids=["native", "standin"])
def test_bf16_weights_gradient_in_tap_slabs_is_rounded_once(standin, rng):
    """A bf16 weights gradient whose f32 sums outweigh x and dy, asked rounded: a few taps at a
    time (``jit._tap_slab``), each slab rounded once: bit for bit the rounding of the f32 sums
    of all taps at once, and within 2x the inputs and output of extra memory."""
    from convgrad.dtypes import bfloat16
    g = _geometry(2, 1, 64, 96, (4, 5), (3, 3), pb=(1, 1), pe=(1, 1))
    x, dy = (rng.uniform(-1, 1, s).astype(bfloat16) for s in (g.x_shape, g.y_shape))
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=standin)
    try:
        plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_weights", np.dtype(bfloat16), False), {}))
        assert jit._tap_slab(g, x, dy, plan, True) < 9
        whole = jit.backward_weights(g, x, dy, plan)
        jit.backward_weights(g, x, dy, plan, rounded=True)    # compiled (or loaded) outside the measure
        tracemalloc.start()
        got = jit.backward_weights(g, x, dy, plan, rounded=True)
        peak = tracemalloc.get_traced_memory()[1] - got.nbytes
        tracemalloc.stop()
    finally:
        isa.set_family(before)
    assert got.dtype == bfloat16 and got.shape == g.w_shape
    np.testing.assert_array_equal(got.view(np.uint16), casts.from_f32(np.ascontiguousarray(whole), bfloat16).view(np.uint16))
    _close(got.astype(np.float32), get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64)),
           TOLERANCE["bf16"], "slabs")
    assert peak <= 2 * (x.nbytes + dy.nbytes + got.nbytes) + MUTATION_SLACK, peak


_SMALL_WEIGHTS = [
    (1, 37, 70, (3, 3), 64, slice(None)),          # tails: a partial block, reduction rows past a tile
    (3, 5, 17, (2, 1), 16, slice(None)),           # groups, an odd reduction (bf16 pairs padded)
    (2, 33, 20, (1, 3), 32, slice(8, 31)),         # a window of the columns
]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("groups,icg,ocg,kernel,vw,columns,memory", [
    (1, 512, 512, (3, 3), 64, slice(None), "C"),   # a res5 layer's weights: whole blocks, 16-row tiles
    *[(*case, memory) for memory in ("C", "OIX", "flipped") for case in _SMALL_WEIGHTS],
])
def test_packed_weights_against_their_definition(groups, icg, ocg, kernel, vw, columns, depth, transpose, memory, rng):
    """``jit._packed_weights`` (the parallel packing kernels: rows of lanes, or tiles transposed)
    holds, for every group, block, tap, reduction row r and lane c, the weight it names:
    ``w[t, r, column]`` (forward) or ``w[t, column, r]`` (transposed) of the block's column, zero
    past the channels, bf16 pairs interleaved per lane (depth 2), from weights C-contiguous, a
    view of OIX memory or one of negative strides; the f32 path also equals NumPy's strided
    assignment."""
    from convgrad.engines.fast import jit
    from convgrad.problem import ConvGeometry

    g = ConvGeometry(1, groups, groups * icg, groups * ocg, (4,) * len(kernel), (4,) * len(kernel), kernel,
                     (1,) * len(kernel), (1,) * len(kernel), (0,) * len(kernel), (0,) * len(kernel))
    dtype = cg.dtypes.bfloat16 if depth == 2 else np.float32
    w = rng.standard_normal(g.w_shape).astype(dtype)
    if memory == "OIX":                                  # (*K, I, O) viewed from (O, I, *K) memory
        w = np.ascontiguousarray(np.moveaxis(w, (-1, -2), (0, 1))).transpose(*range(2, w.ndim), 1, 0)
    elif memory == "flipped":                            # every axis read backwards
        w = np.ascontiguousarray(w[(slice(None, None, -1),) * w.ndim])[(slice(None, None, -1),) * w.ndim]
    got, finite = jit._packed_weights(g, w, vw, transpose, depth, columns)
    assert finite is True                                # what the compiled packing saw
    bits = (w.view(np.uint16) if depth == 2 else w).reshape(-1, icg, groups, ocg)  # (T, ICg, G, OCg)
    cols = np.arange(icg if transpose else ocg)[columns]
    red, blocks, rows = (ocg if transpose else icg), got.shape[1], got.shape[3] * depth
    want = np.zeros((groups, blocks, bits.shape[0], rows, vw), bits.dtype)
    for gi, b in np.ndindex(groups, blocks):
        block = cols[b * vw:(b + 1) * vw]
        part = bits[:, :, gi, :][:, block, :].transpose(0, 2, 1) if transpose else bits[:, :, gi, :][:, :, block]
        want[gi, b, :, :red, :len(block)] = part          # (T, red, lanes)
    got_values = got.view(np.uint16) if depth == 2 else got
    np.testing.assert_array_equal(got_values, want.reshape(*want.shape[:3], rows // depth, depth, vw).swapaxes(4, 5))
    if depth == 1:
        widened, seen = jit._packed_weights(g, w.astype(np.float64), vw, transpose, 1, columns)
        np.testing.assert_array_equal(got, widened)
        assert seen is None                              # NumPy's assignment: not looked at


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16])
@pytest.mark.parametrize("size, strides", [((7, 9), (2, 3)), ((3, 5, 4), (2, 1, 3)), ((11,), (4,))])
def test_sampled_and_spread_positions(size, strides, dtype, rng):
    """A strided 1x1 convolution's positions: ``sampled`` is NumPy's strided slice, ``spread``
    puts rows back there with zeros elsewhere (every value written: the output starts as junk)."""
    out_size = tuple((i - 1) // s + 1 for i, s in zip(size, strides))
    a = rng.integers(1, 60000, (2, *size, 5)).astype(np.uint16).view(dtype) if dtype != np.float32 else \
        rng.standard_normal((2, *size, 5)).astype(np.float32)
    kept = (slice(None), *(slice(None, o * s, s) for o, s in zip(out_size, strides)), slice(None))
    got = geometry.sampled(a, strides, out_size)
    assert got.flags.c_contiguous and got.shape == a[kept].shape
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(a[kept]).view(np.uint8))
    junk = np.full(a.shape, 7, a.dtype)
    want = np.zeros_like(a)
    want[kept] = got
    np.testing.assert_array_equal(geometry.spread(got, strides, junk).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("width", microkernel.WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_transpose32_tiles(width, dtype, rng):
    """``microkernel.transpose32`` (through ``transpose_tile``): unit j of source row i lands as unit i of destination row j,
    from any element offsets and row strides (uint16: a unit is a pair), nothing else written."""
    import numba

    @numba.njit
    def run(src, soff, sld, dst, doff, dld):  # pragma: no cover - compiled
        microkernel.transpose_tile(width, src, soff, sld, dst, doff, dld)

    per = 2 if dtype == np.uint16 else 1
    src = rng.integers(0, 60000, (width + 5, 3 * width * per)).astype(dtype)
    dst = np.full((width + 4, 2 * width * per + 3), 7, dtype)
    before = dst.copy()
    run(src.reshape(-1), 2 * src.shape[1] + 3 * per, src.shape[1], dst.reshape(-1), 1 * dst.shape[1] + per, dst.shape[1])
    block = src[2:2 + width, 3 * per:(3 + width) * per]
    want = before.copy()
    if per == 1:
        want[1:1 + width, 1:1 + width] = block.T
    else:
        pairs = block.reshape(width, width, 2)                 # (row i, unit j, half)
        want[1:1 + width, 2:2 + 2 * width] = pairs.transpose(1, 0, 2).reshape(width, 2 * width)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("width", microkernel.WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_copy32_units(width, dtype, rng):
    """``microkernel.copy32`` (through ``copy_units``): ``width`` 32-bit units from any element
    offset to any other (uint16: a unit is a pair; a negative offset from a view's start),
    nothing else written."""
    import numba

    @numba.njit
    def run(src, soff, dst, doff):  # pragma: no cover - compiled
        microkernel.copy_units(width, src, soff, dst, doff)

    per = 2 if dtype == np.uint16 else 1
    src = rng.integers(0, 60000, 4 * width * per).astype(dtype)
    dst = np.full(3 * width * per, 7, dtype)
    want = dst.copy()
    want[3 * per:(3 + width) * per] = src[5 * per:(5 + width) * per]
    run(src[2 * width * per:], 5 * per - 2 * width * per, dst, 3 * per)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("width", microkernel.WIDTHS)
def test_pairs32_interleaves_two_rows(width, rng):
    """``microkernel.pairs32`` (through ``pair_units``): value i of the first row, then of the
    second, as pair i from any element offsets, nothing else written."""
    import numba

    @numba.njit
    def run(src, first, second, dst, doff):  # pragma: no cover - compiled
        microkernel.pair_units(width, src, first, second, dst, doff)

    src = rng.integers(0, 65536, 4 * width).astype(np.uint16)
    dst = np.full(3 * width + 4, 7, np.uint16)
    want = dst.copy()
    want[3:3 + 2 * width:2], want[4:4 + 2 * width:2] = src[5:5 + width], src[2 * width + 1:3 * width + 1]
    run(src, 5, 2 * width + 1, dst, 3)
    np.testing.assert_array_equal(dst, want)


def test_the_drivers_tables_are_remembered_per_geometry_and_source(monkeypatch) -> None:
    """The stride phases' and taps' tables are remembered per geometry and padded source (a small
    call's Python): a repeated strided data gradient and forward take the memo's tables, equal
    to tables built afresh (the drivers' results on them: the reference tests above)."""
    rng = np.random.default_rng()
    g = ConvGeometry(2, 1, 8, 16, (9, 7), (5, 4), (3, 3), (2, 1), (1, 2), (1, 0), (1, 1))
    x, w, dy = (rng.standard_normal(shape).astype(np.float32) for shape in (g.x_shape, g.w_shape, g.y_shape))
    runs: list[tuple] = []
    monkeypatch.setattr(jit, "_run_outputs", lambda *args: runs.append(args))   # no kernels: the tables only
    for run, table in ((lambda: jit.backward_data(g, dy, w), jit._phase_tables), (lambda: jit.forward(g, x, w),
                                                                                 jit._tap_tables)):
        start = len(runs)
        run()
        first, hits = len(runs) - start, table.cache_info().hits
        run()
        assert table.cache_info().hits > hits and len(runs) == start + 2 * first
        for old, new in zip(runs[start:start + first], runs[start + first:]):
            assert old[4] is new[4] and old[16] is new[16], "a table was built again"   # taps_a, tap_rows
    _, lo, size = jit._data_phases(g)
    ds = tuple(jit._strides((g.n, *size, g.oc)).tolist())
    for (base, grid, *arrays), (base2, grid2, *fresh) in zip(jit._phase_tables(g, 16 * 8, ds),
                                                             jit._phase_tables.__wrapped__(g, 16 * 8, ds)):
        assert (base, grid) == (base2, grid2)
        for a, b in zip(arrays, fresh):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("task, dtype, value", [
    pytest.param(task, dtype, value, id=f"{task}-{name}-{vname}",
                 marks=() if name == "f32" or (task, vname) == ("forward", "nan") else pytest.mark.exhaustive)
    for task in TASKS for dtype, name in ((np.float32, "f32"), (cg.dtypes.DATA_DTYPES["bf16"], "bf16"))
    for value, vname in ((np.nan, "nan"), (np.inf, "inf"))])
def test_nan_and_inf_meet_padding_only_where_the_sums_read_them(task, dtype, value, rng):
    """A padded problem on the jit strategy with a NaN or an Inf in its weights (forward, data
    gradient) or in dy (weights gradient), at a corner where most taps read padding: NaN and Inf
    exactly where the reference engine has them (padding is not part of the sums,
    docs/guarantees.md), the other outputs its values."""
    g = _geometry(2, 1, 24, 20, (9, 8), (3, 3), (1, 1), pb=(1, 1), pe=(1, 1))
    args = list(_inputs(g, rng, np.float32)[task])
    args[1][(0,) * args[1].ndim] = value                  # w (*K, ICg, OC), or dy (N, *O, OC)
    args = [a.astype(dtype) for a in args]
    plan = Plan.of("jit", **jit.complete(Features.of(g, task, np.dtype(dtype), False), {}))
    got = np.asarray(jit.run(plan, g, *args, task, rounded=dtype != np.float32), np.float64)
    want = getattr(get_engine("reference"), task)(g, *(a.astype(np.float64) for a in args))
    assert not np.isfinite(want).all() and np.isfinite(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    _close(got[finite], want[finite], TOLERANCE["f32" if dtype == np.float32 else "bf16"], task)


@pytest.mark.parametrize("groups, icg, rows, kernel, strides, dilations, pads", [
    (1, 3, 3, (2, 7), (1, 2), (1, 1), (1, 3)),     # conv1-like: one block, every channel a row
    (2, 3, 4, (3, 3), (1, 1), (2, 2), (1, 2)),     # one block, a row past the channels
    (1, 1, 6, (1, 3), (2, 3), (1, 1), (0, 1)),     # one block of one channel, stride > kernel
    (1, 20, 6, (3, 3), (1, 1), (1, 1), (1, 1)),    # several blocks, the last one padded
    (3, 8, 4, (2, 5), (2, 2), (1, 2), (0, 3)),     # several blocks per group
])
def test_pair_blocks_against_their_definition(groups, icg, rows, kernel, strides, dilations, pads, rng):
    """``jit._pair_blocks`` (bf16 x as pairs of positions for the weights gradient on the dot
    instruction): ``[ph, n, p0, p1, q, g, c, j]`` = padded x at last-axis position
    ``2*S*q + j*S + ph`` and channel ``g*ICg + c``, zero past the data and the channels (to
    whole blocks of R), every value written again into an earlier call's array; tap k's offset
    reaches phase ``k*D mod 2S`` and pair ``k*D // 2S``."""
    g = _geometry(2, groups, icg, 5, (4, 11), kernel, strides, dilations, (1, pads[0]), (0, pads[1]))
    bits = rng.integers(1, 65535, (g.n, *g.in_size, g.ic)).astype(np.uint16)
    first, _ = jit._pair_blocks(g, bits.view(DATA_DTYPES["bf16"]), rows)
    first[...] = 7                                    # stale values: each one must be written again
    got, taps = jit._pair_blocks(g, bits.view(DATA_DTYPES["bf16"]), rows, first)
    size, lo = geometry.spatial(g.padded_size, 1), geometry.spatial(g.pads_begin, 0)
    padded = np.zeros((g.n, *size, groups, -(-icg // rows) * rows), np.uint16)
    inner = tuple(slice(a, a + n) for a, n in zip(lo, geometry.spatial(g.in_size, 1)))
    padded[(slice(None), *inner, slice(None), slice(0, icg))] = \
        bits.reshape(g.n, *geometry.spatial(g.in_size, 1), groups, icg)
    s, d = geometry.spatial(g.strides, 1), geometry.spatial(g.dilations, 1)
    phases, q = jit._pair_phases(g)
    for pi, ph in enumerate(phases):
        for j in (0, 1):
            positions = 2 * s[2] * np.arange(q) + j * s[2] + ph
            inside = positions < size[2]
            want = np.zeros((g.n, size[0], size[1], q, groups, padded.shape[-1]), np.uint16)
            want[:, :, :, inside] = padded[:, :, :, positions[inside]]
            np.testing.assert_array_equal(got[pi, ..., j], want, err_msg=f"phase {ph}, half {j}")
    xs = jit._strides(got.shape[1:])
    want_taps = [phases.index(k2 * d[2] % (2 * s[2])) * got[0].size + k0 * d[0] * xs[1] + k1 * d[1] * xs[2]
                 + k2 * d[2] // (2 * s[2]) * xs[3] for k0, k1, k2 in np.ndindex(*geometry.spatial(g.kernel, 1))]
    np.testing.assert_array_equal(taps, want_taps)


@pytest.mark.parametrize("ic, in_size, kernel, strides, dilations, pads", [
    (3, (15, 16), (7, 7), (2, 2), (1, 1), (3, 2)),         # a first layer: ResNet-50's conv1, small
    (1, (9, 12), (3, 5), (1, 1), (2, 1), (1, 2)),          # one channel, a dilation on the other axis
    (7, (6, 14), (3, 3), (1, 3), (1, 1), (1, 0)),          # just under fold_channels, stride 3 along the row
    (3, (5, 6, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 0)),   # 3-D U-Net's first layer, small
])
def test_weights_gradient_reads_the_last_kernel_axis_as_channels(ic, in_size, kernel, strides, dilations, pads, rng):
    """A weights gradient of one group of few input channels (dilation 1 along the last axis)
    runs its last kernel axis' taps as K2*ICg rows of one tap's blocks (``jit.folds``): against
    the reference on every block of the family's width (fewer and more rows than that, a last
    block past the rows); not folded for bf16 pairs (``depth`` 2), a dilated last axis, groups, or
    ``fold_channels`` channels."""
    g = _geometry(2, 1, ic, 20, in_size, kernel, strides, dilations, pads, tuple(reversed(pads)))
    assert jit.folds(g, 1) == kernel[-1] and jit.folds(g, 2) == 1
    for other in (dataclasses.replace(g, dilations=(*g.dilations[:-1], 2)), _geometry(2, 2, ic, 4, in_size, kernel),
                  _geometry(2, 1, jit.TUNING.fold_channels, 4, in_size, kernel)):
        assert jit.folds(other, 1) == 1
    x, dy = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in (g.x_shape, g.y_shape))
    x, dy = x.astype(np.float32), dy.astype(np.float32)
    want = get_engine("reference").backward_weights(g, x, dy)
    f = Features.of(g, "backward_weights", np.float32, False)
    for rows, vecs in microkernel.BLOCKS[isa.WIDTH[isa.family()]]:
        got = jit.backward_weights(g, x, dy, Plan.of("jit", **jit.complete(f, {"block": f"{rows}x{vecs}"})))
        _close(got, want, TOLERANCE["f32"], f"{kernel} {rows}x{vecs}")


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_packed_weights_say_whether_every_value_is_finite(transpose, dtype, rng) -> None:
    """``_packed_weights`` reports whether its compiled packing saw only finite values (both
    packings: rows read in turn for XIO taps, tiles for the transposed ones; bf16 pairs and
    f32; channels past the vectors and a pair's odd row): a NaN or +-Inf at any of the tried
    positions is seen, finite weights are finite (their values:
    test_packed_weights_against_their_definition)."""
    depth, vw = (2, 32) if dtype == "bf16" else (1, 16)
    g = _geometry(1, 2, 37, 21, (5, 4), (3, 2), pb=(1, 0), pe=(1, 0))
    w = (rng.uniform(0.5, 1.5, g.w_shape) * rng.choice([-1, 1], g.w_shape)).astype(DATA_DTYPES[dtype])
    assert jit._packed_weights(g, w, vw, transpose, depth)[1] is True
    flat = w.reshape(-1)
    for at in (0, 1, flat.size // 2, flat.size - 2, flat.size - 1):
        for bad in (np.nan, np.inf, -np.inf):
            spoiled = flat.copy()
            spoiled[at] = bad
            assert jit._packed_weights(g, spoiled.reshape(w.shape), vw, transpose, depth)[1] is False, (at, bad)


def test_padded_problems_with_finite_weights_read_them_once(monkeypatch, rng) -> None:
    """A padded forward and data gradient on ``jit`` take the weights' finiteness from their
    packing: no pass of ``direct.finite`` over w (or the result) when w is finite; with a NaN
    weight next to padding they still give the exact loops' result (padding is not part of
    the sums)."""
    from convgrad.engines.fast import direct
    g = _geometry(2, 1, 8, 16, (6, 5), (3, 3), pb=(1, 1), pe=(1, 1))
    plan = Plan.of("jit", **jit.complete(Features.of(g, "forward", np.float32, False), {}))
    args = _inputs(g, rng, np.float32)
    read: list[int] = []
    real = direct.finite
    monkeypatch.setattr(direct, "finite", lambda a, *rest: read.append(a.size) or real(a, *rest))
    for task in ("forward", "backward_data"):
        jit.run(plan, g, *args[task], task)
        assert read == [], task
        w = args[task][1].copy()
        w[0, 0, 0, 0] = np.nan                  # a corner tap: it meets the padding
        a = args[task][0]
        got = jit.run(plan, g, a, w, task)
        want = getattr(direct, task)(g, a, w, np.dtype(np.float32))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), task)
        read.clear()


@pytest.mark.parametrize("offset", [0, 4, 16])
def test_f32_weights_gradient_copies_dy_off_a_line_per_chunk(offset, rng) -> None:
    """f32 dy starting ``offset`` bytes past a cache line: the weights gradient's driver copies
    each chunk of rows' block of channels (here one row a chunk, several chunks a thread) onto
    one as it uses it; the reference's sums wherever dy starts, both splits."""
    width = jit._width()                                # a block of 2 vectors: dy's channels fill its lanes
    block = "14x2" if width == 16 else "6x2"
    g = _geometry(3, 1, 13, 2 * width, (9, 8), (3, 3), pb=(1, 1), pe=(1, 1))
    x, dy = (rng.uniform(-1, 1, s).astype(np.float32) for s in (g.x_shape, g.y_shape))
    buffer = np.empty(dy.nbytes + 128, np.uint8)
    start = (-buffer.ctypes.data % 64 + offset) % 64
    placed = buffer[start:start + dy.nbytes].view(np.float32).reshape(dy.shape)
    placed[...] = dy
    assert placed.ctypes.data % 64 == offset
    want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    for split in ("rows", "blocks"):
        plan = Plan.of("jit", block=block, cache_bytes=1, split=split)
        got = jit.backward_weights(g, x, placed, plan)
        _close(got, want, TOLERANCE["f32"], f"offset {offset} split {split}")


def test_weights_sums_are_written_without_a_zero_fill(monkeypatch, rng) -> None:
    """The weights driver's first chunk of rows stores its partial sums (no zero fill of them
    first): on NaN-filled memory the sums stay the reference's, for every split and odd
    geometry, f32 and the bf16 pairs (stand-in); and where a first call holds fewer rows than
    shares (bf16 pairs an image at a time, one output row each) the sums are zeroed first."""
    from convgrad.dtypes import bfloat16
    from convgrad.engines.fast import workspace
    real = workspace.result

    def poisoned(shape, dtype, fill=False, offset=0):
        out = real(shape, dtype, fill, offset)
        if not fill and np.dtype(dtype) == np.float32:
            out.fill(np.nan)
        return out
    monkeypatch.setattr(workspace, "result", poisoned)
    reference = get_engine("reference")
    for name in ("3x3 tails", "grouped strided", "3-D", "many groups", "output 1"):
        g = CASES[name]
        x, dy = (rng.uniform(-1, 1, s).astype(np.float32) for s in (g.x_shape, g.y_shape))
        want = reference.backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
        for split in ("rows", "blocks"):
            plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_weights", np.dtype(np.float32), False),
                                                 {"cache_bytes": 1, "split": split}))
            _close(jit.backward_weights(g, x, dy, plan), want, TOLERANCE["f32"], f"{name} {split}")
    monkeypatch.setattr(jit, "TUNING", dataclasses.replace(jit.TUNING, pair_bytes=1))   # an image a call
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=True)
    try:
        for g in (_geometry(5, 1, 6, 20, (6,), (3,), pb=(1,), pe=(1,)), CASES["3x3 tails"]):
            x, dy = (rng.uniform(-1, 1, s).astype(bfloat16) for s in (g.x_shape, g.y_shape))
            assert jit._pair_images(g, 4, 16)[0] == 1
            plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_weights", np.dtype(bfloat16), False),
                                                 {"split": "rows"}))
            got = jit.backward_weights(g, x, dy, plan)
            want = reference.backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
            _close(got, want, TOLERANCE["bf16"], f"bf16 pairs {g.in_size}")
    finally:
        isa.set_family(before)


def test_f32_weights_partial_sums_start_on_a_cache_line(monkeypatch, rng) -> None:
    """The weights driver's partial sums (its kernels' C, loaded and stored as whole vectors)
    start on a cache line whatever the allocator gives: NumPy's own arrays start 16 bytes past
    one when large (glibc's mmap), and there every vector of C touched two lines (ResNet-50's
    256-channel 3x3 f32 weights gradient took 24-28 ms against 14-15). Sizes vary so that an
    allocator's chance alignment does not hide a miss; the sums stay the reference's."""
    made, weights = [], jit._weights

    def watched(*key):
        run = weights(*key)

        def call(*args):
            made.append(args[10].ctypes.data % 64)
            return run(*args)
        return call
    monkeypatch.setattr(jit, "_weights", watched)
    block = "14x2" if jit._width() == 16 else "6x2"
    for n, ic, oc in [(2, 5, 32), (3, 17, 64), (1, 40, 48), (2, 64, 96), (4, 9, 33), (1, 128, 128)]:
        g = _geometry(n, 1, ic, oc, (9, 8), (3, 3), pb=(1, 1), pe=(1, 1))
        x, dy = (rng.uniform(-1, 1, s).astype(np.float32) for s in (g.x_shape, g.y_shape))
        got = jit.backward_weights(g, x, dy, Plan.of("jit", block=block, cache_bytes=1, split="rows"))
        want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
        _close(got, want, TOLERANCE["f32"], f"{n} {ic} {oc}")
    assert made and all(offset == 0 for offset in made), made


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_spread_streams_whole_lines_past_the_caches(dtype, monkeypatch, rng) -> None:
    """A strided 1x1 data gradient's dx: the GEMM's rows at the positions the strides keep, zero
    everywhere else (over a result full of NaN bits before), whether stored non-temporally
    (whole cache lines a position: every large result, here all of them) or not (a position's
    channels not whole lines); and the streamed stores are the ones taken where they can be."""
    from convgrad.engines.fast import workspace
    monkeypatch.setattr(geometry, "TUNING", dataclasses.replace(geometry.TUNING, spread_stream_bytes=0))
    streamed, inner = [], geometry._spread

    def watched(*args):
        if args[-1].size:
            streamed.append(True)
        return inner(*args)
    monkeypatch.setattr(geometry, "_spread", watched)
    np_dtype = DATA_DTYPES[dtype]
    line = 64 // np.dtype(np_dtype).itemsize
    for channels, strides, in_size in [(line, (2, 2), (7, 9)), (3 * line, (1, 3), (5, 8)), (line + 3, (2, 2), (6, 6)),
                                       (2 * line, (3, 2, 2), (4, 5, 3))]:
        out_size = tuple(-(-i // s) for i, s in zip(in_size, strides))
        rows = rng.uniform(-1, 1, (2, *out_size, channels)).astype(np_dtype)
        out = workspace.result((2, *in_size, channels), np_dtype)
        out.view(f"u{out.itemsize}")[...] = np.iinfo(f"u{out.itemsize}").max      # NaN bits everywhere
        streamed.clear()
        got = geometry.spread(rows, strides, out)
        want = np.zeros_like(out)
        want[(slice(None), *(slice(None, None, s) for s in strides))] = rows
        np.testing.assert_array_equal(got.view(f"u{out.itemsize}"), want.view(f"u{out.itemsize}"),
                                      f"{dtype} {channels} {strides}")
        assert bool(streamed) == (channels % line == 0), (dtype, channels, streamed)
    off = workspace.result((2, 6, 6, line), np_dtype, offset=16)    # off a line: the plain loop
    rows = rng.uniform(-1, 1, (2, 3, 3, line)).astype(np_dtype)
    streamed.clear()
    got = geometry.spread(rows, (2, 2), off)
    assert not streamed and np.array_equal(got[:, ::2, ::2], rows) and not got[:, 1::2].any()


def _fmas(asm: str) -> int:
    return sum(1 for line in asm.splitlines() if line.strip().startswith(("vfmadd", "vfmsub", "vfnmadd")))


@pytest.mark.skipif(not isa.supported(), reason="no JIT family on this CPU")
@pytest.mark.parametrize("driver", ["outputs", "gemm"])
def test_each_driver_variant_inlines_one_kernel(driver, rng):
    """A driver variant holds one copy of its kernel: every ``microkernel.run`` call site inlines
    a whole kernel (two unrolled loop nests), so a driver that called it once per target type
    and place (the outputs driver: f32 and bf16 bits, in place and into a tile) compiled four,
    seconds each on a fresh checkout. Counted as FMA instructions of the driver's f32 code
    against one kernel's compiled alone for this host."""
    import llvmlite.binding as llvm
    import numba

    width = jit._width()
    if driver == "outputs":
        g = _geometry(2, 1, 8, 2 * width, (9, 8), (3, 3), pb=(1, 1), pe=(1, 1))
        plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_data", np.dtype(np.float32), False), {}))
        dy, w = _inputs(g, rng, np.float32)["backward_data"]
        jit.run(plan, g, dy, w, "backward_data")
        rows, vecs, _ = jit._block(plan)
        compiled = jit._outputs(width, rows, vecs, 0, False)
    else:
        from convgrad.engines.fast import blis
        a, b = rng.standard_normal((97, 64), dtype=np.float32), rng.standard_normal((64, 3 * width), dtype=np.float32)
        np.testing.assert_allclose(blis.gemm(a, b), a @ b, rtol=1e-4, atol=1e-4)
        bl = blis.blocks(97, 64, 3 * width, 4)
        rows, vecs = bl.rows, bl.vecs
        compiled = blis._driver(width, rows, vecs, 0, False)
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    one = _fmas(machine.emit_assembly(llvm.parse_assembly(microkernel.kernel_ir(width, rows, vecs))))
    assert one >= rows * vecs
    f32 = [o.signature.args for o in compiled.body.overloads.values() if o.signature.args[1].dtype == numba.float32]
    assert f32                                   # (the bf16 stand-in's variants share the key)
    fresh = numba.njit(**compiled.options)(compiled.function)     # compiled here: a disk-cached one has no assembly
    fresh.compile(f32[0])
    assert one <= _fmas(fresh.inspect_asm(f32[0])) < 2 * one
