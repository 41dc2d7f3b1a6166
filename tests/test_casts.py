"""The fast half <-> single conversions agree with NumPy's casts, value for value (NaN for NaN),
in both implementations: the hardware loops (where this CPU has them) and the software ones."""

from __future__ import annotations

import numpy as np
import pytest

from convgrad import casts


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, or both NaN."""
    unsigned = np.uint16 if a.dtype.itemsize == 2 else np.uint32
    bits = a.view(unsigned) == b.view(unsigned)
    return bool((bits | (np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32)))).all())


@pytest.fixture(autouse=True, params=["hardware", "software"])
def implementation(request, monkeypatch):
    if request.param == "hardware" and not casts.HARDWARE:
        pytest.skip("no hardware half conversion on this CPU")
    monkeypatch.setattr(casts, "HARDWARE", request.param == "hardware")


def test_widen_every_half():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    assert _same(casts.to_f32(every), every.astype(np.float32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_narrow_matches_numpy(rng):
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(1 << 18) * 10.0 ** rng.integers(-9, 6, 1 << 18)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 2.0 ** -24, 2.0 ** -25,
                        3 * 2.0 ** -26, 2.0 ** -14], np.float32)
    for values in (bits, scaled, special):
        assert _same(casts.from_f32(values), values.astype(np.float16))


def test_memory_order_is_kept(rng):
    ncx = rng.standard_normal((2, 5, 4, 3)).astype(np.float16)
    view = np.moveaxis(ncx, 1, -1)
    wide = casts.to_f32(view)
    assert np.array_equal(wide, view.astype(np.float32)) and np.moveaxis(wide, -1, 1).flags.c_contiguous
    back = casts.from_f32(wide)
    assert np.array_equal(back, view) and np.moveaxis(back, -1, 1).flags.c_contiguous
    strided = wide[:, ::2]
    assert np.array_equal(casts.from_f32(strided), strided.astype(np.float16))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_copy_into_converts_like_numpy(rng):
    from convgrad.dtypes import bfloat16
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32).reshape(256, 256)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    for src, dtype in ((bits, np.float16), (halves, np.float32), (bits, bfloat16), (bits[:, ::2], np.float16)):
        out = np.empty(src.shape, dtype)
        casts.copy_into(out, src)
        want = src.astype(dtype)
        assert _same(out, want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_bf16_narrow_matches_ml_dtypes(rng):
    from convgrad.dtypes import bfloat16
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    big = np.finfo(np.float32).max
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, big, -big, 1.0 + 2.0 ** -8,
                        1.0 + 3 * 2.0 ** -8, 2.0 ** -149, 2.0 ** -127], np.float32)
    payload_nan = np.array([0x7F800001, 0xFFFFFFFF, 0x7FFF8000], np.uint32).view(np.float32)
    for values in (bits, special, payload_nan, bits.reshape(1024, 1024)[:, ::3]):
        got = casts.from_f32(values, bfloat16)
        assert got.dtype == bfloat16 and _same(got, values.astype(bfloat16))
