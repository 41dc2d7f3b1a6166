"""Our GEMM (:mod:`convgrad.engines.fast.blis`) against NumPy/float64, and the pointwise layers
that run on it against the reference engine: shapes of 1, primes, sizes just past each block,
strided and transposed views (of A and of B), f32 and bf16 (the dot instruction where the host has it, and its
stand-in everywhere)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import ml_dtypes
import numba
import numpy as np
import pytest

from convgrad.engines import get_engine
from convgrad.engines.fast import blis, isa, jit, microkernel
from convgrad.engines.fast.pool import run as pool_run
from convgrad.engines.fast.tuning import TUNING
from convgrad.problem import ConvGeometry

BF16 = np.dtype(ml_dtypes.bfloat16)


def _sizes() -> list[tuple[int, int, int]]:
    b = blis.blocks(4096, 4096, 64, 4)
    return [(1, 1, 1), (1, 7, 1), (13, 1, 5), (7, 13, 17), (b.rows + 1, b.kc + 1, b.nr + 1),
            (b.mc + 1, 2 * b.kc + 3, 2 * b.nr - 1), (3 * b.rows - 1, b.kc - 1, 97), (61, 263, 31),
            (13, 3 * b.kc + 11, 7), (3, 97, 2), (b.rows + 3, 2 * b.kc + 1, b.nr + 5),   # deep: K split
            (2 * b.nr + 3, 4 * b.kc + 1, b.nr),                                     # ... and B in place
            (5, 70, 131), (3, b.kc + 5, 4 * b.nr + 3)]            # few rows: a B stored along K swapped


def _bf16_cases() -> list:
    """(m, k, n, standin) of the bf16 GEMM tests: every size on the dot instruction where the host
    has it, and on its stand-in; the stand-in's sizes other than those of :data:`STANDIN_SIZES`
    are ``exhaustive`` (conftest.py: every register block is a driver of its own to compile, about
    10 s, 20-30 s where LLVM splits the 16-wide code for an AVX2 host; the native runs on a host
    with the instruction cover every block, ``make test-all`` every size on the stand-in, and the
    stand-in's own exactness is tested bit for bit in test_kernels.py)."""
    sizes, native = _sizes(), isa.bf16_host()
    cases = [pytest.param(*size, False, id=f"{'-'.join(map(str, size))}-native",
                          marks=() if native else pytest.mark.skip(reason="no AVX512_BF16")) for size in sizes]
    return cases + [pytest.param(*size, True, id=f"{'-'.join(map(str, size))}-standin",
                                 marks=pytest.mark.exhaustive if i not in STANDIN_SIZES else ())
                    for i, size in enumerate(sizes)]


#: Indices in :func:`_sizes` of the stand-in's sizes in the default suite: a single
#: value, tails on every side, K split, B read in place, and A swapped with a B stored along K (on
#: the 16x1 and 14x2 register blocks).
STANDIN_SIZES = (0, 3, 8, 11, 12)


@pytest.mark.parametrize("m, k, n", _sizes())
def test_f32_gemm_against_float64(m, k, n):
    rng = np.random.default_rng()
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b
    tol = 1e-5 * math.sqrt(k) * max(1.0, np.abs(want).max())
    wide = np.zeros((m, k + 3), np.float32)
    wide[:, :k] = a                                                          # rows further apart than K
    for view, b_view in itertools.product((a, np.asfortranarray(a), np.ascontiguousarray(a.T).T, wide[:, :k]),
                                          (b, np.ascontiguousarray(b.T).T)):  # B also stored along K
        got = blis.gemm(view, b_view)
        assert got.shape == (m, n) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=tol, rtol=0)


@pytest.mark.parametrize("case", [3, 4, 5, 8, 13, 0])
def test_gemm_into_an_array_stores_there(case):
    """``into``: the result lands in the given array (returned), whatever ran: the kernels storing
    their tiles there (tails cut at its edges, one K step and several), or a copy of a split or
    swapped GEMM's result; f32, and bf16 pairs on the stand-in (rounded too) for tails in one K
    step and in several (each stand-in block a driver of its own to compile: ~10 s)."""
    m, k, n = _sizes()[case]
    rng = np.random.default_rng()
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    for dtype in (np.float32, BF16) if case in (3, 5) else (np.float32,):
        a_, b_ = a.astype(dtype), b.astype(dtype)
        want = a_.astype(np.float64) @ b_.astype(np.float64)
        into, rounded_into = np.full((m, n), np.nan, np.float32), np.full((m, n), 0xFFFF, np.uint16)
        before = isa.set_family("avx512_bf16", allow_emulated=True, standin=True) if dtype == BF16 else None
        try:
            bits = (lambda v: v.view(np.uint16)) if dtype == BF16 else (lambda v: v)
            got = blis.gemm(bits(a_), bits(b_), into=into)
            if dtype == BF16:                   # bf16 bits, each value rounded once
                assert blis.gemm(bits(a_), bits(b_), rounded=True, into=rounded_into) is rounded_into
                assert np.array_equal(rounded_into, into.astype(BF16).view(np.uint16))
        finally:
            if before is not None:
                isa.set_family(before)
        assert got is into
        np.testing.assert_allclose(into, want, atol=1e-5 * math.sqrt(k) * max(1.0, np.abs(want).max()), rtol=0)


def test_gemm_into_refuses_what_it_cannot_hold():
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    for bad in (np.empty((3, 6), np.float32), np.empty((3, 5), np.float64), np.empty((5, 3), np.float32).T,
                np.empty((3, 5), np.uint16)):
        with pytest.raises(ValueError, match="gemm into"):
            blis.gemm(a, b, into=bad)


@pytest.mark.parametrize("m, k, n, standin", _bf16_cases())
def test_bf16_gemm_on_pairs(m, k, n, standin):
    """bf16 bits in, pairs along K (odd K padded), f32 sums: close to float64, in place (K even,
    rows adjacent) and packed (a transposed A)."""
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(s).astype(BF16) for s in ((m, k), (k, n)))
    want = a.astype(np.float64) @ b.astype(np.float64)
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=standin)
    try:
        for view, b_view in itertools.product((a, np.ascontiguousarray(a.T).T), (b, np.ascontiguousarray(b.T).T)):
            got = blis.gemm(view.view(np.uint16), b_view.view(np.uint16))
            np.testing.assert_allclose(got, want, atol=1e-5 * math.sqrt(k) * max(1.0, np.abs(want).max()), rtol=0)
    finally:
        isa.set_family(before)


def test_block_sizes_follow_the_caches():
    """kc: a B micro-panel in TUNING.gemm_panel_l1[width, halved] L1 caches; mc: an A block in at most half the
    L2, whole register blocks; every thread gets work."""
    l1, l2, _ = isa.cache_sizes()
    assert l1 >= 4096 and l2 >= l1
    b = blis.blocks(100_000, 4096, 256, 4)
    assert b.kc * b.nr * 4 <= TUNING.gemm_panel_l1[b.width, isa.halved_vectors()] * l1 and b.kc % 2 == 0
    assert b.mc % b.rows == 0 and b.mc * b.kc * 4 <= l2 // 2
    small = blis.blocks(30, 4096, 256, 4)
    assert small.k_chunks == min(numba.get_num_threads(), -(-4096 // small.kc))     # deep: K split
    assert -(-30 // small.mc) * small.shares * small.k_chunks >= numba.get_num_threads()
    assert blis.blocks(100_000, 64, 256, 4).k_chunks == 1


def test_blocks_are_remembered_per_thread_count_and_tuning_table(monkeypatch):
    b = blis.blocks(3136, 4096, 64, 4)
    assert blis.blocks(3136, 4096, 64, 4) is b                                   # remembered
    assert b == blis._blocks_for.__wrapped__(3136, 4096, 64, 4, None, isa.family(), numba.get_num_threads())
    threads = numba.get_num_threads()
    if threads > 1:
        deep = blis.blocks(30, 4096, 256, 4)
        try:
            numba.set_num_threads(1)
            assert blis.blocks(30, 4096, 256, 4).k_chunks == 1 < deep.k_chunks
        finally:
            numba.set_num_threads(threads)
        assert blis.blocks(30, 4096, 256, 4) == deep
    quarter = {key: share / 4 for key, share in TUNING.gemm_panel_l1.items()}
    monkeypatch.setattr(blis, "TUNING", dataclasses.replace(TUNING, gemm_panel_l1=quarter))
    assert blis.blocks(3136, 4096, 64, 4).kc < b.kc                              # a new table: new blocks


@pytest.mark.parametrize("n, m, block", [(256, 50176, (6, 2)), (512, 12544, (6, 2)), (1024, 3136, (4, 3))])
def test_gemm_blocks_weigh_loads_as_measured_for_the_gemm(n, m, block):
    """8 lanes: our GEMM weighs loads by ``TUNING.gemm_loads_weight`` (6x2 on 256 and 512 output
    channels, where 4x3 ran the 1x1 layers 25 % slower), the convolution drivers by the family's
    ``TUNING.block_loads_weight`` (4x3 from 256 channels)."""
    assert blis.register_block(n, 8, m, 4) == block
    assert microkernel.block_for(n, 8) == (4, 3)


@pytest.mark.parametrize("halved, block", [(True, (14, 2)), (False, (6, 4))])
def test_gemm_blocks_of_16_lanes_follow_the_vector_datapath(monkeypatch, halved, block):
    """16 lanes, f32: 14x2 where 512-bit operations run as two halves (Zen 4, as measured there),
    else the fewest idle lanes and loads (6x4: 0.42 loads per FMA against 14x2's 0.57; a Zen 5
    ran the 1x1 layers' GEMMs up to 1.4x faster on it); bf16 pairs take the table on neither."""
    monkeypatch.setattr(blis.isa, "halved_vectors", lambda: halved)
    assert blis.register_block(256, 16, 50176, 4) == block
    assert blis.register_block(64, 16, 64, 4) == block
    assert blis.register_block(16, 16, 64, 4) == (16, 1)              # one vector of output: no 14x2
    before = isa.set_family("avx512_bf16", allow_emulated=True)        # bf16 pairs on the dot kernel
    try:
        assert blis.register_block(256, 16, 50176, 2) == microkernel.block_for(256, 16, 50176,
                                                                               loads_weight=TUNING.gemm_loads_weight)
        isa.set_family("amx_bf16", allow_emulated=True)                # on AMX tiles: the tile blocks' rule
        assert blis.register_block(256, 16, 50176, 2) == microkernel.tile_block_for(256, 50176) == (32, 2)
    finally:
        isa.set_family(before)


def test_a_short_reduction_prefers_a_block_that_leaves_the_result_unpadded():
    """A block whose vectors do not divide N leaves the result padded, copied out afterwards:
    weighed by ``TUNING.gemm_result_copy`` FMAs per value against the depth ``k``, so a short
    reduction (ResNet-50's res5 1x1 weights gradient at mb 1: K = 49) takes 6x2 (16 lanes divide
    2048), a deep one keeps 4x3 (24 lanes, 0.8 % idle), as without ``k``."""
    assert blis.register_block(2048, 8, 1024, 4) == (4, 3)
    assert blis.register_block(2048, 8, 1024, 4, k=49) == (6, 2)
    assert blis.register_block(2048, 8, 1024, 4, k=1 << 20) == (4, 3)
    assert blis.register_block(2064, 8, 1024, 4, k=49) == (4, 3)       # 24 lanes divide 2064: nothing to copy


def _busiest(row_panels: int, nb: int, panels: int, shares: int, threads: int, by_share: bool) -> int:
    """The busiest thread's register blocks x panels: the row panels dealt evenly into ``nb``
    blocks, the items (block, share), block-major or share-major, dealt as OpenMP's static
    schedule deals them."""
    order = [(b, s) for s in range(shares) for b in range(nb)] if by_share else \
        [(b, s) for b in range(nb) for s in range(shares)]
    items = [(row_panels * (b + 1) // nb - row_panels * b // nb) * (panels * (s + 1) // shares - panels * s // shares)
             for b, s in order]
    q, extra = divmod(len(items), threads)
    bounds = np.cumsum([0] + [q + (t < extra) for t in range(threads)])
    return max(sum(items[bounds[t]:bounds[t + 1]]) for t in range(threads))


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_the_split_keeps_every_thread_nearly_as_busy_as_any_split_can(threads):
    """Against every split into blocks of whole register blocks (brute force): blocks of at most
    mc_max rows that cover the rows once; among splits into up to 2 blocks a thread more than
    the fewest, dealt block-major or share-major, the busiest thread within ``TUNING.gemm_balance`` of the best one's and no split
    that close in fewer items; within twice that of the best split of any number of blocks."""
    rng = np.random.default_rng()
    for _ in range(30):   # up to 150 register blocks of rows: the brute force took 9 s at 400 (4 threads)
        rows = int(rng.choice([6, 8, 14]))
        m, panels = int(rng.integers(1, 150 * rows)), int(rng.integers(1, 9))
        mc_max = rows * int(rng.integers(1, 120))
        mc, nb, shares, by_share = blis.split(m, rows, panels, mc_max, threads)
        spans = [blis.block_rows(m, rows, nb, b) for b in range(nb)]
        assert [s[0] for s in spans] == list(itertools.accumulate([0] + [s[1] for s in spans[:-1]]))
        assert sum(s[1] for s in spans) == m and max(s[1] for s in spans) <= mc <= max(mc_max, rows)
        assert mc % rows == 0 and 1 <= shares <= panels
        rp = -(-m // rows)
        fewest = -(-rp // max(1, mc_max // rows))
        every = {(c, s, by): _busiest(rp, c, panels, s, threads, by)
                 for c in range(fewest, rp + 1) for s in range(1, panels + 1) for by in (False, True)}
        assert every[nb, shares, by_share] <= min(every.values()) * (1 + 2 * TUNING.gemm_balance)
        every = {k: b for k, b in every.items() if k[0] <= fewest + 2 * threads}
        close = {k: b for k, b in every.items() if b <= min(every.values()) * (1 + TUNING.gemm_balance)}
        assert (nb, shares, by_share) in close, (m, rows, panels, mc_max, threads, (nb, shares, by_share))
        assert nb * shares == min(c * s for c, s, _ in close), (m, rows, panels, mc_max, threads, (nb, shares))


@pytest.mark.parametrize("m, k, n, standin", _bf16_cases())
def test_bf16_gemm_rounded_as_it_stores(m, k, n, standin):
    """``rounded``: the bf16 bits of the f32 result, each rounded once to nearest even (ties, NaN,
    overflow to inf included), whether its tiles took one K step or several, or K was split."""
    from convgrad import casts
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(s).astype(BF16) for s in ((m, k), (k, n)))
    a[0, 0] = np.nan if m * n > 1 else a[0, 0]
    b[-1, -1] = ml_dtypes.finfo(BF16).max          # a product past f32's range: inf
    a[-1, -1] = 2.0 ** 120 if m > 1 else a[-1, -1]
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=standin)
    try:
        for view, b_view in itertools.product((a, np.ascontiguousarray(a.T).T), (b, np.ascontiguousarray(b.T).T)):
            f32 = np.ascontiguousarray(blis.gemm(view.view(np.uint16), b_view.view(np.uint16)))
            got = blis.gemm(view.view(np.uint16), b_view.view(np.uint16), rounded=True)
            assert got.shape == (m, n) and got.dtype == np.uint16
            want = casts.from_f32(f32, BF16).view(np.uint16)
            nan = np.isnan(f32)
            assert np.isnan(got.view(BF16)[nan]).all()
            np.testing.assert_array_equal(got[~nan], want[~nan])
    finally:
        isa.set_family(before)


def test_bf16_rounding_of_ties_and_specials():
    """The store's rounding (:func:`convgrad.casts.bf16_bits`) on the cases that decide it: ties
    to even both ways, carries into the exponent and into inf, NaN kept NaN, signed zeros."""
    from convgrad import casts
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20, 2 - 2 ** -9,
                       3.3895e38, -3.4e38, np.inf, -0.0, 0.0, np.nan, 1e-40], np.float32)
    got = np.empty(values.size, np.uint16)
    casts._narrow_bf16(values.view(np.uint32), got)
    want = values.astype(BF16)
    assert np.isnan(got.view(BF16)[-2])
    np.testing.assert_array_equal(np.delete(got, -2), np.delete(want.view(np.uint16), -2))
    scalar = numba.njit(lambda u: casts.bf16_bits(u))
    assert [scalar(u) for u in values.view(np.uint32) if u != values.view(np.uint32)[-2]] == \
        np.delete(got, -2).tolist()


def _pointwise_geometry(n, in_size, ic, oc, strides) -> ConvGeometry:
    out = tuple((i - 1) // s + 1 for i, s in zip(in_size, strides))
    r = len(in_size)
    return ConvGeometry(n, 1, ic, oc, in_size, out, (1,) * r, strides, (1,) * r, (0,) * r, (0,) * r)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("g", [_pointwise_geometry(2, (5, 7), 6, 9, (1, 1)), _pointwise_geometry(3, (9, 8), 16, 40, (2, 2)),
                               _pointwise_geometry(1, (4,), 3, 5, (3,)), _pointwise_geometry(2, (3, 4, 5), 33, 17, (1, 2, 1)),
                               _pointwise_geometry(3, (3, 3), 40, 48, (1, 1)), _pointwise_geometry(3, (5, 5), 24, 33, (2, 2)),
                               _pointwise_geometry(2, (9, 10), 5, 7, (1, 1)), _pointwise_geometry(2, (17, 16), 7, 5, (2, 2))],
                         ids=["2d", "strided", "1d", "3d", "few positions", "few positions strided", "NCX per image",
                              "NCX per image strided"])
@pytest.mark.parametrize("transposed", [False, True], ids=["per image", "transposed"])
def test_pointwise_layers_on_the_gemm(g, dtype, transposed, monkeypatch):
    """Every task of a 1x1 layer through the jit strategy's GEMM equals the float64 reference,
    for data in NXC memory and for an NCX view of it: NCX per image, or on NXC copies
    (``TUNING.ncx_transposed_positions`` past every size, ``transposed``; the weights gradient
    of few positions and many channels always)."""
    ncx_one_gemm = g.ic * g.oc > (g.ic + g.oc) * math.prod(g.out_size)
    assert ncx_one_gemm == (g.in_size in ((3, 3), (5, 5)))              # both rules are run
    limit = 1 << 30 if transposed else 0
    monkeypatch.setattr(jit, "TUNING", dataclasses.replace(jit.TUNING, ncx_transposed_positions={2: limit, 4: limit}))
    rng = np.random.default_rng()
    ref = get_engine("reference")
    x, w, dy = (rng.uniform(-1, 1, s).astype(dtype) for s in (g.x_shape, g.w_shape, g.y_shape))
    for task, args in (("forward", (x, w)), ("backward_data", (dy, w)), ("backward_weights", (x, dy))):
        want = getattr(ref, task)(g, *args)
        for ncx, first in enumerate((args[0], np.moveaxis(np.ascontiguousarray(np.moveaxis(args[0], -1, 1)), 1, -1))):
            assert jit.ncx_transposes(g, task, dtype) == (transposed or task == "backward_weights" and ncx_one_gemm)
            got = jit.pointwise(g, first, args[1], task)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()), err_msg=task)
            if ncx and task != "backward_weights":                    # NCX memory, as the data
                assert np.moveaxis(got, -1, 1).flags.c_contiguous
            if dtype != np.float32 and task != "backward_weights":   # rounded once, as stored or after
                rounded = jit.pointwise(g, first, args[1], task, rounded=True)
                stored = not ncx or transposed or dtype == BF16 and jit._depth(BF16) == 2   # NCX f16: after
                assert rounded.shape == want.shape and rounded.dtype == (dtype if stored else np.float32)
                assert np.array_equal(rounded.astype(dtype), got.astype(dtype)), task


@pytest.mark.parametrize("m, k, n", [(5, 200, 17), (16, 1000, 64), (3, 197, 40)])
def test_deep_reductions_run_transposed_and_agree(m, k, n, rng):
    """A deep f32 reduction with N > M (a weights gradient) runs as (b^T a^T)^T: the same sums,
    also on a transposed (strided) A, as the weights gradient passes it."""
    assert n > m and k > 4 * (m + n)
    a = rng.standard_normal((k, m)).astype(np.float32).T        # A read through its transpose
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = blis.gemm(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("m, k, n", [(5, 200, 17), (16, 1000, 64), (3, 197, 40)])
def test_bf16_deep_reductions_run_transposed_and_agree(m, k, n, rng):
    """bf16 too: a deep reduction with N > M runs as (b^T a^T)^T (the smaller operand packed in
    pairs), plain and rounded, from a transposed A as the weights gradient passes it."""
    from convgrad import casts
    a = rng.standard_normal((k, m)).astype(BF16).T
    b = rng.standard_normal((k, n)).astype(BF16)
    got = blis.gemm(a.view(np.uint16), b.view(np.uint16))
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    rounded = blis.gemm(a.view(np.uint16), b.view(np.uint16), rounded=True)
    np.testing.assert_array_equal(rounded, casts.from_f32(np.ascontiguousarray(got), BF16).view(np.uint16))


@pytest.mark.parametrize("m, n", [(1, 1), (3, 17), (16, 16), (17, 33), (33, 16), (100, 7), (64, 48), (196, 1024)])
@pytest.mark.parametrize("width", [8, 16])
def test_transposed_results_equal_numpys_transpose(m, n, width):
    """``blis._transposed``: a padded f32 result's view (rows further apart than its columns)
    transposed in ``width`` x ``width`` register tiles and one value at a time at the edges; a
    batch of images (an NXC result into NCX memory), 32- and 16-bit (rows paired into 32-bit
    units, then their tiles; odd rows one value at a time)."""
    rng = np.random.default_rng()
    padded = rng.standard_normal((m + 5, n + 9)).astype(np.float32)
    view = padded[:m, :n]
    out = np.empty((n, m), np.float32)
    blis._transpose_into(view[None], view.strides[0] // 4, out[None], width)
    assert np.array_equal(out, view.T)
    assert np.array_equal(blis._transposed(view), view.T) and blis._transposed(view).flags.c_contiguous
    images = rng.standard_normal((3, m, n)).astype(np.float32)     # a batch: an NXC result into NCX memory
    got = blis.transposed_images(images)
    assert got.flags.c_contiguous and np.array_equal(got, images.transpose(0, 2, 1))
    bits = rng.integers(0, 1 << 16, (3, m, n), dtype=np.uint16)   # 16-bit: rows paired, then 32-bit tiles
    out16 = np.empty((3, n, m), np.uint16)
    blis._transpose_pairs_into(bits, out16, width)
    assert np.array_equal(out16, bits.transpose(0, 2, 1))
    got16 = blis.transposed_images(bits.view(ml_dtypes.bfloat16))
    assert got16.dtype == ml_dtypes.bfloat16 and np.array_equal(got16.view(np.uint16), bits.transpose(0, 2, 1))


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=str)
def test_channels_last_copies_ncx_memory_by_tiles(dtype):
    """``blis.channels_last``: canonical data in NCX memory as a C-contiguous NXC copy (images
    transposed in tiles), NXC data itself, any other view a copy; the values unchanged."""
    rng = np.random.default_rng()
    ncx = rng.standard_normal((3, 41, 5, 7)).astype(dtype)           # whole tiles and edges
    view = np.moveaxis(ncx, 1, -1)                                   # canonical (N, H, W, C) of NCX memory
    got = blis.channels_last(view)
    assert got.flags.c_contiguous and got.dtype == dtype and np.array_equal(got, view)
    assert blis.channels_last(got) is got
    strided = view[:, ::2]
    assert np.array_equal(blis.channels_last(strided), strided) and blis.channels_last(strided).flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.float64], ids=["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("shape", [(1, 1, 17, 33), (1, 1, 32, 48), (1, 1, 64, 31), (3, 3, 5, 70), (2, 3, 1, 16),
                                   (7, 3, 1), (1, 16, 1), (2, 2, 2, 19, 17)])
def test_reversed_weights_are_the_oix_transposition(shape, dtype):
    """``blis.reversed_weights``: canonical (*K, ICg, OC) weights (C-contiguous, or a view of
    padded sums) as a C-contiguous (OC, ICg, *K) array, every value moved and none changed: one
    tap in register tiles (whole tiles and edges), several a block of output channels at a time;
    the input untouched; None for weights whose output channels are not adjacent."""
    rng = np.random.default_rng()
    *taps, icg, oc = shape
    padded = rng.standard_normal((*taps, icg + 3, oc + 5)).astype(dtype)
    for w in (np.ascontiguousarray(padded[..., :icg, :oc]), padded[..., :icg, :oc]):
        before = w.copy()
        got = pool_run(blis.reversed_weights, w)
        want = np.transpose(w, (len(shape) - 1, len(shape) - 2, *range(len(taps))))
        assert got.flags.c_contiguous and got.dtype == w.dtype and np.array_equal(got, want)
        assert np.array_equal(w, before)
    assert blis.reversed_weights(padded[..., ::2]) is None


@pytest.mark.parametrize("m, k, n", [(16, 4001, 6), (40, 3000, 7), (64, 2049, 96), (17, 5001, 3)])
@pytest.mark.parametrize("standin", [False, True])
def test_bf16_deep_reduction_packs_b_per_k_step(m, k, n, standin, monkeypatch):
    """A deep bf16 reduction whose items each own a chunk of K (one block of rows, one share of
    the panels) packs B's pairs per K step in each thread, whole vectors by ``pairs32`` and the
    columns past them, and an odd K's last row, one value at a time: never all of B first; plain
    and rounded, close to float64 (odd K, N past whole vectors and panels)."""
    from convgrad import casts
    if not standin and not isa.bf16_host():
        pytest.skip("no AVX512_BF16: the stand-in case runs the same drivers")
    rng = np.random.default_rng()
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=standin)
    try:
        bl = blis.blocks(*((n, k, m) if n > m else (m, k, n)), 2)          # N > M: run as (b^T a^T)^T
        assert bl.k_chunks > 1 and bl.m_blocks == 1 and bl.shares == 1, bl
        monkeypatch.setattr(blis, "_packed", lambda *a: pytest.fail("all of B packed before the GEMM"))
        a = rng.standard_normal((k, m)).astype(BF16).T                # x^T, as the weights gradient passes it
        b = rng.standard_normal((k, n)).astype(BF16)
        want = a.astype(np.float64) @ b.astype(np.float64)
        got = blis.gemm(a.view(np.uint16), b.view(np.uint16))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * math.sqrt(k) * max(1.0, np.abs(want).max()))
        rounded = blis.gemm(a.view(np.uint16), b.view(np.uint16), rounded=True)
        np.testing.assert_array_equal(rounded, casts.from_f32(np.ascontiguousarray(got), BF16).view(np.uint16))
    finally:
        isa.set_family(before)
