"""The fast engine against the float64 reference engine: an attribute grid through the API, and
hypothesis-generated geometries (awkward sizes included) on the engine directly."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import convgrad as cg
from convgrad.dtypes import DATA_DTYPES
from convgrad.engines import default_engine_name, get_engine
from convgrad.engines.fast import Features, Plan, forced_plan, forced_strategy, workspace
from convgrad.problem import ConvGeometry
from engine_support import MUTATION_SLACK
from poison import poisoned_allocations
from reliability_support import examples

FAST, REF = get_engine("fast"), get_engine("reference")
TASKS = ("forward", "backward_data", "backward_weights")
#: The fast engine's strategies, each forced on every problem it can take (the documented
#: ``forced_strategy`` / ``CONVGRAD_STRATEGY``): the compiled direct loops, the gemm strategy's
#: frame and GEMMs over output rows (gradients), and the JIT micro-kernels (f32 accumulation).
PATHS = ("direct", "frame", "output_rows", "jit")


@pytest.fixture(params=PATHS)
def path(request) -> str:
    """Run the test once on each strategy of the fast engine."""
    with forced_strategy(request.param):
        yield request.param


def _tolerance(dtype: np.dtype) -> float:
    return {"f64": 1e-10, "f32": 2e-5, "bf16": 2e-2, "f16": 2e-3}[cg.dtypes.dtype_name(dtype)]


def _close(got: np.ndarray, want: np.ndarray, tol: float, msg: str = "") -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, msg
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=msg)


def _geometry(n, groups, icg, ocg, in_size, kernel, strides, dilations, pb, pe) -> ConvGeometry | None:
    out = tuple((i + b + e - (k - 1) * d - 1) // s + 1
                for i, b, e, k, d, s in zip(in_size, pb, pe, kernel, dilations, strides))
    if any(i + b + e < (k - 1) * d + 1 for i, b, e, k, d in zip(in_size, pb, pe, kernel, dilations)):
        return None
    return ConvGeometry(n, groups, groups * icg, groups * ocg, tuple(in_size), out, tuple(kernel),
                        tuple(strides), tuple(dilations), tuple(pb), tuple(pe))


def _engine_inputs(g: ConvGeometry, rng: np.random.Generator, dtype,
                   channels_first: bool = False) -> dict[str, tuple[np.ndarray, ...]]:
    """Random non-zero canonical inputs; ``channels_first``: views of NCX-ordered memory."""
    x, w, dy = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in (g.x_shape, g.w_shape, g.y_shape))
    x, w, dy = (a.astype(dtype) for a in (x, w, dy))
    if channels_first:
        x, dy = (np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -1, 1)), 1, -1) for a in (x, dy))
    return {"forward": (x, w), "backward_data": (dy, w), "backward_weights": (x, dy)}


def test_fast_is_the_default(monkeypatch):
    monkeypatch.delenv("CONVGRAD_ENGINE", raising=False)
    assert default_engine_name() == "fast" and get_engine().name == "fast"


# -- every op, layout, rank, group count and dtype, through the API --------------------------------
OPS = ("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvolutionBackpropFilters",
       "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")


def _op_inputs(kind: str, g: ConvGeometry, fmt: str, rng: np.random.Generator, dtype: np.dtype):
    """Inputs of ``kind`` in spec order (NCX/NXC data; the caller's weights format)."""
    def data(shape):
        a = rng.standard_normal(shape).astype(dtype)
        return a if fmt == "NXC" else np.ascontiguousarray(np.moveaxis(a, -1, 1))
    x, y = data(g.x_shape), data(g.y_shape)
    w = rng.standard_normal(g.w_shape).astype(dtype)
    xs = np.array(x.shape, np.int32)
    return {"Convolution": (x, w), "ConvolutionBackwardData": (y, w, xs),
            "ConvolutionBackwardWeights": (x, y), "ConvolutionBackpropFilters": (x, y),
            "ConvTranspose": (y, w), "ConvTransposeBackwardData": (x, w),
            "ConvTransposeBackwardWeights": (y, x)}[kind], w


GRID = list(itertools.product(OPS, (1, 2, 3), ("NXC", "NCX"), (1, 3)))


@pytest.mark.parametrize("kind,rank,fmt,groups", GRID)
def test_ops_grid_against_reference(kind, rank, fmt, groups, rng, path, poisoned_empty):
    g = _geometry(2, groups, 2, 3, (6, 5, 4)[:rank], (3, 2, 2)[:rank], (2, 1, 2)[:rank], (1, 2, 1)[:rank],
                  (1, 0, 1)[:rank], (0, 1, 1)[:rank])
    transposed = kind.startswith("ConvTranspose")
    for dtype_name in ("f32", "bf16", "f16", "f64"):
        dtype = DATA_DTYPES[dtype_name]
        for wfmt in (("XOI", "IOX") if transposed else ("XIO", "OIX")):
            inputs, w_xio = _op_inputs(kind, g, fmt, rng, dtype)
            w = w_xio if wfmt[0] == "X" else np.ascontiguousarray(np.transpose(w_xio, (rank + 1, rank, *range(rank))))
            wkey = "filter_format" if kind == "ConvolutionBackpropFilters" else "weights_format"
            attrs = dict(strides=list(g.strides), dilations=list(g.dilations), pads_begin=list(g.pads_begin),
                         pads_end=list(g.pads_end), groups=groups, data_format=fmt, **{wkey: wfmt})
            if kind in ("ConvolutionBackwardWeights", "ConvTransposeBackwardWeights"):
                attrs["weights_shape"] = list(w.shape)
            if kind == "ConvolutionBackpropFilters":
                attrs["filter_shape"] = list(w.shape)
            if transposed:
                attrs["output_padding"] = [(i + b + e - (k - 1) * d - 1) % s for i, b, e, k, d, s in
                                           zip(g.in_size, g.pads_begin, g.pads_end, g.kernel, g.dilations, g.strides)]
            inputs = tuple(w if a is w_xio else a for a in inputs)
            op = cg.Op(kind, **attrs)
            got, want = op(*inputs, engine="fast"), op(*inputs, engine="reference")
            assert got.dtype == want.dtype == dtype
            _close(got, want, _tolerance(dtype), f"{kind} {dtype_name} {fmt}/{wfmt} ({path})")


# -- hypothesis: awkward geometries on the engine directly ---------------------------------------
@st.composite
def geometries(draw) -> ConvGeometry:
    rank = draw(st.integers(1, 3))
    axis = st.tuples(st.integers(1, 9 if rank < 3 else 5), st.integers(1, 4), st.integers(1, 4),
                     st.integers(1, 3), st.integers(0, 3), st.integers(0, 3))
    axes = [draw(axis) for _ in range(rank)]
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "multiplier"]))
    groups = 1 if kind == "dense" else draw(st.integers(2, 9))
    icg = 1 if kind in ("depthwise", "multiplier") else draw(st.integers(1, 7))
    ocg = 1 if kind == "depthwise" else draw(st.integers(1 if kind != "multiplier" else 2, 7))
    g = _geometry(draw(st.integers(0, 3)), groups, icg, ocg, *zip(*axes))
    assume(g is not None)
    return g


#: Examples of the random-geometry test: each new kernel shape compiles kernel variants (130 s of
#: a cold suite at 100 on a Zen 3, 39 s at 40), so the default suite draws 25 (the strategies'
#: edges are the awkward geometries' below); ``make test-all`` 100, ``make fuzz``'s
#: ``CONVGRAD_FUZZ_EXAMPLES`` that many.
RANDOM_GEOMETRIES = examples(25, 100)


@settings(max_examples=RANDOM_GEOMETRIES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=geometries(), dtype=st.sampled_from([np.float64, np.float32]), channels_first=st.booleans(),
       path=st.sampled_from(PATHS))
def test_random_geometries_against_reference(g, dtype, channels_first, path):
    inputs = _engine_inputs(g, np.random.default_rng(), dtype, channels_first)
    with forced_strategy(path), poisoned_allocations():
        for task in TASKS:
            got, want = getattr(FAST, task)(g, *inputs[task]), getattr(REF, task)(g, *inputs[task])
            assert got.dtype == np.dtype(dtype)
            _close(got, want, _tolerance(np.dtype(dtype)), f"{task} {g} ({path})")


#: Geometries that stress the strategies' edge handling, each run on every strategy.
AWKWARD = [
    # kernel larger than the input, reached only through padding
    dict(n=2, groups=1, icg=3, ocg=2, in_size=(2, 3), kernel=(5, 4), strides=(1, 1), dilations=(1, 1),
         pb=(2, 1), pe=(2, 2)),
    # stride larger than the kernel: input positions no window touches
    dict(n=2, groups=2, icg=2, ocg=3, in_size=(11,), kernel=(2,), strides=(5,), dilations=(1,), pb=(0,), pe=(1,)),
    # output size 1 on every axis, 3-D
    dict(n=1, groups=1, icg=5, ocg=3, in_size=(3, 3, 3), kernel=(3, 3, 3), strides=(2, 2, 2),
         dilations=(1, 1, 1), pb=(0, 0, 0), pe=(0, 0, 0)),
    # many groups of odd width, stride and dilation at once
    dict(n=3, groups=12, icg=3, ocg=5, in_size=(9, 7), kernel=(3, 2), strides=(2, 3), dilations=(2, 1),
         pb=(1, 0), pe=(0, 2)),
    # wide channels: one offset per GEMM on views
    dict(n=2, groups=1, icg=80, ocg=70, in_size=(6, 5), kernel=(3, 3), strides=(1, 2), dilations=(1, 1),
         pb=(1, 1), pe=(1, 1)),
    # wide channels; axis 2 with dilation = stride: its odd input positions are in no phase;
    # axis 1 with dilation 2, stride 3: a phase whose only offset has a shift (its first rows get
    # nothing)
    dict(n=2, groups=1, icg=66, ocg=64, in_size=(11, 6), kernel=(3, 3), strides=(3, 2), dilations=(2, 2),
         pb=(0, 1), pe=(1, 0)),
    # grouped inputs of 32-63 channels: backward weights on one tap per GEMM
    dict(n=2, groups=2, icg=40, ocg=6, in_size=(7, 6), kernel=(3, 2), strides=(1, 2), dilations=(2, 1),
         pb=(1, 0), pe=(1, 1)),
    # narrow outputs from wide inputs (the data gradient of a 3-channel first layer): spread GEMMs
    dict(n=2, groups=1, icg=3, ocg=64, in_size=(9, 8), kernel=(3, 3), strides=(2, 1), dilations=(1, 2),
         pb=(1, 2), pe=(1, 0)),
    dict(n=2, groups=2, icg=2, ocg=65, in_size=(7,), kernel=(4,), strides=(3,), dilations=(1,), pb=(2,), pe=(0,)),
    # 1x1 stride 1 without padding: the input is its own frame (no copies)
    dict(n=2, groups=1, icg=65, ocg=9, in_size=(4, 5), kernel=(1, 1), strides=(1, 1), dilations=(1, 1),
         pb=(0, 0), pe=(0, 0)),
    # the same with enough positions per image: NCX data runs as one GEMM per image
    dict(n=3, groups=1, icg=7, ocg=66, in_size=(12, 11), kernel=(1, 1), strides=(1, 1), dilations=(1, 1),
         pb=(0, 0), pe=(0, 0)),
    # empty batch
    dict(n=0, groups=2, icg=3, ocg=2, in_size=(5,), kernel=(3,), strides=(1,), dilations=(1,), pb=(1,), pe=(1,)),
]


def _awkward_cases() -> list:
    """(path, channels_first, dtype, case) of :func:`test_awkward_geometries`: every geometry on
    every strategy in both dtypes and both layouts, the (dtype, layout) pairs taken pairwise in
    the default suite (conftest.py: each geometry, strategy, dtype and layout is a kernel variant
    of its own to compile): f64 in one layout and f32 in the other, which one alternating from
    geometry to geometry and strategy to strategy, so that every geometry and strategy meets
    both dtypes and both layouts, and every dtype both layouts; the other two ``exhaustive``."""
    cases = []
    for j, path in enumerate(PATHS):
        for channels_first in (False, True):
            for dtype in (np.float64, np.float32):
                for i, case in enumerate(AWKWARD):
                    default = (dtype is np.float64) == (channels_first == bool((i + j) % 2))
                    cases.append(pytest.param(path, channels_first, dtype, case,
                                              id=f"{path}-{channels_first}-{dtype.__name__}-case{i}",
                                              marks=() if default else pytest.mark.exhaustive))
    return cases


@pytest.mark.parametrize("path, channels_first, dtype, case", _awkward_cases())
def test_awkward_geometries(path, channels_first, dtype, case, rng, poisoned_empty):
    g = _geometry(**case)
    inputs = _engine_inputs(g, rng, dtype, channels_first)
    with forced_strategy(path):
        for task in TASKS:
            _close(getattr(FAST, task)(g, *inputs[task]), getattr(REF, task)(g, *inputs[task]),
                   _tolerance(np.dtype(dtype)), task)


#: Stride-1 geometries for both loop nests of ``direct``: (n, groups, icg, ocg, in_size, kernel,
#: strides, dilations, pads begin, pads end).
STRIDE_1 = [
    (1, 1, 4, 4, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),          # the tiny call of benchmarks/overhead.py
    (2, 1, 3, 5, (7, 6), (3, 2), (1, 1), (2, 1), (2, 0), (1, 3)),          # dilation, uneven pads
    (2, 3, 2, 3, (5, 4), (2, 3), (1, 1), (1, 1), (3, -1), (-1, 2)),        # groups; negative pads (crops)
    (1, 1, 2, 3, (2, 3), (5, 4), (1, 1), (1, 1), (2, 1), (2, 2)),          # kernel larger than the input
    (3, 1, 5, 2, (9,), (3,), (1,), (3,), (3,), (3,)),                       # 1-D
    (1, 2, 3, 2, (4, 3, 5), (2, 3, 2), (1, 1, 1), (1, 2, 1), (1, 2, 0), (0, 1, 1)),  # 3-D
    (1, 1, 17, 19, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),        # channels past one vector
    # input positions no output reads (a transposed convolution's output_padding: its output is x)
    ConvGeometry(2, 1, 3, 2, (8,), (5,), (2,), (1,), (3,), (1,), (1,)),
    ConvGeometry(1, 2, 4, 2, (7, 6), (4, 4), (2, 3), (1, 1), (2, 1), (0, 1), (1, 0)),
]


@pytest.mark.parametrize("loops", ["general", "flat"])
@pytest.mark.parametrize("case", STRIDE_1)
@pytest.mark.parametrize("dtype_name", ["f64", "f32", "bf16", "f16"])
@pytest.mark.parametrize("channels_first", [False, True])
def test_direct_loops_on_stride_1_geometries(loops, case, dtype_name, channels_first, rng, poisoned_empty):
    """``direct``'s general and flat loops (forced) against the reference, each direction, every
    data dtype (16-bit data widened as it is read), either memory order; the flat loops' memory
    within the strategy's estimate."""
    import tracemalloc
    g, dtype = case if isinstance(case, ConvGeometry) else _geometry(*case), DATA_DTYPES[dtype_name]
    inputs = _engine_inputs(g, rng, dtype, channels_first)
    with forced_plan(Plan.of("direct", loops=loops)):
        for task in TASKS:
            want = getattr(REF, task)(g, *[a.astype(np.float64) for a in inputs[task]])
            _close(getattr(FAST, task)(g, *inputs[task]), want, _tolerance(np.dtype(np.float32 if dtype_name in
                   ("bf16", "f16") else dtype)), f"{task} {loops}")
            workspace.clear()
            tracemalloc.start()
            result = getattr(FAST, task)(g, *inputs[task])
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak - result.nbytes <= FAST.workspace_bytes(g, task, np.dtype(dtype)) + MUTATION_SLACK


@pytest.mark.parametrize("strategy", ["frame", "output_rows"])
@pytest.mark.parametrize("dtype_name", ["f64", "f16", "bf16"])
def test_batch_chunks_and_row_blocks(dtype_name, monkeypatch, rng, strategy, poisoned_empty):
    """Several batch chunks and row blocks give the same result as one (bf16/f16: sums rounded
    chunk by chunk)."""
    for (groups, icg, ocg), channels_first in itertools.product(((1, 4, 6), (5, 1, 1), (1, 70, 3), (1, 3, 70)), (False, True)):
        g = _geometry(3, groups, icg, ocg, (20, 19), (3, 3), (2, 1), (1, 2), (1, 2), (2, 1))
        inputs = _engine_inputs(g, rng, DATA_DTYPES[dtype_name], channels_first)
        for task in TASKS:
            with forced_plan(Plan.of("gemm", variant=strategy, chunk_bytes=1, block_bytes=1)):
                got = getattr(FAST, task)(g, *inputs[task])
            _close(got, getattr(REF, task)(g, *inputs[task]), _tolerance(DATA_DTYPES[dtype_name]), task)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("channels_first", [False, True])
def test_narrow_weights_gather_taps_over_blocks_of_output_rows(channels_first, dtype_name, groups, monkeypatch,
                                                               rng, poisoned_empty):
    """The frame's weights gradient for narrow inputs gathers the taps of blocks of output rows
    (256 here, on images of 400 outputs): blocks inside an image at an offset and blocks across
    images (NCX: dy copied channel-major; NXC f32: one matrix; bf16: widened first)."""
    from convgrad.engines import fast
    blocks = []
    gather = fast.columns.gather_phases
    monkeypatch.setattr(fast.columns, "gather_phases", lambda *a: blocks.append((a[2], a[1].shape[-1])) or gather(*a))
    g = _geometry(3, groups, 3, 5, (22, 21), (3, 2), (1, 1), (1, 1), (0, 0), (0, 0))
    assert g.out_size == (20, 20) and fast.kernels.taps_per_gemm(6, 3, reduces=True) > 1
    x, dy = _engine_inputs(g, rng, DATA_DTYPES[dtype_name], channels_first)["backward_weights"]
    with forced_plan(Plan.of("gemm", variant="frame", block_bytes=1)):
        got = FAST.backward_weights(g, x, dy)
    _close(got, REF.backward_weights(g, x, dy), _tolerance(DATA_DTYPES[dtype_name]))
    assert sorted(set(blocks)) == [(0, 256), (256, 256), (512, 256), (768, 256), (1024, 176)]


@pytest.mark.parametrize("images,pad,blocks", [(3, 1, [0, 256, 512, 768, 1024]), (1, 0, [0, 256])])
@pytest.mark.parametrize("strides", [(1, 1), (2, 1)])
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("channels_first", [False, True])
def test_first_layer_data_gradient_scatters_blocks_of_output_rows(channels_first, dtype_name, strides, images, pad,
                                                                   blocks, monkeypatch, rng, poisoned_empty):
    """Backward data into 3 channels from 32 scatters the products of blocks of dy's rows (256
    here, on images of 400 outputs) into zeroed phase buffers: blocks inside and across images,
    one phase or several, and dx itself as the buffer (one NCX image, stride 1, no padding)."""
    from convgrad.engines import fast
    seen = []
    scatter = fast.columns.scatter_phases
    monkeypatch.setattr(fast.columns, "scatter_phases", lambda *a: seen.append(a[2]) or scatter(*a))
    size = (19 * strides[0] + 3 - 2 * pad, 22 - 2 * pad)
    g = _geometry(images, 1, 3, fast.TUNING.scatter_channels[1], size, (3, 3), strides, (1, 1), (pad, pad), (pad, pad))
    assert g.out_size == (20, 20)
    dy, w = _engine_inputs(g, rng, DATA_DTYPES[dtype_name], channels_first)["backward_data"]
    with forced_plan(Plan.of("gemm", variant="frame", block_bytes=1)):
        got = FAST.backward_data(g, dy, w)
    _close(got, REF.backward_data(g, dy, w), _tolerance(DATA_DTYPES[dtype_name]))
    assert sorted(set(seen)) == blocks


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("case,dtype,channels_first", [
    ((4, 1, 16, 24, (30, 30), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)), np.float32, False),
    ((4, 1, 3, 70, (30, 30), (5, 5), (2, 2), (1, 1), (2, 2), (2, 2)), np.float32, True),
    ((3, 4, 8, 8, (12, 12), (3, 3), (1, 1), (2, 2), (0, 0), (0, 0)), np.float16, False),
    ((5, 1, 64, 64, (9, 9), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), np.float32, True),
    ((5, 1, 64, 64, (12, 12), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)), np.float32, True),
])
def test_workspace_estimate_bounds_the_allocations(task, case, dtype, channels_first, rng, path):
    import tracemalloc
    g = _geometry(*case)
    inputs = _engine_inputs(g, rng, dtype, channels_first)
    getattr(FAST, task)(g, *inputs[task])  # compiles what numba compiles, outside the measurement
    workspace.clear()                      # a cold call: every block it takes is new
    tracemalloc.start()
    result = getattr(FAST, task)(g, *inputs[task])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak - result.nbytes <= FAST.workspace_bytes(g, task, np.dtype(dtype)) + MUTATION_SLACK


@pytest.mark.parametrize("case,data,weights", [
    ((16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), True, True),   # wide 3x3
    ((16, 1, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), False, True),   # 64 channels
    ((16, 1, 32, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), True, True),    # narrow dx: no spread
    ((16, 1, 16, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), False, False),  # 16 input channels
    ((16, 1, 3, 64, (224, 224), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2)), False, False),  # 3 input channels
    ((16, 1, 512, 256, (28, 28), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)), False, False),  # one tap
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), True, True),   # dilated: junk
])
def test_output_rows_take_junk_heavy_and_wide_gradients(case, data, weights):
    from convgrad.engines.fast import gemm_variant
    g = _geometry(*case)
    for task, want in (("backward_data", data), ("backward_weights", weights)):
        assert (gemm_variant(Features.of(g, task, np.float32, False)) == "output_rows") == want


@pytest.mark.parametrize("case,junk", [
    ((1, 1, 256, 512, (11, 11, 10), (3, 3, 3), (1, 1, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)), True),  # 3d_unet:conv_8: 1.87
    ((2, 1, 256, 512, (15,), (3,), (1,), (5,), (6,), (6,)), False),                                 # conv1d_gemm:4: 1.80
])
def test_junk_heavy_data_gradients_leave_jit_from_the_tuned_ratio(case, junk):
    """An f32 NXC data gradient (no PyTorch) whose frame is ``TUNING.junk_ratio`` times its output
    runs on the output-row GEMMs (3-D U-Net's unpadded conv_8 at 1.87: half jit's time), one just
    under it on ``jit``."""
    from convgrad.engines.fast import default_plan
    f = Features.of(_geometry(*case), "backward_data", np.float32, False, False)
    assert f.junk_heavy() == junk
    plan = default_plan(f)
    assert (plan.strategy, plan.param("variant")) == (("gemm", "output_rows") if junk else ("jit", None))


@pytest.mark.parametrize("case,blocks", [
    ((16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), 1),  # f32 weights < dx + dy
    ((16, 1, 512, 512, (14, 14), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)), 3),  # res5: 9 MiB on 4 MiB
])
def test_output_rows_widen_16_bit_weights_in_blocks_within_dx_and_dy(case, blocks):
    from convgrad.engines.fast import output_rows
    g = _geometry(*case)
    f32 = np.dtype(np.float32)
    assert output_rows._blocks(g, f32, f32, 9) == [(0, 9)]
    for dtype, total in itertools.product((np.float16, cg.dtypes.bfloat16), (9, g.ocg)):
        got = output_rows._blocks(g, np.dtype(dtype), f32, total)
        assert len(got) == blocks and got[0][0] == 0 and got[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        widest = max(last - first for first, last in got) * math.prod(g.w_shape) // total
        assert widest * 4 <= (math.prod(g.x_shape) + math.prod(g.y_shape)) * 2


@pytest.mark.parametrize("oix_rows", [0, 10**9])
def test_output_rows_weights_of_ncx_data_in_either_order(oix_rows, monkeypatch, rng, poisoned_empty):
    """Backward weights on NCX data: columns taps-outer (an XIO dw) or, up to ``oix_rows`` rows per
    output channel, taps-inner (dw in OIX memory order, what NCX users ask for): same values."""
    import dataclasses

    from convgrad import layout
    from convgrad.engines.fast import output_rows
    monkeypatch.setenv("CONVGRAD_STRATEGY", "output_rows")
    monkeypatch.setattr(output_rows, "TUNING", dataclasses.replace(output_rows.TUNING, oix_rows=oix_rows))
    for groups, icg, ocg in ((1, 5, 7), (3, 2, 4)):
        g = _geometry(2, groups, icg, ocg, (6, 7), (3, 2), (2, 1), (1, 2), (1, 0), (1, 1))
        x, dy = _engine_inputs(g, rng, np.float32, channels_first=True)["backward_weights"]
        got = FAST.backward_weights(g, x, dy)
        assert layout.weights_from_canonical(got, "OIX").flags.c_contiguous == bool(oix_rows)
        _close(got, REF.backward_weights(g, x, dy), 2e-5)


@pytest.mark.parametrize("dtype_name", ["f16", "bf16"])
@pytest.mark.parametrize("oix", [False, True])
def test_output_rows_with_weights_in_blocks(dtype_name, oix, monkeypatch, rng, poisoned_empty):
    """Backward data of weights far larger than dx and dy (a 3x3 kernel on a 5x4 input, 40
    channels): XIO weights one tap per block, each scattered in turn; OIX weights in blocks of
    output channels, summed in Z: as the reference."""
    from convgrad import layout
    from convgrad.engines.fast import output_rows
    monkeypatch.setenv("CONVGRAD_STRATEGY", "output_rows")
    dtype = DATA_DTYPES[dtype_name]
    g = _geometry(2, 1, 40, 36, (5, 4), (3, 3), (1, 2), (1, 1), (1, 0), (0, 1))
    assert len(output_rows._blocks(g, dtype, np.dtype(np.float32), 9)) == 9
    dy, w = _engine_inputs(g, rng, dtype)["backward_data"]
    if oix:
        w = layout.weights_to_canonical(np.ascontiguousarray(layout.weights_from_canonical(w, "OIX")), "OIX")
        assert output_rows._oix(w)
    got = FAST.backward_data(g, dy, w, out_dtype=dtype)
    assert got.dtype == dtype
    _close(got, REF.backward_data(g, dy, w), _tolerance(dtype))


@pytest.mark.parametrize("task", TASKS[1:])
def test_output_rows_of_one_large_volume_stay_within_twice_the_arrays(task, monkeypatch, rng):
    """A single 3-D volume whose im2col is 27x its input runs in chunks of output rows: the
    extra memory stays below 2x (inputs + output), as at any minibatch."""
    import tracemalloc
    monkeypatch.setenv("CONVGRAD_STRATEGY", "output_rows")
    g = _geometry(1, 1, 64, 64, (32, 12, 12), (3, 3, 3), (1, 1, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2))
    inputs = _engine_inputs(g, rng, np.float32)[task]
    io_bytes = sum(a.nbytes for a in inputs) + 4 * math.prod(g.x_shape if task == "backward_data" else g.w_shape)
    tracemalloc.start()
    result = getattr(FAST, task)(g, *inputs)
    peak = tracemalloc.get_traced_memory()[1] - result.nbytes
    tracemalloc.stop()
    assert peak <= min(2 * io_bytes, FAST.workspace_bytes(g, task, np.dtype(np.float32))) + MUTATION_SLACK
    _close(result, getattr(REF, task)(g, *inputs), 2e-5, task)


# -- BLAS accumulation (C += A @ B on NumPy's own BLAS) ------------------------------------------------
def _matrix(rng: np.random.Generator, rows: int, cols: int, dtype, row_major: bool) -> np.ndarray:
    """A random (rows, cols) view with a leading dimension larger than needed, either order."""
    if row_major:
        return rng.standard_normal((rows, cols + 3)).astype(dtype)[:, :cols]
    return rng.standard_normal((cols, rows + 2)).astype(dtype)[:, :rows].T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_addmm_accumulates_like_matmul_in_every_order(dtype, rng):
    from convgrad.engines.fast import blas
    if not blas.available(dtype):
        pytest.skip("NumPy's BLAS exposes no ILP64 cblas GEMM here (the engine falls back to matmul)")
    for c_row, a_row, b_row in itertools.product((True, False), repeat=3):
        c, a, b = _matrix(rng, 7, 5, dtype, c_row), _matrix(rng, 7, 4, dtype, a_row), _matrix(rng, 4, 5, dtype, b_row)
        before, a_copy, b_copy = c.copy(), a.copy(), b.copy()
        assert blas.addmm(c, a, b)
        _close(c, before + a_copy @ b_copy, _tolerance(np.dtype(dtype)), f"{c_row} {a_row} {b_row}")
        assert blas.addmm(c, a, b, beta=0.0)
        _close(c, a_copy @ b_copy, _tolerance(np.dtype(dtype)))
        assert np.array_equal(a, a_copy) and np.array_equal(b, b_copy)


def test_addmm_refuses_what_blas_cannot_take(rng):
    from convgrad.engines.fast import blas
    c, a, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (6, 4), (4, 5)))
    before = c.copy()
    refused = [
        (c.astype(np.float16), a.astype(np.float16), b.astype(np.float16)),  # no half GEMM
        (c, a.astype(np.float64), b),                                        # mixed dtypes
        (c, np.repeat(a, 2, axis=1)[:, ::2], b),                             # columns 2 apart
        (c, c[:, :4], b[:, :5]),                                             # c overlaps a
        (c, a[:, :1], b[:1]),                                                # K = 1: ambiguous strides
    ]
    for args in refused:
        assert not blas.addmm(*args)
    assert np.array_equal(c, before)


@pytest.mark.parametrize("channels_first", [False, True])
def test_frame_path_without_blas_accumulation(monkeypatch, channels_first, rng, poisoned_empty):
    """The NumPy fallback (matmul into scratch, then +=) gives the reference results too."""
    from convgrad.engines.fast import blas
    monkeypatch.setattr(blas, "addmm", lambda *a, **k: False)
    channels = ((1, 70, 66), (2, 5, 3), (1, 3, 64))
    for (groups, icg, ocg), variant in itertools.product(channels, ("frame", "output_rows")):
        g = _geometry(2, groups, icg, ocg, (7, 6), (3, 3), (2, 1), (1, 1), (1, 1), (1, 0))
        inputs = _engine_inputs(g, rng, np.float64, channels_first)
        with forced_strategy(variant):
            for task in TASKS:
                _close(getattr(FAST, task)(g, *inputs[task]), getattr(REF, task)(g, *inputs[task]), 1e-10, task)


@pytest.mark.parametrize("strides", [(1, 1), (2, 3)])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights"])
def test_pointwise_low_precision_blocks(kind, dtype, strides, monkeypatch, rng, poisoned_empty):
    """bf16/f16 1x1 layers, converted block by block (256-row blocks, the last one short; with
    strides, runs of whole images, and dx zero where no output reads)."""
    from convgrad.engines.fast import pointwise
    calls = []
    for name in ("product", "weights_gradient"):
        original = getattr(pointwise, name)
        monkeypatch.setattr(pointwise, name, lambda *a, _f=original: calls.append(_f) or _f(*a))
    g = _geometry(3, 1, 5, 7, (40, 37), (1, 1), strides, (1, 1), (0, 0), (0, 0))  # 240+ rows per image
    inputs, w = _op_inputs(kind, g, "NXC", rng, DATA_DTYPES[dtype])
    extra = {"weights_shape": list(w.shape)} if kind == "ConvolutionBackwardWeights" else {}
    op = cg.Op(kind, strides=list(strides), dilations=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], data_format="NXC",
               weights_format="XIO", **extra)
    with forced_plan(Plan.of("gemm", variant="pointwise", block_bytes=1)):
        got = op(*inputs, engine="fast")
    want = op(*inputs, engine="reference")
    assert len(calls) == 1 and got.dtype == want.dtype == DATA_DTYPES[dtype]
    _close(got, want, _tolerance(DATA_DTYPES[dtype]), f"{kind} {dtype}")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.data())
def test_frame_planning_in_closed_form_matches_its_tables(rank, data):
    """What the memory estimate asks of a frame (phase count, largest shift) is a closed form, equal
    to what the per-offset tables built at run time give; and a frame of a 10^12-tap kernel is
    planned at once (issue 14)."""
    from convgrad.engines.fast import Frame
    ints = lambda lo, hi: data.draw(st.lists(st.integers(lo, hi), min_size=rank, max_size=rank))  # noqa: E731
    kernel, dilations, strides, in_size = ints(1, 5), ints(1, 4), ints(1, 6), ints(1, 30)
    g = _geometry(data.draw(st.integers(1, 3)), 1, 1, 1, in_size, kernel, strides, dilations, [1] * rank, [0] * rank)
    assume(g is not None)
    frame = Frame.of(g, data.draw(st.booleans()), data.draw(st.booleans()))
    assert frame.phase_count == len(frame.phases)
    for n in (1, 2, 5):
        assert frame.max_shift(n) == max(shift for _, shift in frame.taps(n))
    huge = _geometry(1, 1, 1, 1, (10**6, 10**6), (10**6, 10**6), (1, 1), (1, 1), (0, 0), (0, 0))
    frame = Frame.of(huge)
    assert frame.phase_count == 1 and frame.max_shift(1) == (10**6 - 1) * 10**6 + 10**6 - 1
    assert get_engine("fast").workspace_bytes(huge, "backward_weights", np.dtype(np.float32)) > 10**12


@pytest.mark.parametrize("per_gemm", [1, 2])
def test_accumulate_over_live_rows_in_small_blocks(per_gemm, monkeypatch, rng):
    """``kernels.accumulate`` with ``live`` source rows, in blocks of 4 rows: blocks where the
    first taps read no live row but later ones do (the sum must go on past them), against NumPy."""
    from dataclasses import replace

    from convgrad.engines.fast import kernels
    monkeypatch.setattr(kernels, "TUNING", replace(kernels.TUNING, min_block_rows=4))
    taps, rows, ci, co = [(0, 0), (0, 5), (0, 10)], 30, 3, 4
    src = np.zeros((40, ci), np.float32)
    src[20:30] = rng.uniform(0.25, 1.0, (10, ci)) * rng.choice([-1.0, 1.0], (10, ci))
    weights = rng.uniform(0.25, 1.0, (3, 1, ci, co)).astype(np.float32)
    out = np.full((rows, co), np.nan, np.float32)
    kernels.accumulate(out, [src], taps, weights, per_gemm, block_bytes=1, live=(20, 30))
    want = sum(src[off:off + rows].astype(np.float64) @ weights[t, 0] for t, (_, off) in enumerate(taps))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, acc", [("f64", 8), ("f32", 4), ("bf16", 4), ("f16", 4)])
def test_result_dtype_and_the_empty_batch_workspace(dtype, acc):
    """The fast engine's results are in its accumulation dtype (f64 for f64 data, else f32); a
    batch of 0 needs only the zero weights gradient in it (+ 4 KiB)."""
    assert FAST.result_dtype(DATA_DTYPES[dtype]) == np.dtype(np.float64 if acc == 8 else np.float32)
    g = ConvGeometry(0, 1, 3, 5, (4, 4), (2, 2), (3, 3), (1, 1), (1, 1), (0, 0), (0, 0))
    assert FAST.workspace_bytes(g, "backward_weights", DATA_DTYPES[dtype]) == 5 * 3 * 3 * 3 * acc + 4096


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)])
def test_finite_reads_every_value_whatever_the_alignment(dtype):
    """``direct.finite`` of f32/bf16/f16 reads exponent bits 64 at a time: a NaN or +-Inf at any
    position (first and last words, values before the first aligned word, the tail) is seen, in
    C- and F-ordered arrays; the largest finite values are finite (a sum of them overflows)."""
    from convgrad.engines.fast import direct
    rng = np.random.default_rng()
    base = rng.standard_normal(40).astype(dtype)
    for start in range(4):
        for n in (0, 1, 3, 4, 5, 9, 17, 33):
            view = base[start:start + n]
            assert direct.finite(view)
            for pos in range(n):
                for bad in (np.nan, np.inf, -np.inf):
                    spoiled = base.copy()
                    spoiled[start + pos] = bad
                    assert not direct.finite(spoiled[start:start + n]), (start, n, pos, bad)
    top = np.full((3, 5, 7), ml_dtypes.finfo(dtype).max, dtype)
    assert direct.finite(top) and direct.finite(np.asfortranarray(top))
    m = np.asfortranarray(rng.standard_normal((6, 7)).astype(dtype))
    m[4, 2] = np.nan
    assert not direct.finite(m) and not direct.finite(m[:, ::2]) and direct.finite(m[:, 3:])


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)])
def test_finite_scans_large_arrays_in_parallel_parts(dtype):
    """``direct.finite`` of an array past two parts of ``_SCAN_WORDS`` words scans the parts in
    the pool: a NaN or +-Inf in the first, a middle, the last (short) part or the tail after the
    last whole word is seen; the finite array is finite (in the pool and off it)."""
    from convgrad.engines.fast import direct, pool
    words = direct._SCAN_WORDS
    per = 8 // dtype.itemsize
    size = (3 * words + 123) * per + 1                   # a short last part and a value past the words
    base = np.random.default_rng().standard_normal(size).astype(dtype)
    assert pool.run(direct.finite, base) and direct.finite(base)
    for pos in (0, words * per - 1, words * per, 2 * words * per + 17, 3 * words * per + 5, size - 1):
        for bad in (np.nan, np.inf, -np.inf):
            spoiled = base.copy()
            spoiled[pos] = bad
            assert not pool.run(direct.finite, spoiled), (pos, bad)


def test_nonfinite_padding_check_reads_the_smaller_array_first(monkeypatch):
    """``jit._nonfinite``: both arrays must hold a NaN/Inf for padding to matter; the smaller one
    is read first and, finite, settles it (the result of a large layer is never read)."""
    from convgrad.engines.fast import direct, jit
    read = []
    real = direct.finite
    monkeypatch.setattr(direct, "finite", lambda a: read.append(a.size) or real(a))
    big, small = np.ones(1000, np.float32), np.ones(10, np.float32)
    assert not jit._nonfinite(big, small) and read == [10]
    read.clear()
    small[3] = np.inf
    assert not jit._nonfinite(big, small) and read == [10, 1000]
    big[999] = np.nan
    assert jit._nonfinite(small, big)


@pytest.mark.parametrize("dtype, channels", [(np.float32, 5), (np.uint16, 5), (np.uint16, 6)])
@pytest.mark.parametrize("lo, size", [((0, 1, 1), (1, 8, 9)), ((0, 0, 0), (1, 6, 7)), ((0, 2, 3), (1, 7, 8)),
                                      ((0, 0, 0), (1, 4, 5)), ((0, 1, 4), (1, 9, 5)), ((0, 0, 9), (1, 6, 9))])
def test_padded_copies_runs_of_positions_and_zeroes_the_rest(dtype, channels, lo, size):
    """``geometry.padded``: ``a`` at offsets ``lo`` in a zeroed array of ``size`` (cropped where
    it does not fit: a run of positions per row is copied at once; 16-bit values of an even
    channel count two at a time), the slack after it zero."""
    from convgrad.engines.fast import geometry
    rng = np.random.default_rng()
    a = (rng.random((2, 6, 7, channels)) * 1000 + 1).astype(dtype)     # (N, X1, X2, C): 2-D data
    out = geometry.padded(a, lo, size, np.dtype(dtype), 7)
    want = np.zeros((2, *size, channels), dtype)
    s1, s2 = min(6, size[1] - lo[1]), min(7, size[2] - lo[2])
    if s1 > 0 and s2 > 0:
        want[:, 0, lo[1]:lo[1] + s1, lo[2]:lo[2] + s2] = a[:, :s1, :s2]
    assert np.array_equal(out, want)
    assert not geometry.flat(out)[out.size:].any()
