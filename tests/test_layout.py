"""Weights layouts with several tiles of channels: convgrad.layout's tiled reversal
(K, ICg, OC) -> (OC, ICg, K), which lays out every OIX/IOX weights result, checked against NumPy's
own transposition, and the weights gradients in OIX/IOX of ops with 17-40 channels on each side
against PyTorch float64 autograd (tests/oracle.py), on both engines."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from oracle import Case, Geometry, check, fresh_rng, random_tensors, torch_results
from poison import poisoned_allocations

from convgrad import layout

#: (taps, ICg, OC): one tile, several tiles on either side or both, ragged last tiles, ICg != OC
#: so that loops over each other's sizes miss or overrun elements.
SHAPES = [(1, 3, 5), (2, 16, 16), (3, 17, 40), (1, 40, 17), (9, 33, 18), (4, 1, 50), (2, 50, 1)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("taps,icg,oc", SHAPES)
@pytest.mark.parametrize("weights_format", ["OIX", "XIO"])
def test_weights_in_format_is_the_transposition(weights_format: str, taps: int, icg: int, oc: int, dtype) -> None:
    rng, seed = fresh_rng()
    for kernel, padded in itertools.product(((taps,), (1, taps), (taps, 1, 1)), (False, True)):
        canonical = rng.standard_normal((*kernel, icg + 3 * padded, oc + 5 * padded)).astype(dtype)
        canonical = canonical[..., :icg, :oc]            # padded: a view of an engine's padded sums
        with poisoned_allocations():
            got = layout.weights_in_format(canonical, weights_format)
        rank = len(kernel)
        want = canonical if weights_format == "XIO" else np.transpose(canonical, (rank + 1, rank, *range(rank)))
        assert got.flags.c_contiguous and got.shape == want.shape and got.dtype == canonical.dtype
        assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)), (kernel, seed)


@pytest.mark.parametrize("kind,weights_format", [("ConvolutionBackwardWeights", "OIX"),
                                                 ("ConvolutionBackpropFilters", "OIX"),
                                                 ("ConvTransposeBackwardWeights", "IOX")])
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_weights_gradient_with_several_tiles_of_channels(kind: str, weights_format: str, engine: str) -> None:
    """OIX/IOX weights gradients of 17-90 channels per side (2-6 tiles of 16) against torch; the
    largest (151 KB) past ``TUNING.reversed_weights_bytes``: the fast engine lays it out in its pool."""
    rng, seed = fresh_rng()
    for (groups, icg, ocg), data_format in itertools.product(((1, 20, 35), (1, 40, 17), (2, 17, 18), (1, 70, 90)),
                                                             ("NCX", "NXC")):
        geom = Geometry(2, groups, icg, ocg, (6, 5), (3, 2), (1, 2), (1, 1), (1, 0), (0, 1))
        case = Case(kind, geom, data_format=data_format, weights_format=weights_format)
        with poisoned_allocations():
            check(case, torch_results(geom, random_tensors(geom, rng)), seed, engine=engine)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("kernel", [(1, 1), (3, 3)])
def test_the_fast_engine_lays_out_large_weights_results_in_its_pool(kernel, dtype, monkeypatch) -> None:
    """A weights gradient in OIX from ``TUNING.reversed_weights_bytes`` is laid out by the fast
    engine (:func:`convgrad.engines.fast.blis.reversed_weights`, in the pool), the same values as
    its XIO result; a smaller one by :func:`convgrad.layout.weights_in_format`."""
    import convgrad as cg
    from convgrad.dtypes import DATA_DTYPES
    from convgrad.engines.fast import TUNING, blis
    calls = []
    real = blis.reversed_weights
    monkeypatch.setattr(blis, "reversed_weights", lambda w: calls.append(w.nbytes) or real(w))
    rng, seed = fresh_rng()
    for channels in (160, 8):
        x, dy = (rng.standard_normal((2, 6, 5, channels)).astype(DATA_DTYPES[dtype]) for _ in range(2))
        attrs = dict(strides=[1, 1], pads_begin=[k // 2 for k in kernel], pads_end=[k // 2 for k in kernel],
                     dilations=[1, 1], groups=1, data_format="NXC")
        xio = cg.convolution_backward_weights(x, dy, [*kernel, channels, channels], weights_format="XIO", **attrs)
        oix = cg.convolution_backward_weights(x, dy, [channels, channels, *kernel], weights_format="OIX", **attrs)
        assert oix.flags.c_contiguous and np.array_equal(oix, np.transpose(xio, (3, 2, 0, 1))), seed
        assert bool(calls) == (xio.nbytes >= TUNING.reversed_weights_bytes), (channels, seed)
        calls.clear()


def test_oix_sums_become_xio_weights_in_the_pool(monkeypatch) -> None:
    """The ``gemm`` strategy sums a 1x1 weights gradient of NCX data in OIX memory; asked for XIO
    from ``TUNING.reversed_weights_bytes``, the fast engine reverses it in its pool, the same
    values as its OIX result."""
    import convgrad as cg
    from convgrad.engines.fast import TUNING, blis, forced_strategy
    calls = []
    real = blis.reversed_weights
    monkeypatch.setattr(blis, "reversed_weights", lambda w: calls.append(w.shape) or real(w))
    rng, seed = fresh_rng()
    x, dy = (rng.standard_normal((2, 160, 6, 5)).astype(np.float32) for _ in range(2))
    attrs = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], groups=1, data_format="NCX")
    with forced_strategy("image_gemms"):
        oix = cg.convolution_backward_weights(x, dy, [160, 160, 1, 1], weights_format="OIX", **attrs)
        assert not calls                                      # the sums lie in OIX memory already
        xio = cg.convolution_backward_weights(x, dy, [1, 1, 160, 160], weights_format="XIO", **attrs)
    assert xio.nbytes >= TUNING.reversed_weights_bytes and calls == [(160, 160, 1)], seed
    assert xio.flags.c_contiguous and np.array_equal(xio, np.transpose(oix, (2, 3, 1, 0))), seed


def test_data_views_and_their_memory_order() -> None:
    """NCX data as canonical (N, *X, C) views and back; channels_first tells NCX memory from NXC."""
    ncx = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    canonical = layout.data_to_canonical(ncx, "NCX")
    assert canonical.shape == (2, 4, 5, 3) and np.shares_memory(canonical, ncx)
    assert canonical[1, 2, 3, 0] == ncx[1, 0, 2, 3] and layout.channels_first(canonical)
    assert layout.data_from_canonical(canonical, "NCX").base is not None
    assert np.array_equal(layout.data_from_canonical(canonical, "NCX"), ncx)
    nxc = np.ascontiguousarray(canonical)
    assert layout.data_to_canonical(nxc, "NXC") is nxc and not layout.channels_first(nxc)
    assert layout.data_from_canonical(nxc, "NXC") is nxc
    one_channel = np.zeros((2, 4, 5, 1), np.float32)  # strides[-1] 4 < strides[-2] 4? equal: not channels-first
    assert not layout.channels_first(one_channel)
    assert layout.channels_first(np.zeros((2, 1, 7), np.float32).transpose(0, 2, 1))  # NCX, 1-D
    assert not layout.channels_first(np.zeros((7, 3), np.float32).T)  # 2 axes: not data


@pytest.mark.parametrize("weights_format", ["OIX", "IOX", "XIO", "XOI"])
def test_weights_views(weights_format: str) -> None:
    w = np.arange(4 * 3 * 2 * 5, dtype=np.float64).reshape(4, 3, 2, 5)  # (A, B, K...) or (K..., B, A)
    canonical = layout.weights_to_canonical(w, weights_format)
    if weights_format[0] == "X":
        assert canonical is w
    else:
        assert canonical.shape == (2, 5, 3, 4) and canonical[1, 4, 2, 3] == w[3, 2, 1, 4]
    assert np.array_equal(layout.weights_from_canonical(canonical, weights_format), w)
