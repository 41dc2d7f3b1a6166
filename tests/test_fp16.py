"""The fast half <-> single conversions agree with NumPy's casts, value for value (NaN for NaN),
in both implementations: the hardware loops (where this CPU has them) and the software ones."""

from __future__ import annotations

import numpy as np
import pytest

from convgrad import fp16


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    unsigned = np.uint16 if a.dtype == np.float16 else np.uint32
    bits = a.view(unsigned) == b.view(unsigned)
    return bool((bits | (np.isnan(a) & np.isnan(b))).all())


@pytest.fixture(autouse=True, params=["hardware", "software"])
def implementation(request, monkeypatch):
    if request.param == "hardware" and not fp16.HARDWARE:
        pytest.skip("no hardware half conversion on this CPU")
    monkeypatch.setattr(fp16, "HARDWARE", request.param == "hardware")


def test_widen_every_half():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    assert _same(fp16.to_f32(every), every.astype(np.float32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_narrow_matches_numpy(rng):
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(1 << 18) * 10.0 ** rng.integers(-9, 6, 1 << 18)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 2.0 ** -24, 2.0 ** -25,
                        3 * 2.0 ** -26, 2.0 ** -14], np.float32)
    for values in (bits, scaled, special):
        assert _same(fp16.from_f32(values), values.astype(np.float16))


def test_memory_order_is_kept(rng):
    ncx = rng.standard_normal((2, 5, 4, 3)).astype(np.float16)
    view = np.moveaxis(ncx, 1, -1)
    wide = fp16.to_f32(view)
    assert np.array_equal(wide, view.astype(np.float32)) and np.moveaxis(wide, -1, 1).flags.c_contiguous
    back = fp16.from_f32(wide)
    assert np.array_equal(back, view) and np.moveaxis(back, -1, 1).flags.c_contiguous
    strided = wide[:, ::2]
    assert np.array_equal(fp16.from_f32(strided), strided.astype(np.float16))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_copy_into_converts_like_numpy(rng):
    from convgrad.dtypes import bfloat16
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32).reshape(256, 256)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    for src, dtype in ((bits, np.float16), (halves, np.float32), (bits, bfloat16), (bits[:, ::2], np.float16)):
        out = np.empty(src.shape, dtype)
        fp16.copy_into(out, src)
        want = src.astype(dtype)
        assert _same(out, want) if dtype != bfloat16 else np.array_equal(out.view(np.uint16), want.view(np.uint16))
