"""A first end-to-end check of every op against PyTorch float64 autograd."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convgrad as cg


def _torch_conv(x, w, strides, dilations, pads_begin, pads_end, groups):
    pad = [p for b, e in zip(reversed(pads_begin), reversed(pads_end)) for p in (b, e)]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(strides)]
    return conv(F.pad(x, pad), w, stride=strides, dilation=dilations, groups=groups)


def _nxc(a: np.ndarray, fmt: str) -> np.ndarray:
    return a if fmt == "NCX" else np.moveaxis(a, 1, -1)


def _xio(w: np.ndarray, fmt: str) -> np.ndarray:
    return w if fmt[0] != "X" else np.transpose(w, (*range(2, w.ndim), 1, 0))


@pytest.mark.parametrize("rank,fmt,wfmt", list(itertools.product([1, 2, 3], ["NCX", "NXC"], ["OIX", "XIO"])))
def test_all_ops_match_torch(rank, fmt, wfmt, rng):
    groups, icg, ocg, n = 2, 3, 2, 2
    size, kernel = [7, 6, 5][:rank], [3, 2, 3][:rank]
    strides, dilations, pb, pe = [2, 1, 3][:rank], [1, 2, 1][:rank], [1, 0, 2][:rank], [0, 2, 1][:rank]
    x = torch.tensor(rng.standard_normal((n, groups * icg, *size)), requires_grad=True)
    w = torch.tensor(rng.standard_normal((groups * ocg, icg, *kernel)), requires_grad=True)
    y = _torch_conv(x, w, strides, dilations, pb, pe, groups)
    dy = torch.tensor(rng.standard_normal(y.shape))
    (y * dy).sum().backward()
    X, W, Y, DY = _nxc(x.detach().numpy(), fmt), _xio(w.detach().numpy(), wfmt), _nxc(y.detach().numpy(), fmt), \
        _nxc(dy.numpy(), fmt)
    GX, GW = _nxc(x.grad.numpy(), fmt), _xio(w.grad.numpy(), wfmt)
    attrs = dict(strides=strides, dilations=dilations, pads_begin=pb, pads_end=pe, groups=groups, data_format=fmt)
    conv = dict(attrs, weights_format=wfmt)
    extra = [(i + b + e - (k - 1) * d - 1) % s for i, b, e, k, d, s in zip(size, pb, pe, kernel, dilations, strides)]
    tconv = dict(attrs, weights_format={"OIX": "IOX", "XIO": "XOI"}[wfmt], output_padding=extra)
    results = {
        "Convolution": (cg.convolution(X, W, **conv), Y),
        "ConvolutionBackwardData": (cg.convolution_backward_data(DY, W, X.shape, **conv), GX),
        "ConvolutionBackwardWeights": (cg.convolution_backward_weights(X, DY, W.shape, **conv), GW),
        "ConvolutionBackpropFilters": (cg.convolution_backprop_filters(X, DY, W.shape, filter_format=wfmt, **attrs),
                                       GW),
        "ConvTranspose": (cg.conv_transpose(DY, W, **tconv), GX),
        "ConvTransposeBackwardData": (cg.conv_transpose_backward_data(X, W, **tconv), Y),
        "ConvTransposeBackwardWeights": (cg.conv_transpose_backward_weights(DY, X, W.shape, **tconv), GW),
    }
    for op, (got, want) in results.items():
        assert got.shape == want.shape, op
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=op)
