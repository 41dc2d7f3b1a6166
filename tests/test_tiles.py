"""The ``amx_bf16`` family (AMX tiles, engines/fast/tiles.py) on every machine.

- The tile blocks against a NumPy model of TDPBF16PS as a Sapphire Rapids computes it (fitted to
  every lane of 2,400 measured tile products, tests/data/amx_tdpbf16ps.npz: the even and the odd
  products summed apart, in order, each sum rounded, then added to the accumulator; denormals
  flushed), followed by the vector kernel's steps past the last 16, bit for bit: natively where
  the host has AMX (and may use it), and through the stand-in (the emulated twin) everywhere;
- their assembly for ``sapphirerapids`` (compiled in a subprocess): the tile loop's loads and
  products, nothing spilled there;
- our GEMM and the jit drivers on the family (the stand-in where the host lacks AMX) against
  float64 and the reference engine; the family's choice, its error where the OS refuses the tiles.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

import convgrad as cg
from convgrad.engines import get_engine
from convgrad.engines.fast import blis, isa, jit, microkernel, tiles
from convgrad.engines.fast.features import Features
from convgrad.engines.fast.plan import Plan
from convgrad.problem import ConvGeometry

from test_kernels import _assembly, _bf16_case, _block_mask, _dot_step, _f32, _special_bits

BF16 = cg.dtypes.DATA_DTYPES["bf16"]
NATIVE_TILES = isa.tiles_permitted()
#: The AMX tiles where the host has them, and their stand-in everywhere.
MODES = [pytest.param(microkernel.TILES, id="native", marks=pytest.mark.skipif(not NATIVE_TILES, reason="no AMX")),
         pytest.param(microkernel.TILES_STANDIN, id="standin")]
#: The stand-in's compiled variants cost seconds each (10-35 s for a driver): the default suite
#: runs one tile block of each driver and shape class, ``make test-all`` the rest (and a host
#: with AMX every block natively).
EXHAUSTIVE = pytest.mark.exhaustive


def _blocks() -> list:
    return [pytest.param(mode, r, v, id=f"{r}x{v}-{'native' if mode == microkernel.TILES else 'standin'}",
                         marks=([pytest.mark.skipif(not NATIVE_TILES, reason="no AMX")] if mode == microkernel.TILES
                                else [] if (r, v) in ((32, 2), (16, 1)) else [EXHAUSTIVE]))
            for mode in (microkernel.TILES, microkernel.TILES_STANDIN) for r, v in tiles.TILE_BLOCKS]


_TINY = 2.0 ** -126


def _flushed(x: np.ndarray) -> np.ndarray:
    """``x`` (exact, float64) rounded to f32 (RNE) and, below 2^-126, a zero of its sign (as float64)."""
    with np.errstate(all="ignore"):
        r = np.asarray(x, np.float64).astype(np.float32).astype(np.float64)
    return np.where(np.abs(r) < _TINY, np.copysign(0.0, r), r)


def _daz(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < _TINY, np.copysign(0.0, x), x)


def _tdpbf16ps(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One TDPBF16PS step of a row as a Sapphire Rapids computes it (engines/fast/tiles.py):
    ``a`` its 16 pairs (16, 2), ``b`` (16, lanes, 2); the even and the odd products summed in
    order of k from -0, each sum rounded (and flushed), their sum rounded, added to the
    accumulator, rounded; denormal inputs as zeros."""
    a, b = _daz(a.astype(np.float64)), _daz(b.astype(np.float64))
    halves = []
    with np.errstate(all="ignore"):
        for h in (0, 1):
            s = np.full(b.shape[1], -0.0)
            for k in range(a.shape[0]):
                s = _flushed(s + a[k, h] * b[k, :, h])          # products of bf16: exact in float64
            halves.append(s)
    return _flushed(_daz(acc.astype(np.float64)) + _flushed(halves[0] + halves[1])).astype(np.float32)


def _tile_model(p: dict, rows: int, vecs: int, tiles_sdm: bool = False) -> np.ndarray:
    """c after one call of a tile block: with ``astep`` 2 and ``k`` >= 16, per tap its first
    ``k16`` steps on tiles, 16 at a time (:func:`_tdpbf16ps`; ``tiles_sdm``: the SDM's
    pseudo-code instead, each product added in turn, even first), then per tap the rest on the
    vector kernel (odd first); else every step on the vector kernel."""
    vw = vecs * 16
    c32 = p["c"].copy()
    a, b = _f32(p["a"]), _f32(p["b"])
    k = p["k"]
    k16 = k - k % 16 if p["astep"] == 2 and k >= 16 and p["ntaps"] > 0 else 0
    for r in range(rows):
        at = p["coff"] + r * p["ldc"]
        acc = c32[at:at + vw].copy()
        for t in range(p["ntaps"]):
            for j in range(0, k16, 16):
                ai = p["aoff"] + p["ta"][t] + r * p["lda"] + j * 2
                pairs = np.stack([b[p["boff"] + p["tb"][t] + i * p["bstep"]:][:2 * vw].reshape(vw, 2)
                                  for i in range(j, j + 16)])
                if tiles_sdm:
                    for i in range(16):
                        for half in (0, 1):
                            acc = _dot_step(acc, a[ai + 2 * i + half], pairs[i, :, half])
                else:
                    acc = _tdpbf16ps(acc, a[ai:ai + 32].reshape(16, 2), pairs)
        for t in range(p["ntaps"]):
            for i in range(k16, k):
                ai = p["aoff"] + p["ta"][t] + r * p["lda"] + i * p["astep"]
                pairs = b[p["boff"] + p["tb"][t] + i * p["bstep"]:][:2 * vw].reshape(vw, 2)
                for half in (1, 0):
                    acc = _dot_step(acc, a[ai + half], pairs[:, half])
        c32[at:at + vw] = acc
    return c32


MEASURED = Path(__file__).parent / "data" / "amx_tdpbf16ps.npz"


def test_the_model_and_the_standin_are_what_a_sapphire_rapids_computes():
    """Measured on a Sapphire Rapids (2026-11-28, native ``tiles`` of a 16x1 block, one tile
    step a call; tests/data/amx_tdpbf16ps.npz, made by benchmarks/tile_cases.py): for
    every lane of every case (random normals; one, two and sixteen pairs; wide exponents;
    denormal operands and accumulators; signed zeros) the NumPy model and the stand-in give the
    hardware's bits; VDPBF16PS on the same CPU gives the dot's model (test_kernels.py) bits."""
    data = np.load(MEASURED)
    names = sorted({key.rsplit("_", 1)[0] for key in data.files})
    z = np.zeros(1, np.int64)
    standin = microkernel.kernel_call(16, 16, 1, microkernel.TILES_STANDIN)
    for name in names:
        a, b, c, measured = (data[f"{name}_{part}"] for part in ("a", "b", "c", "tiles"))
        af, bf = _f32(a).reshape(*a.shape[:2], 16, 2), _f32(b).reshape(b.shape[0], 16, 16, 2)
        for i in range(a.shape[0]):
            model = np.stack([_tdpbf16ps(c[i, r], af[i, r], bf[i]) for r in range(16)])
            np.testing.assert_array_equal(model.view(np.uint32), measured[i].view(np.uint32), err_msg=f"{name} {i}")
            got = c[i].copy()
            standin(got.reshape(-1), 0, 16, np.ascontiguousarray(a[i]).reshape(-1), 0, 32, 2,
                    np.ascontiguousarray(b[i]).reshape(-1), 0, 32, z, z, 1, 16, 1)
            np.testing.assert_array_equal(got.view(np.uint32), measured[i].view(np.uint32), err_msg=f"{name} {i}")
        dot = microkernel.kernel_call(16, 16, 1, False)
        got = c[0].copy()
        dot(got.reshape(-1), 0, 16, np.ascontiguousarray(a[0]).reshape(-1), 0, 32, 2,
            np.ascontiguousarray(b[0]).reshape(-1), 0, 32, z, z, 1, 16, 1)
        np.testing.assert_array_equal(got.view(np.uint32), data[f"{name}_dot"][0].view(np.uint32))
    assert not np.array_equal(data["normal_tiles"], data["normal_dot"])    # the two instructions differ


@pytest.mark.parametrize("mode, rows, vecs", _blocks())
def test_tile_blocks_are_the_instructions_order_bit_exact(rows, vecs, mode, rng):
    """Each tile block, bit for bit the model: 37 steps (two tile steps and a tail of 5 on the
    vector kernel), 16 (tiles alone), 11 (the vector kernel alone), and a transposed A (``astep``
    not 2: the vector kernel); the tiles' sums are not the SDM's (its model differs)."""
    call = microkernel.kernel_call(16, rows, vecs, mode)
    for k, astep in ((37, 2), (16, 2), (11, 2), (18, 3)):
        p = _bf16_case(rng, 16, rows, vecs, k=k)
        p["astep"] = astep
        got = p["c"].copy()
        call(got, *list(p.values())[1:])
        np.testing.assert_array_equal(got, _tile_model(p, rows, vecs), err_msg=f"k={k} astep={astep}")
        if k == 37:
            assert not np.array_equal(got, _tile_model(p, rows, vecs, tiles_sdm=True))


@pytest.mark.parametrize("mode", MODES)
def test_tiles_flush_denormals_as_the_dot_does(mode, rng):
    """Operands near the bottom of the range (denormal inputs, products that underflow): the
    tiles give the model's flushed sums bit for bit, accumulate=0 ignores c (NaN here) and
    nothing outside the block is written."""
    rows, vecs, k = 16, 1, 32
    p = _bf16_case(rng, 16, rows, vecs, k=k)
    p["a"], p["b"] = _special_bits(rng, p["a"].size), _special_bits(rng, p["b"].size)
    p["c"] = np.where(rng.random(p["c"].size) < 0.3, np.float32(1e-39), p["c"]).astype(np.float32)
    call = microkernel.kernel_call(16, rows, vecs, mode)
    got = p["c"].copy()
    call(got, *list(p.values())[1:])
    np.testing.assert_array_equal(got, _tile_model(p, rows, vecs))
    poisoned = np.full_like(p["c"], np.nan)
    call(poisoned, *list(p.values())[1:], 0)
    zero = dict(p, c=np.zeros_like(p["c"]))
    block = _block_mask(p, rows, 16)
    np.testing.assert_array_equal(poisoned[block], _tile_model(zero, rows, vecs)[block])
    assert np.isnan(poisoned[~block]).all()


@pytest.mark.parametrize("mode", MODES)
def test_tile_rounded_stores(mode, rng):
    """A uint16 ``c`` on a tile block: the f32 sums (tiles, then the vector steps) rounded once
    to bf16, nothing outside the block written."""
    from convgrad import casts
    rows, vecs = 16, 1
    p = _bf16_case(rng, 16, rows, vecs, k=21)
    call = microkernel.kernel_call(16, rows, vecs, mode)
    sums = np.zeros_like(p["c"])
    call(sums, *list(p.values())[1:], 0)
    bits = np.full(p["c"].shape, 0xABCD, np.uint16)
    call(bits, *list(p.values())[1:], 1)
    block = _block_mask(p, rows, vecs * 16)
    np.testing.assert_array_equal(bits[block], casts.from_f32(sums[block], BF16).view(np.uint16))
    assert (bits[~block] == 0xABCD).all()


def test_tile_blocks_assembly_for_sapphire_rapids():
    """Every tile block compiled for Sapphire Rapids: the inner loop loads R/16 + V tiles and
    multiplies R/16 x V of them (``tdpbf16ps``), no stack operand there; the configuration
    loaded once per call."""
    for rows, vecs in tiles.TILE_BLOCKS:
        asm = _assembly(microkernel.kernel_ir(16, rows, vecs, bf16=True, native=True, on_tiles=True), "sapphirerapids")
        lines = [line.strip() for line in asm.splitlines()]
        dots = [i for i, line in enumerate(lines) if line.startswith("tdpbf16ps")]
        assert len(dots) == rows // 16 * vecs, (rows, vecs)
        start = max(i for i in range(dots[0]) if lines[i].endswith(":"))
        end = next(i for i in range(dots[-1], len(lines)) if lines[i].startswith("j"))
        loop = lines[start:end + 1]
        assert sum(line.startswith("tileloadd") for line in loop) == rows // 16 + vecs, loop
        assert not [line for line in loop if "(%rsp)" in line], loop
        assert sum(line.startswith("ldtilecfg") for line in lines) == 1


def test_tile_block_choice():
    """Whole tiles of lanes where the channels allow: 48 channels on 16x3, 64 on 32x2, 20 on
    32x2 (two vectors), 3 on one vector."""
    assert microkernel.tile_block_for(48) == (16, 3)
    assert microkernel.tile_block_for(64) == (32, 2)
    assert microkernel.tile_block_for(20) == (32, 2)
    assert microkernel.tile_block_for(3) == (16, 1)


@pytest.fixture
def amx_family():
    before = isa.set_family("amx_bf16", allow_emulated=True)
    yield
    isa.set_family(before)


@pytest.mark.parametrize("m, k, n", [pytest.param(70, 64, 48, marks=EXHAUSTIVE), (33, 37, 96),
                                     pytest.param(1, 50, 32, marks=EXHAUSTIVE), pytest.param(64, 1000, 40, marks=EXHAUSTIVE)])
def test_gemm_on_tiles(m, k, n, amx_family):
    """Our GEMM on the family (AMX tiles, or their stand-in): close to float64 with A row-major
    (tiles), transposed (packed row-major per block), odd K (pairs padded) and a partial panel of
    rows; rounded results the f32 ones rounded once."""
    from convgrad import casts
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(s).astype(BF16) for s in ((m, k), (k, n)))
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert blis.blocks(m, k, n, 2).rows % 16 == 0
    for view in (a, np.ascontiguousarray(a.T).T):
        got = blis.gemm(view.view(np.uint16), b.view(np.uint16))
        np.testing.assert_allclose(got, want, atol=1e-5 * math.sqrt(k) * max(1.0, np.abs(want).max()), rtol=0)
    rounded = blis.gemm(a.view(np.uint16), b.view(np.uint16), rounded=True)
    f32 = np.ascontiguousarray(blis.gemm(a.view(np.uint16), b.view(np.uint16)))
    np.testing.assert_array_equal(rounded, casts.from_f32(f32, BF16).view(np.uint16))


@pytest.mark.parametrize("task, ic, oc, kernel", [("backward_data", 16, 40, (3, 3))] + [
    pytest.param(task, *shape, marks=EXHAUSTIVE)
    for task in ("forward", "backward_data", "backward_weights")
    for shape in ((64, 48, (3, 3)), (3, 20, (3, 3)), (40, 33, (1, 1)))])
def test_convolutions_on_tiles(task, ic, oc, kernel, amx_family, rng):
    """bf16 convolutions on the family's jit drivers (tile blocks for forward and backward
    data: 16 input channels on 16x1 tiles over 20 pairs of output channels, a tile step and a
    vector tail; 3 channels: the vector kernel) against the reference engine."""
    g = ConvGeometry(2, 1, ic, oc, (6, 9), tuple(s + 3 - k for s, k in zip((6, 9), kernel)), kernel,
                     (1, 1), (1, 1), (1, 1), (1, 1))
    data = {"forward": (g.x_shape, g.w_shape), "backward_data": (g.y_shape, g.w_shape),
            "backward_weights": (g.x_shape, g.y_shape)}[task]
    args = [rng.uniform(-1, 1, s).astype(BF16) for s in data]
    f = Features.of(g, task, np.dtype(BF16), False)
    params = jit.complete(f, {})
    if task != "backward_weights" and ic > 3 and not f.pointwise:
        assert jit._block_of(params["block"], True) in tiles.TILE_BLOCKS
    got = getattr(jit, task)(g, *args, Plan.of("jit", **params))
    want = getattr(get_engine("reference"), task)(g, *(x.astype(np.float64) for x in args))
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)


def test_family_needs_the_tile_state(monkeypatch):
    """With AMX's features but no tile state granted, the family is not supported and asking for
    it names the operating system's refusal; granted, it is the host's best."""
    features = frozenset({"avx512f", "avx512bf16", "amx-tile", "amx-bf16", "avx2", "fma"})
    monkeypatch.setattr(isa, "host_features", lambda: features)
    monkeypatch.setattr(isa, "tiles_permitted", lambda: False)
    assert isa.supported() == ["avx512_bf16", "avx512", "avx2", "portable"]
    with pytest.raises(isa.ISAError, match="did not grant this process the AMX tile state"):
        isa._check("amx_bf16", allow_emulated=False)
    monkeypatch.setattr(isa, "tiles_permitted", lambda: True)
    assert isa.supported()[0] == "amx_bf16"


@pytest.mark.parametrize("rounded", [False, pytest.param(True, marks=EXHAUSTIVE)])
def test_weights_gradient_by_taps_on_tiles(rounded, amx_family, rng):
    """A bf16 weights gradient of stride 1 (dilated, padded unevenly) on the family's default
    plan, one deep GEMM per tap: the reference engine's sums (a rounded result: their bf16
    rounding), within 2x the inputs and output of extra memory and its workspace bound."""
    import tracemalloc
    from convgrad import casts
    g = ConvGeometry(2, 1, 96, 96, (6, 7), (4, 5), (3, 2), (1, 1), (2, 3), (1, 0), (1, 2))
    x, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.y_shape))
    f = Features.of(g, "backward_weights", np.dtype(BF16), False)
    plan = Plan.of("jit", **jit.complete(f, {}))
    assert plan.param("split") == "taps" and jit.applies(f, plan)
    want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    f32 = jit.backward_weights(g, x, dy, plan)
    np.testing.assert_allclose(f32, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    tracemalloc.start()
    got = jit.backward_weights(g, x, dy, plan, rounded)
    peak = tracemalloc.get_traced_memory()[1] - got.nbytes
    tracemalloc.stop()
    assert peak <= min(2 * (x.nbytes + dy.nbytes + got.nbytes), jit.workspace_bytes(f, plan)), peak
    if rounded:
        np.testing.assert_array_equal(got.view(np.uint16), casts.from_f32(np.ascontiguousarray(f32), BF16).view(np.uint16))


def _geometry(n: int, ic: int, oc: int, size: tuple, kernel: tuple, strides: tuple, dilations: tuple, lo: tuple,
              hi: tuple) -> ConvGeometry:
    out = tuple((i + a + b - (k - 1) * d - 1) // s + 1 for i, k, s, d, a, b in zip(size, kernel, strides, dilations, lo, hi))
    return ConvGeometry(n, 1, ic, oc, size, out, kernel, strides, dilations, lo, hi)


@pytest.mark.parametrize("shares", [1, 2])
@pytest.mark.parametrize("g", [
    _geometry(2, 24, 64, (9, 11), (3, 3), (2, 2), (1, 1), (1, 1), (1, 0)),                  # phases
    pytest.param(_geometry(3, 20, 17, (6, 5, 7), (2, 3, 2), (2, 1, 3), (1, 2, 1), (1, 0, 1), (0, 1, 1)),  # 3-D
                 marks=[] if NATIVE_TILES else [EXHAUSTIVE]),     # the stand-in: a driver compiled per block
    pytest.param(_geometry(12, 40, 48, (7, 9), (1, 1), (2, 3), (1, 1), (0, 0), (0, 0)),                  # 1x1
                 marks=[] if NATIVE_TILES else [EXHAUSTIVE]),
], ids=["2-D stride 2", "3-D strides 2x1x3", "1x1 strides 2x3"])
@pytest.mark.parametrize("standin", [pytest.param(False, id="native", marks=pytest.mark.skipif(not NATIVE_TILES,
                                                                                                reason="no AMX")),
                                     pytest.param(True, id="standin")])
def test_tap_gemm_on_every_stride_and_split(g, shares, standin, monkeypatch, rng):
    """The weights gradient on tiles (engines/fast/tap_gemm.py) at strides (x's phases), 3-D,
    1x1, chunks of 32 positions (many chunks, a halo past each) shared by the threads (partial
    sums, each share transposing x's and pairing dy's chunks) or dw's blocks shared (x
    transposed, dy paired first): the reference engine's sums (f32 result), and a rounded result
    their bf16 rounding; on the tiles and on their stand-in (the emulated twin)."""
    from convgrad import casts
    from convgrad.engines.fast import TUNING, tap_gemm
    monkeypatch.setattr(tap_gemm, "TUNING", dataclasses.replace(TUNING, tap_gemm_l2=1e-9,
                                                                 tap_gemm_partials=1e9 if shares > 1 else 0.0))
    x, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.y_shape))
    want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    before = isa.set_family("amx_bf16", allow_emulated=True, standin=standin)
    try:
        assert isa.bf16_kernel() == (microkernel.TILES_STANDIN if standin else microkernel.TILES)
        f = Features.of(g, "backward_weights", np.dtype(BF16), False)
        q, groups = tap_gemm.phases(g)
        positions = g.n * math.prod(q)
        bl = tap_gemm.blocks(positions, g.ic, g.oc, math.prod(g.kernel), max(o for t in groups.values() for _, o in t))
        assert bl.kc == 32 and bl.chunks > 2 and bl.shares == (min(2, _threads()) if shares > 1 else 1)
        assert 1 < len(groups) <= math.prod(g.strides) or g.kernel == (1, 1)
        plan = Plan.of("jit", **jit.complete(f, {}))
        assert jit.applies(f, plan)
        f32 = jit.run(plan, g, x, dy, "backward_weights")
        rounded = jit.run(plan, g, x, dy, "backward_weights", rounded=True)
    finally:
        isa.set_family(before)
    np.testing.assert_allclose(f32, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    np.testing.assert_array_equal(np.asarray(rounded).view(np.uint16),
                                  casts.from_f32(np.ascontiguousarray(f32), BF16).view(np.uint16))


@pytest.mark.parametrize("g", [
    _geometry(2, 3, 40, (23, 21), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2)),             # conv1-like
    _geometry(1, 5, 24, (9, 13), (3, 5), (2, 2), (1, 2), (1, 1), (1, 2)),              # dilated last axis
], ids=["7x7 stride 2", "3x5 dilated"])
@pytest.mark.parametrize("standin", [pytest.param(False, id="native", marks=pytest.mark.skipif(not NATIVE_TILES,
                                                                                                reason="no AMX")),
                                     pytest.param(True, id="standin")])
def test_tap_gemm_folds_the_last_kernel_axis_of_few_channels(g, standin, rng):
    import tracemalloc
    """Few input channels: the weights gradient on tiles folds the last kernel axis into the
    channels (``tap_gemm.folded``: an im2col along that axis, then K2 x ICg channels): the
    reference engine's sums (f32), their bf16 rounding (rounded), within the plan's memory bound."""
    from convgrad import casts
    from convgrad.engines.fast import tap_gemm
    fg = tap_gemm.folded(g)
    assert fg is not None and fg.ic == g.ic * g.kernel[-1] and fg.kernel[-1] == 1
    x, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.y_shape))
    want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    before = isa.set_family("amx_bf16", allow_emulated=True, standin=standin)
    try:
        f = Features.of(g, "backward_weights", np.dtype(BF16), False)
        plan = Plan.of("jit", **jit.complete(f, {}))
        assert plan.param("split") == "taps"
        f32 = jit.run(plan, g, x, dy, "backward_weights")
        jit.run(plan, g, x, dy, "backward_weights", rounded=True)        # compiled outside the measure
        tracemalloc.start()
        rounded = jit.run(plan, g, x, dy, "backward_weights", rounded=True)
        peak = tracemalloc.get_traced_memory()[1] - rounded.nbytes
        tracemalloc.stop()
        bound = jit.workspace_bytes(f, plan)
    finally:
        isa.set_family(before)
    np.testing.assert_allclose(f32, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    np.testing.assert_array_equal(np.asarray(rounded).view(np.uint16),
                                  casts.from_f32(np.ascontiguousarray(f32), BF16).view(np.uint16))
    assert peak <= bound, (peak, bound)


@pytest.mark.parametrize("g", [
    _geometry(2, 3, 64, (23, 21), (7, 7), (2, 2), (1, 1), (3, 3), (2, 2)),      # conv1-like: an image a chunk
    _geometry(2, 3, 96, (11, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),      # one chunk
], ids=["7x7 stride 2", "3x3"])
@pytest.mark.parametrize("standin", [pytest.param(False, id="native", marks=pytest.mark.skipif(not NATIVE_TILES,
                                                                                                reason="no AMX")),
                                     pytest.param(True, id="standin")])
def test_bf16_data_gradient_of_few_channels_folds_the_last_kernel_axis(g, standin, rng):
    """Few input channels (dx's lanes): the data gradient on tiles runs the folded geometry (K2
    x ICg lanes) in chunks of images and sums its f32 dx along the last axis: the reference
    engine's sums (f32), their bf16 rounding once (rounded), within the plan's memory bound."""
    import tracemalloc

    from convgrad import casts
    w, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.w_shape, g.y_shape))
    want = get_engine("reference").backward_data(g, dy.astype(np.float64), w.astype(np.float64))
    before = isa.set_family("amx_bf16", allow_emulated=True, standin=standin)
    try:
        assert jit._folded_data(g, np.dtype(BF16)) is not None
        f = Features.of(g, "backward_data", np.dtype(BF16), False)
        plan = Plan.of("jit", **jit.complete(f, {}))
        f32 = jit.run(plan, g, dy, w, "backward_data")
        jit.run(plan, g, dy, w, "backward_data", rounded=True)        # compiled outside the measure
        tracemalloc.start()
        rounded = jit.run(plan, g, dy, w, "backward_data", rounded=True)
        peak = tracemalloc.get_traced_memory()[1] - rounded.nbytes
        tracemalloc.stop()
        bound = jit.workspace_bytes(f, plan)
    finally:
        isa.set_family(before)
    np.testing.assert_allclose(f32, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    np.testing.assert_array_equal(np.asarray(rounded).view(np.uint16),
                                  casts.from_f32(np.ascontiguousarray(f32), BF16).view(np.uint16))
    assert peak <= bound, (peak, bound)


def _threads() -> int:
    from convgrad.engines.fast import pool
    return pool.threads()


@pytest.mark.exhaustive
def test_weights_gradient_by_taps_falls_back_on_inf(amx_family, rng):
    """An Inf in x (which the per-tap GEMMs would multiply by the junk positions' zeros) runs the
    row split: Inf and NaN exactly where the reference engine has them."""
    g = ConvGeometry(2, 1, 96, 96, (6, 7), (4, 5), (3, 2), (1, 1), (2, 3), (1, 0), (1, 2))
    x, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.y_shape))
    plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_weights", np.dtype(BF16), False), {}))
    x[1, 2, 3, 5] = np.inf
    special = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
    assert np.isinf(special).any() and np.isfinite(special).any()
    got = np.asarray(jit.backward_weights(g, x, dy, plan), np.float64)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(special))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(special))


@pytest.mark.parametrize("shares", [1, 2])
@pytest.mark.parametrize("standin", [pytest.param(False, id="native", marks=pytest.mark.skipif(not NATIVE_TILES,
                                                                                                reason="no AMX")),
                                     pytest.param(True, id="standin")])
def test_tap_gemm_sees_whether_the_x_it_reads_is_finite(shares, standin, monkeypatch, rng):
    """``tap_gemm.run`` says whether the x values its grids read were finite, as its
    transposition saw them (both splits: chunks made before the kernels, or by each share): a
    NaN or +-Inf at the first position, in a channel past the 16-channel blocks, in the last
    chunk's tail, or in a column only junk positions read (dy's zeros past the outputs) is seen
    (not looked at without ``check``). Through ``jit.run`` the last, in no sum, gives the exact
    loops' finite dw."""
    from convgrad.engines.fast import TUNING, direct, tap_gemm
    monkeypatch.setattr(tap_gemm, "TUNING", dataclasses.replace(TUNING, tap_gemm_l2=1e-9,
                                                                 tap_gemm_partials=1e9 if shares > 1 else 0.0))
    g = _geometry(2, 20, 40, (9, 11), (3, 3), (2, 2), (1, 1), (1, 1), (1, 0))   # column 10: junk positions only
    x, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.y_shape))
    before = isa.set_family("amx_bf16", allow_emulated=True, standin=standin)
    try:
        assert tap_gemm.run(g, x, dy, False)[1] is True
        for where in ((0, 0, 0, 0), (0, 3, 4, 17), (1, 8, 9, 19), (1, 4, 10, 5)):
            for bad in (np.nan, np.inf, -np.inf):
                spoiled = x.copy()
                spoiled[where] = bad
                assert tap_gemm.run(g, spoiled, dy, False)[1] is False, (where, bad)
                assert tap_gemm.run(g, spoiled, dy, False, check=False)[1] is True     # not looked at
        plan = Plan.of("jit", **jit.complete(Features.of(g, "backward_weights", np.dtype(BF16), False), {}))
        assert plan.param("split") == "taps"
        got = jit.run(plan, g, spoiled, dy, "backward_weights")     # -Inf at column 10: in no sum
        want = direct.backward_weights(g, spoiled, dy, np.dtype(np.float32))
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    finally:
        isa.set_family(before)


def _tile_block_ir(rows: int, vecs: int, native: bool, rounding: bool) -> str:
    """LLVM IR text of one tile block (:func:`.tiles.emit`), its ``c`` f32 or (``rounding``) bf16 bits."""
    from llvmlite import ir

    module = ir.Module(name="tile_block")
    i16p, i64 = ir.IntType(16).as_pointer(), ir.IntType(64)
    c_type = i16p if rounding else ir.FloatType().as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [c_type, i16p, i16p, i64.as_pointer(), i64.as_pointer()]
                                             + [i64] * len(microkernel._INTS)), "kernel")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    ptrs = dict(zip(("c", "a", "b", "ta", "tb"), fn.args[:5]))
    ints = dict(zip((name for name, _ in microkernel._INTS), fn.args[5:]))
    tiles.emit(builder, rows, vecs, ptrs, ints, rounding, native, native, microkernel._emit,
               lambda b: microkernel._Ops(b, 16, True, False))
    builder.ret_void()
    return str(module)


@pytest.mark.parametrize("rounding", [False, True], ids=["f32", "rounded"])
@pytest.mark.parametrize("native", [False, True], ids=["standin", "native"])
def test_tile_blocks_zero_no_stack_aggregates(native, rounding):
    """The stand-in's tile buffer (8 KiB), a rounded block's f32 sums and the configuration read
    back (``sttilecfg``) are plain stack memory, written before they are read: numba's
    ``cgutils.alloca_once`` stores a zero aggregate, which LLVM splits into one store per element
    (2.4 s of a stand-in tile block's 2.6 s to optimise: every stand-in tile driver seconds
    slower to compile)."""
    import re

    text = _tile_block_ir(32, 2, native, rounding)
    assert "alloca [" in text                                    # the buffers are there ...
    assert not re.search(r"store \[\d+ x ", text)               # ... and never zeroed whole


def test_the_dot_standin_compiles_one_loop():
    """The bf16 dot stand-in (an exact model: f64-checked FMAs per lane pair) runs one loop, a
    step an iteration, not the instruction's two unrolled nests: its IR stays within a few times
    the instruction's (one loop: 2.5x; the two nests: 14x, 1.7 MB for a 14x2 block)."""
    native = microkernel.kernel_ir(16, 14, 2, bf16=True, native=True)
    standin = microkernel.kernel_ir(16, 14, 2, bf16=True, native=False)
    assert len(standin) < 4 * len(native)
