"""The fast engine's plans: Features, Plan (JSON), select (forced > cached > the tuning table's
rule), candidates, and every candidate plan of odd problems against the float64 reference engine,
with its strategy's memory bound checked against tracemalloc."""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad.dtypes import DATA_DTYPES
from convgrad.engines import get_engine
from convgrad.engines.fast import jit, workspace
from convgrad.engines.fast import (STRATEGIES, TUNING, Features, Plan, candidates, default_plan, forced_plan,
                                   forced_strategy, isa, plan_cache, select, strategy_module)
from convgrad.problem import ConvGeometry
from engine_support import MUTATION_SLACK, task_inputs
from engine_support import geometry as _geometry

FAST, REF = get_engine("fast"), get_engine("reference")
TASKS = ("forward", "backward_data", "backward_weights")
TOLERANCE = {"f64": 1e-10, "f32": 2e-5, "bf16": 2e-2, "f16": 2e-3}




def _close(got, want, tol: float, msg: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, msg
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))),
                               err_msg=msg)


# -- Plan and Features -------------------------------------------------------------------------------
def test_plan_json_round_trip_and_params():
    plan = Plan.of("jit", block="6x2", split="rows", cache_bytes=1 << 18)
    assert plan.params == (("block", "6x2"), ("cache_bytes", 1 << 18), ("split", "rows"))
    assert Plan.from_json(plan.to_json()) == plan and plan.param("block") == "6x2" and plan.param("x", 3) == 3
    assert Plan.from_json({"strategy": "direct"}) == Plan("direct")
    assert Plan.from_json({"strategy": "gemm", "params": {"variant": "frame", "blas": True}}).param("blas") is True


@pytest.mark.parametrize("bad", [
    {"strategy": "im2col"}, {"strategy": 3}, {}, [], "jit", {"strategy": "jit", "params": []},
    {"strategy": "jit", "params": {"block": 1.5}}, {"strategy": "jit", "params": {"block": None}},
    {"strategy": "jit", "extra": 1},
])
def test_malformed_plans_are_value_errors(bad):
    with pytest.raises(ValueError):
        Plan.from_json(bad)


def test_plan_params_must_be_sorted_pairs():
    with pytest.raises(ValueError):
        Plan("jit", (("split", "rows"), ("block", "6x2")))
    with pytest.raises(ValueError):
        Plan("jit", (("block", "6x2"), ("block", "8x1")))
    for params in ((["block", "6x2"],), (("block", "6x2", "x"),), ("block",)):  # pairs are 2-tuples
        with pytest.raises(ValueError, match="expected sorted \\(name, value\\) pairs"):
            Plan("jit", params)


def test_features_of_a_problem():
    g = _geometry(3, 2, 5, 7, (9, 8), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1))
    f = Features.of(g, "backward_data", cg.dtypes.bfloat16, True)
    assert f.geometry == g and f.dtype == "bfloat16" and f.acc == np.float32 and f.taps == 6
    assert f.flops == 2 * g.n * g.oc * g.icg * 6 * math.prod(g.out_size) and f.channels_first
    assert f.family == isa.family() and f.result_shape == g.x_shape
    key = f.key()
    assert "family" not in key and "task=backward_data" in key and "kernel=3x2" in key and "channels_first=true" in key
    assert Features.of(g, "backward_data", cg.dtypes.bfloat16, False).key() != key
    assert Features.of(g, "backward_weights", cg.dtypes.bfloat16, True).key() != key
    with pytest.raises(ValueError, match="task"):
        Features.of(g, "sideways", np.float32, False)


# -- select ----------------------------------------------------------------------------------------
@pytest.fixture
def avx2():
    if "avx2" not in isa.supported():
        pytest.skip("the jit rule is measured on AVX2")
    before = isa.set_family("avx2")
    yield
    isa.set_family(before)


@pytest.mark.parametrize("case,task,dtype,channels_first,want", [
    ((16, 32, 1, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "forward", np.float32, False,
     "direct loops=depthwise"),
    ((2, 1, 3, 4, (5, 5), (3, 3)), "forward", np.float32, False, "direct loops=flat"),
    ((2, 1, 3, 4, (5, 5), (3, 3), (2, 2)), "forward", np.float32, False, "direct loops=general"),
    ((1, 1, 4, 15, (6, 6), (3, 3)), "backward_weights", np.float32, False, "direct loops=flat"),
    ((1, 1, 4, 4, (6, 6), (3, 3), (1, 1), (8, 8), (8, 8), (8, 8)), "forward", np.float32, False, "direct loops=general"),
    ((1, 1, 4, 16, (6, 6), (3, 3)), "backward_weights", np.float32, False, "direct loops=general"),
    ((16, 1, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float32, False, "jit"),
    ((16, 1, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float64, False,
     "gemm variant=frame"),
    ((16, 1, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights", np.float64, False,
     "gemm variant=output_rows"),
    ((16, 1, 16, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights", np.float16, False,
     "gemm variant=frame"),
    ((16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float32, False,
     "jit"),                                                                       # NXC: one pool
    ((16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float32, True,
     "gemm variant=output_rows"),                                                  # NCX alone: the limits
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), "backward_data", np.float32, False,
     "gemm variant=output_rows"),
    ((16, 1, 64, 256, (56, 56), (1, 1)), "forward", cg.dtypes.bfloat16, False, "jit"),   # widened on our GEMM
    ((16, 1, 64, 256, (56, 56), (1, 1)), "forward", np.float32, True, "gemm variant=image_gemms"),
    ((16, 1, 64, 256, (56, 56), (1, 1)), "forward", np.float32, False, "jit"),       # 1x1 f32 NXC: our GEMM
    ((16, 1, 256, 64, (56, 56), (1, 1)), "backward_data", np.float32, False, "jit"),
    ((16, 1, 256, 64, (56, 56), (1, 1)), "backward_weights", np.float32, False, "jit"),
    ((16, 1, 256, 64, (56, 56), (1, 1)), "backward_weights", np.float32, True, "gemm variant=image_gemms"),  # NCX alone
    ((16, 1, 64, 256, (56, 56), (1, 1)), "backward_data", np.float32, "shared", "jit"),   # NCX beside PyTorch
    ((16, 1, 64, 256, (56, 56), (1, 1)), "backward_weights", np.float32, "shared", "jit"),
    ((16, 1, 3, 64, (230, 230), (7, 7), (2, 2)), "backward_weights", np.float32, False,
     "jit block=6x2"),                                   # conv1: 7 taps of 21 rows (the last kernel axis folded)
    ((16, 1, 3, 32, (230, 230), (7, 7), (2, 2)), "backward_weights", np.float32, False, "jit block=6x2"),
    ((16, 1, 3, 64, (230, 230), (7, 7), (2, 2), (1, 2)), "backward_weights", np.float32, False,
     "jit block=4x3"),                                   # not folded (dilated): one row of 4 idle (1.5 FMAs a kept one)
    ((16, 1, 3, 32, (230, 230), (7, 7), (2, 2), (1, 2)), "backward_weights", np.float32, False,
     "gemm variant=frame"),                              # 32 lanes on 4x3: 2.25 FMAs a kept one
])
def test_the_tuning_tables_rule(case, task, dtype, channels_first, want, avx2):
    """The rule on AVX2 (``channels_first`` "shared": NCX data beside PyTorch's threads)."""
    f = Features.of(_geometry(*case), task, dtype, bool(channels_first), shared=channels_first == "shared")
    plan = default_plan(f)
    assert select(f) == plan and str(plan).startswith(want.split(" ")[0])
    assert all(item in str(plan).split(" ") for item in want.split(" ")[1:]), plan
    assert candidates(f)[0] == plan


@pytest.mark.parametrize("halved", [False, True])
def test_narrow_weights_gradients_by_the_datapath(halved, monkeypatch) -> None:
    """A weights gradient of fewer input rows than backward data's minimum runs on ``jit`` where
    its block's idle rows are within ``TUNING.jit_narrow_idle`` for the vectors' width and the
    datapath: on full-width 512-bit vectors whatever the idle rows (Zen 5: jit 0.3-0.86x the frame
    GEMMs' time), on halved ones (Zen 4) up to 1.75 FMAs per one kept."""
    monkeypatch.setattr(isa, "halved_vectors", lambda: halved)
    before = isa.set_family("avx512", allow_emulated=True)
    try:
        for case, idle_ok in (((16, 1, 3, 64, (230, 230), (7, 7), (2, 2)), True),
                              ((16, 1, 3, 48, (230, 230), (5, 5), (2, 2), (1, 2)), False),
                              ((16, 1, 3, 32, (112, 112), (3, 3), (1, 1), (2, 2)), False)):
            f = Features.of(_geometry(*case), "backward_weights", np.float32, False, shared=True)
            assert (strategy_module("jit").idle(f) <= 1.75) == idle_ok
            assert default_plan(f).strategy == ("jit" if idle_ok or not halved else "gemm"), case
    finally:
        isa.set_family(before)


def test_a_weights_split_by_rows_past_the_memory_bound_splits_by_blocks() -> None:
    """A weights gradient whose partial dw per thread (split by rows) would take more than
    ``TUNING.junk_memory`` times its inputs and output splits dw's blocks instead (one dw, within
    it: dilated_conv:24); a split asked for is kept."""
    jit = strategy_module("jit")
    f = Features.of(_geometry(16, 2, 96, 64, (11, 11), (3, 3), (1, 1), (4, 4), (1, 1), (3, 3)), "backward_weights",
                    np.float32, False, shared=True)
    on_rows = Plan.of("jit", **jit.complete(f, {"split": "rows"}))
    assert jit.workspace_bytes(f, on_rows) > TUNING.junk_memory * f.io_bytes
    on_blocks = Plan.of("jit", **jit.complete(f, {}))
    assert on_blocks.param("split") == "blocks" and jit.workspace_bytes(f, on_blocks) <= TUNING.junk_memory * f.io_bytes
    small = Features.of(_geometry(16, 1, 64, 128, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights",
                        np.float32, False)
    assert jit.complete(small, {})["split"] == "rows"          # partial sums well within the bound


@pytest.mark.parametrize("family", ["avx512", "avx512_bf16"])
@pytest.mark.parametrize("case,task,dtype,want", [
    ((16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float32, "jit"),
    ((16, 1, 64, 128, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights", np.float32, "jit"),
    ((16, 1, 64, 256, (56, 56), (1, 1)), "forward", np.float32, "jit"),
    ((16, 1, 64, 256, (56, 56), (1, 1)), "backward_weights", cg.dtypes.bfloat16, "jit"),
    ((16, 1, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights", cg.dtypes.bfloat16,
     {"avx512": "gemm", "avx512_bf16": "jit"}),                # bf16 pairs on the dot instruction, else
    ((16, 1, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_weights", np.float16,
     "gemm"),                                                  # f32 copies that would break the 2x bound
    ((16, 1, 4, 64, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float32, "gemm"),
    ((16, 1, 3, 64, (230, 230), (7, 7), (2, 2)), "backward_weights", np.float32, "jit"),   # 3x4, no idle row
    ((16, 1, 3, 48, (230, 230), (5, 5), (2, 2)), "backward_weights", np.float32, "jit"),   # folded: 15 rows
    ((16, 1, 3, 48, (230, 230), (5, 5), (2, 2), (1, 2)), "backward_weights", np.float32,
     {"avx512": "narrow", "avx512_bf16": "narrow"}),   # not folded: 7x3, 4 rows idle (by the datapath)
    ((16, 1, 2, 64, (28, 28), (3, 3)), "backward_weights", np.float32, "jit"),              # folded: 6 rows
    ((16, 1, 2, 64, (28, 28), (3, 3), (1, 1), (1, 2)), "backward_weights", np.float32, "gemm"),  # below 3 rows
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), "backward_data", np.float32, "jit"),
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), "backward_weights", np.float32,
     "jit"),                                                   # junk-heavy f32 beside PyTorch: one pool
    ((16, 2, 96, 64, (11, 11), (3, 3), (1, 1), (4, 4), (1, 1), (3, 3)), "backward_weights", np.float32,
     "jit"),                    # ... within 2x the inputs + output: dw split by blocks (dilated_conv:24)
    ((16, 2, 96, 64, (11, 11), (3, 3), (1, 1), (4, 4), (1, 1), (3, 3)), "backward_data", np.float32, "jit"),
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), "backward_data", cg.dtypes.bfloat16,
     {"avx512": "gemm", "avx512_bf16": "jit"}),                             # junk-heavy: jit on the dot product
    ((16, 1, 64, 128, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)), "backward_weights", cg.dtypes.bfloat16,
     {"avx512": "gemm", "avx512_bf16": "jit"}),     # pairs on the dot instruction, a few images at a time: within 2x
    ((16, 1, 64, 64, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data", np.float64, "gemm"),
])
def test_one_pool_rule_on_avx512(case, task, dtype, want, family):
    """On the AVX-512 families every f32-accumulating problem goes to our kernels (one pool),
    whatever its taps and channels, but for narrow inputs of a gradient (a weights gradient of 3
    to 7 rows where its block leaves no rows idle: input channels, times the kernel's width where
    ``jit.folds``), junk-heavy frames (but a data gradient of bf16 on
    the dot instruction, whose drivers skip rows of padding), a multi-tap 16-bit weights
    gradient (but bf16 pairs on the dot instruction) and f64. Beside PyTorch (``shared``), as
    here; a junk-heavy f32 gradient without it stays on the output-row GEMMs."""
    before = isa.set_family(family, allow_emulated=True)
    try:
        f = Features.of(_geometry(*case), task, dtype, False, shared=True)
        want = want[family] if isinstance(want, dict) else want
        if want == "narrow":     # a narrow weights gradient: jit on full-width 512-bit datapaths
            want = "gemm" if isa.halved_vectors() else "jit"
        assert default_plan(f).strategy == want
        if dtype == np.float32 and f.junk_heavy():
            on_jit = Plan.of("jit", **strategy_module("jit").complete(f, {}))
            fits = strategy_module("jit").workspace_bytes(f, on_jit) <= TUNING.junk_memory * f.io_bytes
            assert default_plan(f).strategy == ("jit" if fits else "gemm")
            alone = Features.of(_geometry(*case), task, dtype, False, shared=False)
            assert str(default_plan(alone)).startswith("gemm") and "variant=output_rows" in str(default_plan(alone))
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("family, want", [("avx512_bf16", "gemm"), ("amx_bf16", "jit")])
def test_a_narrow_bf16_data_gradient_runs_on_tiles(family, want):
    """ResNet-50's conv1 data gradient (3 input channels) in bf16: on AMX tiles the jit drivers
    (0.74x the frame GEMMs' time in sequence on a Xeon, benchmarks/TUNED-xeon-amx.md), elsewhere
    the narrow-input rule's GEMMs."""
    conv1 = _geometry(2, 1, 3, 64, (32, 32), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2))
    before = isa.set_family(family, allow_emulated=True)
    try:
        f = Features.of(conv1, "backward_data", cg.dtypes.bfloat16, False, shared=True)
        assert default_plan(f).strategy == want
        assert default_plan(Features.of(conv1, "backward_data", np.float32, False, shared=True)).strategy == "gemm"
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("family", ["avx512", "avx512_bf16"])
def test_without_pytorch_f32_ncx_keeps_the_channel_limits(family):
    """Without PyTorch's threads beside ours (``shared`` False), f32 wide layers of NCX data keep
    engine v3's limits (BLAS was faster there in sequence); NXC f32 and bf16 stay on our kernels
    (one pool: in sequence a call after a BLAS one ran up to 2x slower)."""
    wide = _geometry(16, 1, 256, 256, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    before = isa.set_family(family, allow_emulated=True)
    try:
        for dtype, ncx, shared, want in ((np.float32, True, False, "gemm"), (np.float32, True, True, "jit"),
                                         (np.float32, False, False, "jit"), (cg.dtypes.bfloat16, True, False, "jit")):
            f = Features.of(wide, "backward_data", dtype, ncx, shared=shared)
            assert default_plan(f).strategy == want, (dtype, ncx, shared)
            assert f.key() != Features.of(wide, "backward_data", dtype, ncx, shared=not shared).key()
    finally:
        isa.set_family(before)


def test_shared_follows_pytorch_being_loaded(monkeypatch):
    g = _geometry(1, 1, 8, 8, (5, 5), (3, 3))
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert Features.of(g, "forward", np.float32, False).shared
    monkeypatch.delitem(sys.modules, "torch")
    assert not Features.of(g, "forward", np.float32, False).shared


def test_forced_then_cached_then_default(monkeypatch):
    g = _geometry(4, 1, 8, 16, (12, 12), (3, 3), pb=(1, 1), pe=(1, 1))
    f = Features.of(g, "backward_data", np.float32, False)
    default = default_plan(f)
    cached = Plan.of("gemm", variant="output_rows", chunk_bytes=1 << 16)
    monkeypatch.setattr(plan_cache, "lookup", lambda features, tune=False: cached if features == f else None)
    assert select(f) == Plan.of("gemm", variant="output_rows", chunk_bytes=1 << 16, block_bytes=TUNING.block_bytes)
    with forced_strategy("direct"):
        assert select(f) == Plan.of("direct", loops="flat")
        with forced_plan(None):  # the innermost wins: no forcing
            assert select(f).param("variant") == "output_rows"
    monkeypatch.setenv("CONVGRAD_STRATEGY", "frame")
    assert select(f).param("variant") == "frame"
    monkeypatch.delenv("CONVGRAD_STRATEGY")
    # cached plans that no longer apply fall back to the rule
    for stale in (Plan.of("gemm", variant="pointwise"), Plan.of("jit", block="9x9"), Plan.of("gemm", chunk_bytes=0),
                  Plan.of("direct", loops="depthwise"), Plan.of("gemm", variant="bogus")):
        monkeypatch.setattr(plan_cache, "lookup", lambda features, tune=False, _p=stale: _p)
        assert select(f) == default, stale
    f64 = Features.of(g, "backward_data", np.float64, False)
    monkeypatch.setattr(plan_cache, "lookup", lambda features, tune=False: Plan.of("jit"))
    assert select(f64) == default_plan(f64) and select(f64).strategy != "jit"


def test_small_problems_the_rule_gives_to_gemm_run_direct() -> None:
    """Up to ``TUNING.direct_gemm_flops`` a problem the rule would give to ``gemm`` runs on the
    ``direct`` loops (the GEMM paths' fixed costs); past it on ``gemm``; ``jit``'s stay."""
    for n, dtype, want in ((64, cg.dtypes.bfloat16, "direct"), (64, np.float64, "direct"), (512, np.float64, "gemm")):
        g = _geometry(n, 1, 16, 16, (7, 1, 1), (5, 1, 1), (1, 1, 1), (5, 1, 1), (9, 0, 0), (9, 0, 0))  # dilated_conv:33's kind
        f = Features.of(g, "backward_weights", dtype, False, shared=True)
        assert f.flops > TUNING.direct_flops and (f.flops <= TUNING.direct_gemm_flops) == (want == "direct")
        assert default_plan(f).strategy == want, n
    f = Features.of(_geometry(1, 1, 64, 64, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)), "backward_data",
                    np.float32, False, shared=True)
    assert f.flops <= TUNING.direct_gemm_flops and default_plan(f).strategy == "jit"


def test_forcing_an_unknown_strategy_is_a_clear_error(monkeypatch):
    with pytest.raises(cg.ConvgradError, match="'im2col' is not a strategy of the fast engine"):
        with forced_strategy("im2col"):
            pass
    assert len(STRATEGIES) <= 4


def test_candidates_are_distinct_and_apply():
    for case in ((4, 1, 8, 16, (12, 12), (3, 3)), (2, 3, 1, 1, (9,), (3,)), (2, 1, 64, 64, (7, 7), (1, 1))):
        for task, dtype in itertools.product(TASKS, (np.float32, np.float64, cg.dtypes.bfloat16)):
            f = Features.of(_geometry(*case), task, dtype, False)
            plans = candidates(f)
            assert len(plans) == len(set(plans)) and plans[0] == default_plan(f)
            assert all(strategy_module(p.strategy).applies(f, p) for p in plans)
            assert {p.strategy for p in plans} >= {"gemm"}
            splits = {p.param("split") for p in plans if p.strategy == "jit"}  # the weights gradient has two
            weights = {"rows", "blocks"} | ({"taps"} if jit.taps_on_tiles(f) else set())  # AMX: one GEMM per tap
            assert not splits or splits == (weights if task == "backward_weights" else {"rows"}), (f, splits)


# -- every candidate plan against the reference ------------------------------------------------------
CASES = {
    "1-D grouped strided dilated": _geometry(2, 3, 3, 5, (11,), (3,), (2,), (2,), (2,), (1,)),
    "2-D tails": _geometry(2, 1, 5, 11, (7, 9), (3, 3), (1, 2), (1, 1), (1, 1), (1, 0)),
    "2-D kernel > input": _geometry(1, 2, 4, 3, (3, 4), (5, 4), (1, 1), (1, 1), (2, 2), (2, 1)),
    "3-D": _geometry(2, 1, 3, 9, (4, 5, 3), (2, 3, 2), (2, 1, 1), (1, 1, 2), (1, 0, 1), (0, 2, 1)),
    "1x1 strided": _geometry(2, 1, 6, 10, (5, 7), (1, 1), (2, 1)),
    "1x1": _geometry(3, 1, 9, 5, (12, 11), (1, 1)),
    "1x1 few positions": _geometry(3, 1, 40, 48, (3, 3), (1, 1)),      # NCX weights: one GEMM over the images
    "depthwise": _geometry(2, 6, 1, 1, (6, 7), (3, 3), (2, 1), (1, 2), (1, 1), (1, 1)),
    "dilated gradient": _geometry(3, 1, 8, 12, (11, 11), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("dtype_name", ["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("channels_first", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_candidate_against_reference(case, channels_first, dtype_name, rng):
    g, dtype = CASES[case], DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, channels_first)
    for task in TASKS:
        want = getattr(REF, task)(g, *inputs[task])
        plans = candidates(Features.of(g, task, dtype, channels_first))
        for plan in plans:
            with forced_plan(plan):
                got = getattr(FAST, task)(g, *inputs[task])
            _close(got, want, TOLERANCE[dtype_name], f"{case} {task} {dtype_name} {plan}")


@pytest.mark.parametrize("case", ["2-D tails", "3-D", "1x1", "1x1 few positions", "depthwise", "dilated gradient"])
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("channels_first", [False, True])
def test_every_candidates_memory_bound(case, dtype_name, channels_first, rng):
    """Each strategy's ``workspace_bytes`` bounds the peak of its allocations (the result excluded
    where it is in the accumulation dtype, included for bf16) for every candidate plan."""
    g, dtype = CASES[case], DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, channels_first)
    for task in TASKS:
        f = Features.of(g, task, dtype, channels_first)
        for plan in candidates(f):
            with forced_plan(plan):
                getattr(FAST, task)(g, *inputs[task])  # compiles outside the measurement
                workspace.clear()                     # a cold call: every block it takes is new
                tracemalloc.start()
                result = getattr(FAST, task)(g, *inputs[task])
                peak = tracemalloc.get_traced_memory()[1] - result.nbytes
                tracemalloc.stop()
            bound = strategy_module(plan.strategy).workspace_bytes(f, plan)
            assert peak <= bound + MUTATION_SLACK, f"{case} {task} {plan}: {peak} > {bound}"


@pytest.mark.parametrize("task", TASKS[1:])
@pytest.mark.parametrize("case", [
    (16, 1, 16, 16, (12, 1, 1), (5, 1, 1), (1, 1, 1), (5, 1, 1), (13, 0, 0), (13, 0, 0)),  # dilated_conv:34
    (16, 1, 16, 16, (7,), (5,), (1,), (4,), (9,), (9,)),                                  # dilated_conv:36, 1-D
    (2, 1, 64, 128, (11, 11), (3, 3), (1, 1), (2, 2), (1, 1), (1, 1)),                    # dilated_conv:21
    (16, 1, 96, 128, (11, 11), (3, 3), (1, 1), (4, 4), (2, 2), (2, 2)),                   # dilated_conv:22, mb 16
])
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
def test_dilated_gradients_stay_within_twice_the_arrays(case, task, dtype_name, rng):
    """The dilated gradients' default plans (GEMMs over output rows; a unit-stride bf16 data
    gradient on the dot instruction: jit, its padded dy in chunks of images) take at most 2x the
    op's inputs + output of extra memory in a cold call through the API, the rounding to the
    data's dtype included, small problems included."""
    g = _geometry(*case)
    inputs = task_inputs(g, rng, DATA_DTYPES[dtype_name], False)[task]
    op = cg.Op("ConvolutionBackwardData" if task == "backward_data" else "ConvolutionBackwardWeights",
               strides=list(g.strides), dilations=list(g.dilations), pads_begin=list(g.pads_begin),
               pads_end=list(g.pads_end), groups=g.groups, data_format="NXC", weights_format="XIO")
    shape = np.array(g.x_shape if task == "backward_data" else g.w_shape)
    op(*inputs, shape)
    workspace.clear()                     # a cold call: every block it takes is new
    tracemalloc.start()
    result = op(*inputs, shape)
    peak = tracemalloc.get_traced_memory()[1] - result.nbytes
    tracemalloc.stop()
    io_bytes = sum(a.nbytes for a in inputs) + result.nbytes
    assert peak <= 2 * io_bytes + MUTATION_SLACK, (default_plan(Features.of(g, task, inputs[0].dtype, False)),
                                                   peak / io_bytes)
    _close(result, getattr(REF, task)(g, *inputs), TOLERANCE[dtype_name], task)


@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("plan", [None, Plan.of("gemm", variant="frame")])
def test_first_layer_data_gradient_of_one_image_stays_within_twice_the_arrays(plan, dtype_name, rng):
    """ResNet-50's conv1 data gradient at mb 1 (3 input channels: the frame's narrow-output sums,
    one wide GEMM per block of dy's rows) takes at most 2x the op's inputs + output of extra
    memory, the API's rounding included (its block of rows was once 5.9x alone)."""
    g = _geometry(1, 1, 3, 64, (224, 224), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2))
    dy, w = task_inputs(g, rng, DATA_DTYPES[dtype_name], False)["backward_data"]
    op = cg.Op("ConvolutionBackwardData", strides=[2, 2], dilations=[1, 1], pads_begin=[3, 3], pads_end=[2, 2],
               data_format="NXC", weights_format="XIO")
    shape = np.array(g.x_shape)
    w = w.reshape(7, 7, 3, 64)
    with forced_plan(plan) if plan is not None else contextlib.nullcontext():
        op(dy, w, shape)
        tracemalloc.start()
        result = op(dy, w, shape)
        peak = tracemalloc.get_traced_memory()[1] - result.nbytes
        tracemalloc.stop()
    assert peak <= 2 * (dy.nbytes + w.nbytes + result.nbytes) + MUTATION_SLACK, peak
    _close(result, REF.backward_data(g, dy, w.reshape(g.w_shape)), TOLERANCE[dtype_name], dtype_name)


@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
@pytest.mark.parametrize("case", ["1-D grouped strided dilated", "2-D tails", "3-D", "larger"])
def test_general_loops_read_16_bit_data_in_place(case, dtype_name, rng):
    """``direct`` general loops on bf16/f16 data read its bits and widen each value as they read
    it: the f32 results equal, bit for bit, the loops run on the data widened first (the same
    sums in the same order), and no f32 copy of the data is made (f16 where the CPU converts
    halves; elsewhere the copy stays)."""
    g = CASES.get(case) or _geometry(2, 1, 16, 24, (20, 20), (3, 3), (1, 1), (2, 2), (2, 2), (2, 2))
    dtype = DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, False)
    plan = Plan.of("direct", loops="general")
    for task in TASKS:
        a, b = inputs[task]
        with forced_plan(plan):
            want = getattr(FAST, task)(g, a.astype(np.float32), b.astype(np.float32))
            getattr(FAST, task)(g, a, b)
            tracemalloc.start()
            got = getattr(FAST, task)(g, a, b)
            peak = tracemalloc.get_traced_memory()[1] - got.nbytes
            tracemalloc.stop()
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {task} {dtype_name}")
        data = a.nbytes + (b.nbytes if task == "backward_weights" else 0)
        if case == "larger" and (dtype_name == "bf16" or cg.casts.HARDWARE):   # an f32 copy: 2x the data
            assert peak < data, f"{task}: {peak} bytes, the data {data}"


@pytest.mark.parametrize("dtype_name", ["bf16", "f16"])
@pytest.mark.parametrize("case", ["1-D grouped strided dilated", "3-D", "dilated batch"])
def test_general_loops_round_data_results_image_by_image(case, dtype_name, rng):
    """With a result in the data's dtype allowed (what the API asks for), the ``direct`` general
    loops round each image of a forward or data-gradient result as its sums are done: bit for
    bit the whole f32 result rounded once (NaN, Inf, overflow and subnormal sums included), and
    f32 sums for one image at a time (the bf16 dilated data gradients took 2.0-2.3x their inputs
    and output in memory, the whole f32 result)."""
    g = CASES.get(case) or _geometry(20, 1, 4, 6, (8, 8), (3, 3), (2, 2), (3, 3), (1, 1), (1, 1))
    dtype = DATA_DTYPES[dtype_name]
    inputs = task_inputs(g, rng, dtype, False)
    info = ml_dtypes.finfo(dtype)
    big = float(info.max) if dtype_name == "f16" else 3e38
    for task in ("forward", "backward_data"):
        a, b = inputs[task]
        a = a.copy()
        a.reshape(-1)[:4] = [np.nan, np.inf, big, float(info.smallest_subnormal)]  # specials in the sums
        with forced_plan(Plan.of("direct", loops="general")):
            want = cg.casts.from_f32(getattr(FAST, task)(g, a, b), dtype)
            getattr(FAST, task)(g, a, b, out_dtype=dtype)
            tracemalloc.start()
            got = getattr(FAST, task)(g, a, b, out_dtype=dtype)
            peak = tracemalloc.get_traced_memory()[1] - got.nbytes
            tracemalloc.stop()
        assert got.dtype == dtype, task
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"{case} {task}")
        image = 4 * got.size // g.n
        if dtype_name == "bf16" or cg.casts.HARDWARE:   # f16 without half conversions: the f32 path
            assert peak <= image + b.nbytes * 2 + 8192, f"{task}: {peak} bytes, one image of sums {image}"


@pytest.mark.parametrize("dtype_name, family", [("bf16", None), ("bf16", "avx512_bf16"), ("f16", None)],
                         ids=["bf16", "bf16-dot-product-stand-in", "f16"])
def test_jit_drivers_round_16_bit_results_as_they_store(dtype_name, family, rng):
    """The ``jit`` forward and data-gradient drivers, asked for a result in the data's dtype (as
    the API asks), round each value once as they store it, f16 too (its data widened to f32):
    bit for bit the f32 result rounded afterwards (NaN, Inf, overflow and subnormal sums
    included), and no f32 result in memory (f16 3x3 data gradients took up to 2.6x their inputs
    and output)."""
    before = isa.set_family(family, allow_emulated=True, standin=family is not None)  # None: the host's
    try:
        _round_16_bit_results_as_stored(dtype_name, rng)
    finally:
        isa.set_family(before)


def _round_16_bit_results_as_stored(dtype_name: str, rng: np.random.Generator) -> None:
    g = _geometry(4, 1, 24, 40, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    dtype = DATA_DTYPES[dtype_name]
    info = ml_dtypes.finfo(dtype)
    inputs = task_inputs(g, rng, dtype, False)
    for task in ("forward", "backward_data"):
        a, b = inputs[task]
        a = a.copy()
        a.reshape(-1)[:4] = [np.nan, np.inf, float(info.max), float(info.smallest_subnormal)]
        peaks = []
        with forced_plan(Plan.of("jit", block="6x4", cache_bytes=1 << 20, split="rows")):
            for call in (lambda: getattr(FAST, task)(g, a, b),                       # f32, rounded afterwards
                         lambda: getattr(FAST, task)(g, a, b, out_dtype=dtype)):     # rounded as stored
                call()
                workspace.clear()
                tracemalloc.start()
                result = call()
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
                want, got = (cg.casts.from_f32(result, dtype), None) if len(peaks) == 1 else (want, result)
        assert got.dtype == dtype, task
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=task)
        if dtype_name == "bf16" or cg.casts.HARDWARE:   # the same temporaries, a 16-bit result instead of the f32 one
            assert peaks[1] <= peaks[0] - got.nbytes + 4096, f"{task}: {peaks}"
