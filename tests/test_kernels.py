"""The micro-kernel families on every machine (issue 22: "Testing a family the machine lacks").

- 16-wide (AVX-512) blocks run on an AVX2 host through LLVM's splitting: against the float64
  reference in tests/test_jit_engine.py (every block) and here through the drivers;
- the bf16 dot-product kernel runs the plain-IR stand-in where the host lacks AVX512_BF16 (the
  instruction itself where it has it): bit-exact against a NumPy model of the SDM's order, and
  against float64; the jit drivers on bf16 data with the ``avx512_bf16`` family forced;
- the kernels' assembly for ``znver4`` / ``sapphirerapids`` (and ``znver3`` for AVX2), compiled
  with llvmlite in a subprocess (compiling the bf16 intrinsic for a CPU without it aborts the
  process): the expected instructions in the inner loop, and no spills there;
- natively where the host has the family (denormals, NaN): skipped elsewhere.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

import convgrad as cg
from convgrad.engines import get_engine
from convgrad.engines.fast import isa, jit, microkernel
from convgrad.engines.fast.tuning import TUNING
from convgrad.problem import ConvGeometry

BF16 = cg.dtypes.DATA_DTYPES["bf16"]
NATIVE_BF16 = "avx512bf16" in isa.host_features()
ALL_BLOCKS = [(w, *b) for w, blocks in microkernel.BLOCKS.items() for b in blocks]


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values.astype(BF16)).view(np.uint16)


def _f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits as the f32 values they stand for (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _bf16_case(rng, width, rows, vecs, k=11, taps=3):
    """Random bf16 operands of a kernel call with offsets, strides, taps and an accumulated c."""
    vw = vecs * width
    lda, astep, bstep, ldc = 2 * k * taps + 3, 2, 2 * vw + 6, vw + 8
    a = _bits(rng.standard_normal(rows * lda + 64))
    b = _bits(rng.standard_normal(taps * (k + 1) * bstep + 64))
    ta = np.array([2 * k * t for t in range(taps)], np.int64)
    tb = np.array([(k + 1) * bstep * t for t in (2, 0, 1)[:taps]], np.int64)
    c = rng.standard_normal(rows * ldc + 9).astype(np.float32)
    return dict(c=c, coff=5, ldc=ldc, a=a, aoff=1, lda=lda, astep=astep, b=b, boff=3, bstep=bstep, ta=ta, tb=tb,
                ntaps=taps, k=k)


def _block_mask(p: dict, rows: int, lanes: int) -> np.ndarray:
    """The elements of ``c`` a kernel call's block covers: ``rows`` rows of ``lanes`` from ``coff``."""
    block = np.zeros(p["c"].shape, bool)
    for r in range(rows):
        block[p["coff"] + r * p["ldc"]:][:lanes] = True
    return block


_TINY = 2.0 ** -126   # f32's smallest normal


def _daz(x: np.ndarray) -> np.ndarray:
    """f32 values (as f64) with denormals as zeros of their sign."""
    return np.where((np.abs(x) < _TINY) & (x != 0), np.copysign(0.0, x), x)


def _dot_step(acc: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One product added as VDPBF16PS adds it (measured bit for bit on a Zen 4, docs/engine-measurements.md):
    denormal inputs as signed zeros, the exact product added with one rounding to f32 (RNE), a
    sum tiny after rounding to 24 bits with an unbounded exponent flushed to a zero of its sign."""
    with np.errstate(all="ignore"):
        return _dot_step_exact(acc, x, y)


def _dot_step_exact(acc: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    acc, x, y = _daz(np.asarray(acc, np.float64)), _daz(np.asarray(x, np.float64)), _daz(np.asarray(y, np.float64))
    p = x * y                                             # bf16 x bf16: exact in f64
    s = acc + p
    t = s - acc
    err = (acc - (s - t)) + (p - t)                       # s + err is the exact sum
    r = s.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for step in (np.inf, -np.inf):                    # s an f32 midpoint: err breaks the tie
            near = np.nextafter(r, np.float32(step))
            mid = (r.astype(np.float64) + near.astype(np.float64)) / 2
            r = np.where((s == mid) & (err * step > 0), near, r)
        m, e = np.frexp(s + err)
        unbounded = np.ldexp(np.round(m * 2.0 ** 24), e - 24)
    return np.where(np.abs(unbounded) < _TINY, np.copysign(0.0, r), r).astype(np.float32)


def _bf16_model(p: dict, width: int, rows: int, vecs: int) -> tuple[np.ndarray, np.ndarray]:
    """(the instruction's order in f32: per step the odd pair's product added, then the even
    pair's, each as :func:`_dot_step`; the float64 sum) of a kernel call."""
    vw = vecs * width
    c32, c64 = p["c"].copy(), p["c"].astype(np.float64)
    a, b = _f32(p["a"]), _f32(p["b"])
    for r in range(rows):
        at = p["coff"] + r * p["ldc"]
        acc, exact = c32[at:at + vw].copy(), c64[at:at + vw].copy()
        for t in range(p["ntaps"]):
            for i in range(p["k"]):
                ai = p["aoff"] + p["ta"][t] + r * p["lda"] + i * p["astep"]
                bi = p["boff"] + p["tb"][t] + i * p["bstep"]
                pairs = b[bi:bi + 2 * vw].reshape(vw, 2)
                for half in (1, 0):
                    acc = _dot_step(acc, a[ai + half], pairs[:, half])
                    exact += np.float64(a[ai + half]) * pairs[:, half].astype(np.float64)
        c32[at:at + vw], c64[at:at + vw] = acc, exact
    return c32, c64


#: Natively where the host has AVX512_BF16, and the stand-in (the emulated twin) everywhere.
KERNELS = [pytest.param(True, id="native", marks=pytest.mark.skipif(not NATIVE_BF16, reason="no AVX512_BF16")),
           pytest.param(False, id="standin")]


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("width, rows, vecs", ALL_BLOCKS)
def test_bf16_kernel_is_the_instructions_order_bit_exact(width, rows, vecs, native, rng):
    """The bf16 kernel (the instruction, or its stand-in) sums each lane's pairs in VDPBF16PS's
    order, bit for bit, and close to the float64 sums."""
    if width != 16 and native:
        pytest.skip("the instruction is 16 lanes wide (the stand-in runs at 8 too)")
    p = _bf16_case(rng, width, rows, vecs)
    want, exact = _bf16_model(p, width, rows, vecs)
    got = p["c"].copy()
    microkernel.kernel_call(width, rows, vecs, native)(got, *list(p.values())[1:])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4 * np.abs(exact).max())


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("width, rows, vecs", ALL_BLOCKS)
def test_without_accumulate_c_is_written_not_read(width, rows, vecs, native, rng):
    """``accumulate=0`` (a GEMM's first reduction step): the block is the sums alone, whatever
    ``c`` held (NaN here), and nothing outside the block is touched; ``accumulate=1`` adds."""
    if width != 16 and native:
        pytest.skip("the instruction is 16 lanes wide (the stand-in runs at 8 too)")
    p = _bf16_case(rng, width, rows, vecs)
    call = microkernel.kernel_call(width, rows, vecs, native)
    added = p["c"].copy()
    call(added, *list(p.values())[1:])
    zeros = np.zeros_like(p["c"])
    call(zeros, *list(p.values())[1:])
    poisoned = np.full_like(p["c"], np.nan)
    call(poisoned, *list(p.values())[1:], 0)
    block = _block_mask(p, rows, vecs * width)
    np.testing.assert_array_equal(poisoned[block], zeros[block])
    assert np.isnan(poisoned[~block]).all()
    assert not np.array_equal(added[block], zeros[block])   # the case's c is not zero: accumulate=1 added it


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("width, rows, vecs", ALL_BLOCKS)
def test_rounded_stores_are_the_f32_block_rounded_once(width, rows, vecs, native, rng):
    """A uint16 ``c``: the block's sums as bf16 bits, each the f32 sum rounded to nearest even
    (NaN quiet), whatever ``c`` held and ``accumulate`` says; nothing outside the block touched."""
    from convgrad import casts
    if width != 16 and native:
        pytest.skip("the instruction is 16 lanes wide (the stand-in runs at 8 too)")
    p = _bf16_case(rng, width, rows, vecs)
    p["a"][p["aoff"]] = 0x7FC0                                 # a NaN in the first row
    call = microkernel.kernel_call(width, rows, vecs, native)
    sums = np.zeros_like(p["c"])
    call(sums, *list(p.values())[1:], 0)
    bits = np.full(p["c"].shape, 0xABCD, np.uint16)
    call(bits, *list(p.values())[1:], 1)
    block = _block_mask(p, rows, vecs * width)
    want = casts.from_f32(sums[block], BF16).view(np.uint16)
    nan = np.isnan(sums[block])
    assert nan.any() and np.isnan(bits[block].view(BF16)[nan]).all()
    np.testing.assert_array_equal(bits[block][~nan], want[~nan])
    assert (bits[~block] == 0xABCD).all()


def _special_bits(rng, n: int) -> np.ndarray:
    """Random bf16 bits, most near the bottom of the range (denormals, zeros, products that
    underflow f32) or of any exponent; no Inf/NaN."""
    exponent = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n),
                        np.where(rng.random(n) < 0.5, rng.integers(55, 75, n), rng.integers(0, 255, n)))
    return ((rng.integers(0, 2, n) << 15) | (exponent << 7) | rng.integers(0, 128, n)).astype(np.uint16)


def _one_pair_call(native: bool, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c (16 rows x 16 lanes) plus one pair step: row r's pair a[2r:2r+2] against lane l's b[2l:2l+2]."""
    got, one = c.copy(), np.zeros(1, np.int64)
    microkernel.kernel_call(16, 16, 1, native)(got, 0, 16, a, 0, 2, 2, b, 0, 32, one, one, 1, 1)
    return got


@pytest.mark.parametrize("native", KERNELS)
def test_bf16_flushing_is_the_instructions(native, rng):
    """Denormal inputs and accumulators, products that underflow, sums at 2^-126: the kernel
    gives the model's bits (DAZ, two roundings, FTZ after rounding), random cases and the edge
    cases whose results were read off a Zen 4 (each one tells two plausible models apart)."""
    for _ in range(40):
        a, b = _special_bits(rng, 32), _special_bits(rng, 32)
        cbits = rng.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
        c = ((cbits & 0x807FFFFF) | (rng.integers(0, 30, 256).astype(np.uint32) << 23)).view(np.float32)
        want = c.reshape(16, 16)
        fa, fb = _f32(a).reshape(16, 2), _f32(b).reshape(16, 2)
        for half in (1, 0):
            want = _dot_step(want, fa[:, half:half + 1], fb[:, half][None, :])
        np.testing.assert_array_equal(_one_pair_call(native, c, a, b).view(np.uint32), want.reshape(-1).view(np.uint32))
    t = 2.0 ** -126
    edges = [  # (c, odd a, odd b, even a, even b) -> the instruction's result
        ((t, -2.0 ** -75, 2.0 ** -76, 0, 0), t),                 # tiny before rounding, not after: kept
        ((t, -1.5 * 2.0 ** -75, 2.0 ** -76, 0, 0), 0.0),         # 2^-126 with gradual underflow, tiny after: 0
        ((t * (1 + 2.0 ** -23), -2.0 ** -75, 2.0 ** -75, 0, 0), t),  # the product is not flushed before the sum
        ((-(2.0 ** -130), 1.0, 1.0, 0, 0), 1.0),                 # a denormal accumulator counts as -0
        ((-0.0, -2.0 ** -75, 2.0 ** -75, -2.0 ** -75, 2.0 ** -75), -0.0),  # negative underflow: -0
        ((1.0, 2.0 ** 12, 2.0 ** 12, -2.0 ** 12, 2.0 ** 12), 0.0),  # odd pair first, each sum rounded
        ((0.0, 2.0 ** -130, 2.0 ** 10, 0, 0), 0.0),               # a denormal bf16 input counts as zero
    ]
    for (c0, a1, b1, a0, b0), want in edges:
        a, b = np.zeros(32, np.uint16), np.zeros(32, np.uint16)
        a[:2], b[:2] = _bits(np.array([a0, a1])), _bits(np.array([b0, b1]))
        got = _one_pair_call(native, np.full(256, c0, np.float32), a, b)[0]
        assert got.view(np.uint32) == np.float32(want).view(np.uint32), ((c0, a1, b1, a0, b0), got, want)


def test_parallel_items_runs_every_item_once_in_the_pool():
    """A driver's serial body, called by address from the shared parallel loop: every item once,
    on the pool's threads, a body compiled per argument dtypes (f32, then f64 arrays)."""
    def body(item, out, who, scale):  # pragma: no cover - compiled
        out[item] += scale * (item + 1)
        who[item] = numba.get_thread_id()

    drive = microkernel.parallel_items(body)
    for dtype in (np.float32, np.float64):
        out, who = np.ones(37, dtype), np.full(37, -1, np.int64)
        drive(37, out, who, 2.0)
        np.testing.assert_array_equal(out, 1 + 2 * np.arange(1, 38))
        assert who.min() >= 0 and len(set(who.tolist())) == min(numba.get_num_threads(), 37)
    assert len(drive.addresses) == 2


def test_parallel_items_raise_where_a_body_raised():
    """An exception inside a body (here ``1 // 0`` in item 3) is an error of the call, never a
    result computed past it."""
    def body(item, out):  # pragma: no cover - compiled
        out[item] = 1 // (item - 3)

    with pytest.raises(RuntimeError, match="1 of 8 items raised"):
        microkernel.parallel_items(body)(8, np.zeros(8, np.int64))


def test_kernel_rejects_mixed_operands():
    """f32 against bf16 operands is a typing error naming both, not a wrong answer."""
    c, f, u, t = np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(8, np.uint16), np.zeros(1, np.int64)
    with pytest.raises(Exception, match="both float32 or both"):
        microkernel.kernel_call(8, 8, 1)(c, 0, 8, f, 0, 1, 1, u, 0, 8, t, t, 1, 1)


@pytest.mark.parametrize("channels, width, rows, block", [
    (8, 8, None, (8, 1)), (16, 8, None, (6, 2)), (24, 8, None, (4, 3)), (40, 8, None, (4, 3)), (64, 8, 64, (6, 2)),
    (16, 16, None, (16, 1)), (30, 16, None, (14, 2)), (48, 16, None, (8, 3)), (64, 16, None, (6, 4)),
    (64, 16, 64, (6, 4)), (80, 16, None, (8, 3)), (24, 8, 8, (4, 3)),
    (256, 16, 50176, (6, 4)), (64, 16, 12544, (6, 4)),     # a partial last block of thousands of rows: no idle rows
    (256, 8, None, (4, 3)), (512, 8, None, (4, 3)), (128, 8, None, (6, 2))])  # AVX2: loads weigh more
def test_block_choice(channels, width, rows, block):
    """Fewest idle lanes (and rows, to the percent), then fewest loads per FMA, then most
    accumulators; all fit the register file."""
    assert microkernel.block_for(channels, width, rows) == block
    registers = {8: 16, 16: 31}[width]    # 16 ymm; 32 zmm less one for the compiler's use
    assert all(r * v + v + 1 <= registers for r, v in microkernel.BLOCKS[width])


def _geometry(n, groups, icg, ocg, in_size, kernel, strides, pads) -> ConvGeometry:
    out = tuple((i + 2 * p - k) // s + 1 for i, p, k, s in zip(in_size, pads, kernel, strides))
    return ConvGeometry(n, groups, groups * icg, groups * ocg, in_size, out, kernel, strides, (1,) * len(kernel),
                        pads, pads)


BF16_CASES = {
    "odd channels": _geometry(2, 1, 5, 19, (7, 9), (3, 3), (1, 1), (1, 1)),
    "groups, odd pairs, strides": _geometry(2, 3, 7, 9, (8, 7), (3, 2), (2, 1), (1, 0)),
    "3-D, 1x1x1 output tail": _geometry(1, 1, 18, 33, (3, 4, 5), (2, 3, 2), (1, 2, 1), (0, 1, 1)),
}


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("case", sorted(BF16_CASES))
def test_bf16_family_drivers_against_reference(case, native, rng):
    """Every task of bf16 data on the ``avx512_bf16`` family runs the bf16 kernel (channel pairs,
    odd channel counts padded per group; the weights gradient on pairs of output positions, odd
    rows included) and matches the float64 reference: the instruction, and its stand-in."""
    g, reference = BF16_CASES[case], get_engine("reference")
    x, w, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.w_shape, g.y_shape))
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=not native)
    try:
        assert jit._depth(BF16) == 2 and jit._depth(np.dtype(np.float32)) == 1
        got = {"forward": jit.forward(g, x, w), "backward_data": jit.backward_data(g, dy, w),
               "backward_weights": jit.backward_weights(g, x, dy)}
    finally:
        isa.set_family(before)
    for task, args in (("forward", (x, w)), ("backward_data", (dy, w)), ("backward_weights", (x, dy))):
        want = getattr(reference, task)(g, *args)
        assert got[task].dtype == np.float32
        np.testing.assert_allclose(got[task], want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=task)


@pytest.mark.parametrize("native", KERNELS)
@pytest.mark.parametrize("case", sorted(BF16_CASES))
def test_bf16_drivers_round_as_they_store_and_reuse_pair_buffers(case, native, rng, monkeypatch):
    """``rounded`` forward and data gradients are the bf16 rounding of the f32 results, bit for
    bit; a weights gradient taken one image at a time (its pair buffers reused from image to
    image), each image in ranges of output rows (``jit._row_ranges``: edges of padding, strides,
    rows that read padding only) equals the one taken all at once, to f32 rounding."""
    from dataclasses import replace

    from convgrad import casts
    g = replace(BF16_CASES[case], n=3)
    x, w, dy = (rng.uniform(-1, 1, s).astype(BF16) for s in (g.x_shape, g.w_shape, g.y_shape))
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=not native)
    try:
        for run, args in ((jit.forward, (x, w)), (jit.backward_data, (dy, w))):
            f32 = run(g, *args)
            got = run(g, *args, rounded=True)
            assert got.dtype == BF16
            np.testing.assert_array_equal(got.view(np.uint16), casts.from_f32(f32, BF16).view(np.uint16))
        whole = jit.backward_weights(g, x, dy)
        monkeypatch.setattr(jit, "TUNING", replace(jit.TUNING, pair_bytes=1))
        assert jit._pair_images(g, 6, 64)[0] == 1 and jit._pair_images(g, 6, 64)[1] > 1
        one_by_one = jit.backward_weights(g, x, dy)      # the same sums in another order
        np.testing.assert_allclose(one_by_one, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
        padded = _geometry(2, 1, 6, 10, (4, 5), (2, 2), (1, 2), (3, 1))   # rows that read padding only
        xp, dyp = (rng.uniform(-1, 1, s).astype(BF16) for s in (padded.x_shape, padded.y_shape))
        assert len(jit._row_ranges(padded, xp, dyp, padded.out_size[0])) < padded.out_size[0]
        np.testing.assert_allclose(jit.backward_weights(padded, xp, dyp),
                                   get_engine("reference").backward_weights(padded, xp.astype(np.float64),
                                                                            dyp.astype(np.float64)), rtol=1e-4, atol=1e-4)
    finally:
        isa.set_family(before)


@pytest.mark.parametrize("native", KERNELS)
def test_bf16_weight_pairs_keep_nonfinite_x_out_of_an_odd_rows_missing_partner(native, rng):
    """An odd last output row pairs its last position with dy's zero and the x one position on:
    an Inf there must not make dw NaN (the exact sum never reads it)."""
    g = _geometry(1, 1, 4, 16, (5, 8), (3, 3), (2, 2), (0, 0))          # outputs 2 x 3, x column 7 unread
    x, dy = rng.uniform(-1, 1, g.x_shape).astype(BF16), rng.uniform(-1, 1, g.y_shape).astype(BF16)
    x[:, :, 7] = np.inf
    assert not jit._pairs_exact(g, x)
    before = isa.set_family("avx512_bf16", allow_emulated=True, standin=not native)
    try:
        got = jit.backward_weights(g, x, dy)
    finally:
        isa.set_family(before)
    want = get_engine("reference").backward_weights(g, x, dy)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("native", KERNELS)
def test_bf16_weight_pairs_come_a_few_images_within_the_data(native, rng):
    """A dilated layer's pairs (two phases of padded rows: 4.4x its image) come a few images at a
    time, within the bytes of x, dy and dw; where they would not be exact (an Inf that an odd row's
    missing partner reads) the f32 copies come as few images as fit those bytes: both against
    the reference (NaN and Inf where its exact sums have them, nowhere else)."""
    g = ConvGeometry(6, 1, 64, 32, (11, 11), (7, 7), (3, 3), (1, 1), (3, 3), (1, 1), (1, 1))   # dilated_conv:21's kind
    x, dy = rng.uniform(-1, 1, g.x_shape).astype(BF16), rng.uniform(-1, 1, g.y_shape).astype(BF16)
    per, image = jit._pair_images(g, 16, 32)[0], jit._pair_image_bytes(g, 16, 32)
    assert 1 <= per < g.n and per * image <= x.nbytes + dy.nbytes + 2 * math.prod(g.w_shape)
    assert 1 <= jit._unpaired_images(g, 16, 32) < g.n
    for poisoned in (False, True):
        if poisoned:
            x[1:3, :, 9] = np.inf                    # read by the missing partner of the last output column
        assert jit._pairs_exact(g, x) != poisoned
        before = isa.set_family("avx512_bf16", allow_emulated=True, standin=not native)
        try:
            got = jit.backward_weights(g, x, dy)
        finally:
            isa.set_family(before)
        with np.errstate(invalid="ignore"):                  # the engine alone: the API sets this itself
            want = get_engine("reference").backward_weights(g, x.astype(np.float64), dy.astype(np.float64))
        finite = np.isfinite(want)
        assert finite.all() != poisoned and (np.isfinite(got) == finite).all()
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4 * np.abs(want[finite]).max())


def test_every_jit_family_is_selectable():
    """The selection rule considers every family with JIT kernels (not only AVX2)."""
    assert set(TUNING.jit_families) == set(isa.WIDTH)


def test_register_chains_compute_what_they_claim():
    """The register-only probe's chains are real work: their lane sums match a float64 model."""
    out = np.zeros(2, np.float32)
    microkernel._register_spin(8)(out, 50)
    acc = 0.999 + np.arange(microkernel._CHAINS[8], dtype=np.float64)
    for _ in range(50):
        acc = acc * np.float32(0.999) + np.float32(0.999) * 0.5
    np.testing.assert_allclose(out, 8 * acc.sum(), rtol=1e-5)
    assert microkernel.register_peak(8, 1, seconds=0.05) > 0


# --- assembly for CPUs this host may lack -----------------------------------------------------

_ASM = textwrap.dedent("""
    import sys
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(sys.stdin.read())
    module.verify()
    target = llvm.Target.from_triple("x86_64-unknown-linux-gnu")
    print(target.create_target_machine(cpu=sys.argv[1], features="", opt=3).emit_assembly(module))
""")


def _inner_loop(asm: str) -> list[str]:
    """The instructions of the innermost loop (a label and the backward jump to it with no
    label between) that holds the most vector instructions."""
    lines = [line.strip() for line in asm.splitlines()]
    loops = []
    for end, line in enumerate(lines):
        jump = re.match(r"j\w+\s+(\.LBB\w+)", line)
        if jump and f"{jump.group(1)}:" in lines[:end]:
            start = lines.index(f"{jump.group(1)}:")
            body = lines[start + 1:end + 1]
            if not any(re.match(r"\.LBB\w+:", b) for b in body):
                loops.append(body)
    assert loops, asm
    return max(loops, key=lambda body: sum("mm" in b for b in body))


def _assembly(ir_text: str, cpu: str) -> str:
    out = subprocess.run([sys.executable, "-c", _ASM, cpu], input=ir_text, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("cpu", ["znver4", "sapphirerapids"])
@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_avx512_kernels_assembly(cpu, kind):
    """Every 16-wide block compiled for an AVX-512 CPU: one ``vfmadd231ps`` (f32) or
    ``vdpbf16ps`` (bf16) on zmm registers per accumulator and unrolled step in the inner loop, and no spill there
    (no stack operand). One subprocess per CPU and kind (the bf16 intrinsic aborts LLVM for a
    CPU without it)."""
    names = {"f32": "vfmadd231ps", "bf16": "vdpbf16ps"}
    modules = [microkernel.kernel_ir(16, rows, vecs, bf16=kind == "bf16", native=True)
               for rows, vecs in microkernel.BLOCKS[16]]
    for (rows, vecs), text in zip(microkernel.BLOCKS[16], modules):
        loop = _inner_loop(_assembly(text, cpu))
        ops = [line for line in loop if line.startswith(names[kind])]
        assert len(ops) == microkernel.UNROLL * rows * vecs and all("zmm" in op for op in ops), (rows, vecs, loop)
        assert not [line for line in loop if "(%rsp)" in line], (rows, vecs, loop)


def test_avx2_kernels_assembly():
    """The 8-wide blocks for Zen 3 (AVX2): ``vfmadd231ps`` on ymm registers, no spill in the inner loop."""
    for rows, vecs in microkernel.BLOCKS[8]:
        loop = _inner_loop(_assembly(microkernel.kernel_ir(8, rows, vecs), "znver3"))
        ops = [line for line in loop if line.startswith("vfmadd")]
        assert len(ops) == microkernel.UNROLL * rows * vecs and all("ymm" in op for op in ops), (rows, vecs, loop)
        assert not [line for line in loop if "(%rsp)" in line], (rows, vecs, loop)


# --- natively, where the host has the family --------------------------------------------------

@pytest.mark.parametrize("native", KERNELS)
def test_bf16_denormals_and_nan(native):
    """Denormal bf16 inputs count as zero (a denormal times 1, added to 1, leaves 1), NaN
    propagates: the instruction, and its stand-in on every machine."""
    t = np.ones(2 * 16, np.float32)
    b = _bits(t)
    for a_value, check in ((np.uint16(0x0001), lambda c: np.all(c == 1.0)), (_bits(np.array([np.nan]))[0], np.isnan)):
        a = np.zeros(2 * 16, np.uint16)
        a[1::2] = a_value                                       # the odd half of each row's pair
        c = _one_pair_call(native, np.ones(16 * 16, np.float32), a, b)
        assert np.all(check(c)), c


@pytest.mark.skipif("avx512f" not in isa.host_features(), reason="the host lacks AVX-512")
def test_native_avx512_denormals_and_nan(rng):
    """16-wide f32 kernels natively: denormals are kept (no flushing), NaN propagates."""
    call = microkernel.kernel_call(16, 14, 2)
    zero = np.zeros(1, np.int64)
    a = np.full(14, np.float32(1e-39), np.float32)                  # a denormal
    a[3] = np.nan
    b = np.ones(32, np.float32)
    c = np.zeros(14 * 32, np.float32)
    call(c, 0, 32, a, 0, 1, 1, b, 0, 32, zero, zero, 1, 1)
    c = c.reshape(14, 32)
    assert np.isnan(c[3]).all() and np.all(c[np.arange(14) != 3] == np.float32(1e-39))


# --- the disk cache follows the kernel's source -----------------------------------------------

_CACHED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from convgrad.engines.fast import microkernel
    assert microkernel.__file__.startswith(sys.argv[1]), microkernel.__file__

    @microkernel.cached_njit()
    def probe(x):
        return x + 1

    probe(np.int64(1))
    print(sum(probe.stats.cache_hits.values()), sum(probe.stats.cache_misses.values()))
""")


def test_disk_cache_is_invalidated_when_the_kernel_source_changes(tmp_path):
    """A caller compiled with ``cached_njit`` loads from numba's disk cache in a new process,
    and recompiles once ``microkernel.py`` was edited (numba alone checks only the caller's file)."""
    package = Path(cg.__file__).parent
    shutil.copytree(package, tmp_path / "convgrad", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "probe.py"
    script.write_text(_CACHED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def hits_misses() -> tuple[int, ...]:
        out = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return tuple(map(int, out.stdout.split()))

    assert hits_misses() == (0, 1)
    assert hits_misses() == (1, 0)
    kernel = tmp_path / "convgrad" / "engines" / "fast" / "microkernel.py"
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    assert hits_misses() == (0, 1)
    assert hits_misses() == (1, 0)


@pytest.mark.parametrize("size, block", [(56, (6, 4)), (28, (14, 2)), (14, (14, 2)), (7, (7, 3))])
@pytest.mark.parametrize("task", ["forward", "backward_data"])
def test_block_choice_weighs_padding_columns(size, block, task):
    """A stride-1 3x3 layer of 128 channels on 16 lanes: 14x2 where the 6x4 block's flattened rows
    would compute 7 % or more padding columns (28, 14 wide) and 14 divides the row; 6x4 at 56 wide
    (3.6 %); 7x3 at 7 wide (a ninth, idle vector, but no padding columns: 6x4 computes 12
    positions for 7 there, 14x2 14); stride 2 keeps 6x4."""
    g = ConvGeometry(16, 1, 128, 128, (size, size), (size, size), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    computed = jit._computed(g, task)
    assert computed(14) == 1.0 or size % 14
    assert microkernel.block_for(128, 16, None, computed) == block
    strided = ConvGeometry(16, 1, 128, 128, (size, size), (-(-size // 2),) * 2, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    assert jit._computed(strided, task) is None and jit._computed(g, "backward_weights") is None
