"""The diff_dst sizes of ConvTransposeBackwardData/Weights (issue 14, SEMANTICS.md "Shapes given
two ways"): every size D with floor((D + PB + PE - EK) / S) + 1 = I is accepted, up to S - 1 more
than S*(I-1) + EK - PB - PE, and the extra trailing rows get no gradient / add nothing.

Every size in the range and just outside it, both ops, 1-3 spatial axes, every auto_pad mode
(same_* computes the pads from diff_dst's size). The accepted sizes are found by brute force from
the formula; results are checked against PyTorch twice (the ConvTranspose with the matching
output_padding, and the forward-convolution relation through the oracle's layouts), against the
reference engine, and by adjointness with convgrad's own ConvTranspose.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convgrad as cg

from oracle import (AUTO_PADS, WEIGHTS_FORMATS, Case, Geometry, check, fresh_rng, random_tensors, resolve_pads,
                    torch_results)

STRIDES, KERNEL, DILATIONS, PADS, IN_T = (3, 2, 2), (3, 2, 3), (1, 2, 1), (1, 0, 1), (3, 4, 2)
N, GROUPS, ICG, OCG = 2, 2, 2, 3  # of the underlying convolution: x = diff_dst, y = src
KINDS = ("ConvTransposeBackwardData", "ConvTransposeBackwardWeights")


def _pads(auto_pad: str, sizes: tuple[int, ...], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return resolve_pads("ConvTransposeBackwardData", auto_pad, sizes, KERNEL[:rank], STRIDES[:rank],
                        DILATIONS[:rank], PADS[:rank], PADS[:rank])


def _out_size(auto_pad: str, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The convolution's output size for input ``sizes`` (None where a window does not fit)."""
    rank = len(sizes)
    pb, pe = _pads(auto_pad, sizes, rank)
    spans = [d + b + e - ((k - 1) * dl + 1) for d, b, e, k, dl in zip(sizes, pb, pe, KERNEL, DILATIONS)]
    return None if min(spans) < 0 else tuple(s // st + 1 for s, st in zip(spans, STRIDES))


def accepted(auto_pad: str, rank: int) -> list[list[int]]:
    """Per axis, by brute force: the diff_dst sizes whose convolution gives IN_T."""
    per_axis = []
    for axis in range(rank):
        sizes = []
        for d in range(1, 60):
            probe = tuple(d if a == axis else 1 for a in range(rank))
            pb, pe = _pads(auto_pad, probe, rank)
            span = d + pb[axis] + pe[axis] - ((KERNEL[axis] - 1) * DILATIONS[axis] + 1)
            if span >= 0 and span // STRIDES[axis] + 1 == IN_T[axis]:
                sizes.append(d)
        per_axis.append(sizes)
    return per_axis


def sweep(auto_pad: str, rank: int) -> list[tuple[int, ...]]:
    """Each axis through its whole range and one size beyond either end (the others in range),
    and all axes together."""
    good = accepted(auto_pad, rank)
    candidates = [list(range(max(1, g[0] - 1), g[-1] + 2)) for g in good]
    sizes = {tuple(g[0] for g in good[:a]) + (d,) + tuple(g[-1] for g in good[a + 1:])
             for a, c in enumerate(candidates) for d in c}
    sizes |= {tuple(c[min(j, len(c) - 1)] for c in candidates) for j in range(max(map(len, candidates)))}
    return sorted(sizes)


def test_the_range_is_s_sizes_wide_and_starts_at_the_formula():
    for auto_pad, rank in itertools.product(AUTO_PADS, (1, 2, 3)):
        for axis, sizes in enumerate(accepted(auto_pad, rank)):
            s, ek = STRIDES[axis], (KERNEL[axis] - 1) * DILATIONS[axis] + 1
            assert sizes == list(range(sizes[0], sizes[0] + s)), (auto_pad, axis, sizes)
            if auto_pad == "none":
                assert sizes[0] == s * (IN_T[axis] - 1) + ek - 2 * PADS[axis]
            elif auto_pad == "valid":
                assert sizes[0] == s * (IN_T[axis] - 1) + ek
            else:
                assert sizes == list(range(s * (IN_T[axis] - 1) + 1, s * IN_T[axis] + 1))


def _case(kind: str, auto_pad: str, sizes: tuple[int, ...], rng: np.random.Generator) -> Case:
    rank = len(sizes)
    pb, pe = _pads(auto_pad, sizes, rank)
    geom = Geometry(N, GROUPS, ICG, OCG, sizes, KERNEL[:rank], STRIDES[:rank], DILATIONS[:rank], pb, pe)
    # below S it narrows nothing (under same_* a non-zero one keeps the forward's pads: test_output_padding.py)
    output_padding = [int(rng.integers(0, STRIDES[a])) if auto_pad in ("none", "valid") else 0 for a in range(rank)]
    return Case(kind, geom, ("NCX", "NXC")[rng.integers(2)], WEIGHTS_FORMATS[kind][rng.integers(2)], auto_pad,
                shape_via=("input", "attr")[rng.integers(2)], extra_attrs={"output_padding": output_padding})


@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("rank", (1, 2, 3))
@pytest.mark.parametrize("kind", KINDS)
def test_every_size_in_the_range_and_just_outside(kind, rank, auto_pad):
    """In range: the op runs and matches torch (the forward-convolution relation, random layouts)
    on both engines. Outside: ConvTransposeBackwardWeights refuses with the range in the message;
    ConvTransposeBackwardData (whose diff_src size follows from diff_dst) gives another size."""
    rng, seed = fresh_rng()
    good = accepted(auto_pad, rank)
    lo, hi = [g[0] for g in good], [g[-1] for g in good]
    seen = set()
    for sizes in sweep(auto_pad, rank):
        inside = all(d in g for d, g in zip(sizes, good))
        seen.add(inside)
        case = _case(kind, auto_pad, sizes, rng)
        out = _out_size(auto_pad, sizes)
        if inside or (kind == "ConvTransposeBackwardData" and out is not None):
            assert (out == IN_T[:rank]) == inside
            results = torch_results(case.geom, random_tensors(case.geom, rng))
            for engine in ("fast", "reference"):
                check(case, results, seed, engine=engine)
            continue
        y_shape = (N, GROUPS * OCG, *IN_T[:rank])
        x_shape = (N, GROUPS * ICG, *sizes)
        src, diff_dst = rng.standard_normal(y_shape), rng.standard_normal(x_shape)
        if kind == "ConvTransposeBackwardData":
            w = rng.standard_normal((GROUPS * OCG, ICG, *KERNEL[:rank]))
            call = lambda: cg.conv_transpose_backward_data(  # noqa: E731
                diff_dst, w, strides=STRIDES[:rank], dilations=DILATIONS[:rank], pads_begin=PADS[:rank],
                pads_end=PADS[:rank], auto_pad=auto_pad, data_format="NCX", weights_format="IOX")
        else:
            call = lambda: cg.conv_transpose_backward_weights(  # noqa: E731
                src, diff_dst, (GROUPS * OCG, ICG, *KERNEL[:rank]), strides=STRIDES[:rank],
                dilations=DILATIONS[:rank], pads_begin=PADS[:rank], pads_end=PADS[:rank], auto_pad=auto_pad,
                groups=GROUPS, data_format="NCX", weights_format="IOX")
        with pytest.raises(cg.ShapeError) as info:
            call()
        message = str(info.value)
        assert "'diff_dst'" in message and str(list(sizes)) in message, message
        if kind == "ConvTransposeBackwardWeights":
            assert f"from {lo} to {hi}" in message, message
    assert seen == {True, False}


def _torch_transpose(src: torch.Tensor, w: torch.Tensor, sizes: tuple[int, ...], pb, pe) -> torch.Tensor:
    """ConvTranspose of ``src`` whose output is cropped to ``sizes``: unpadded with the
    output_padding that reaches PB + sizes, then PB rows cut at the front (any PB, PE)."""
    rank = len(sizes)
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(STRIDES, IN_T, KERNEL, DILATIONS)][:rank]
    extra = [max(0, b + n - f) for b, n, f in zip(pb, sizes, full)]
    transpose = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[rank]
    out = transpose(src, w, stride=STRIDES[:rank], output_padding=extra, groups=GROUPS, dilation=DILATIONS[:rank])
    return out[(slice(None), slice(None), *(slice(b, b + n) for b, n in zip(pb, sizes)))]


@pytest.mark.parametrize("auto_pad", AUTO_PADS)
@pytest.mark.parametrize("rank", (1, 2, 3))
def test_torch_conv_transpose_gradients_and_adjointness(rank, auto_pad):
    """For every size in the range: torch's ConvTranspose (output_padding = the extra rows) and its
    autograd give both ops; and <ConvTranspose(src, w), diff_dst> = <src, ConvTransposeBackwardData(
    diff_dst, w)> = <ConvTransposeBackwardWeights(src, diff_dst), w> with convgrad's ConvTranspose,
    whose output_padding is D - (S*(I-1) + EK - PB - PE)."""
    rng, seed = fresh_rng()
    good = accepted(auto_pad, rank)
    for sizes in itertools.product(*good):
        pb, pe = _pads(auto_pad, sizes, rank)
        attrs = dict(strides=STRIDES[:rank], dilations=DILATIONS[:rank], pads_begin=PADS[:rank], pads_end=PADS[:rank],
                     auto_pad=auto_pad, groups=GROUPS, data_format="NCX", weights_format="IOX")
        src = rng.uniform(-1, 1, (N, GROUPS * OCG, *IN_T[:rank]))
        w = rng.uniform(-1, 1, (GROUPS * OCG, ICG, *KERNEL[:rank]))
        diff_dst = rng.uniform(-1, 1, (N, GROUPS * ICG, *sizes))
        diff_src = cg.conv_transpose_backward_data(diff_dst, w, **attrs)
        diff_weights = cg.conv_transpose_backward_weights(src, diff_dst, w.shape, **attrs)

        ts, tw = (torch.tensor(a, requires_grad=True) for a in (src, w))
        out = _torch_transpose(ts, tw, sizes, pb, pe)
        assert tuple(out.shape[2:]) == sizes
        (out * torch.tensor(diff_dst)).sum().backward()
        msg = f"sizes={sizes} seed={seed}"
        np.testing.assert_allclose(diff_src, ts.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)
        np.testing.assert_allclose(diff_weights, tw.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)

        extra = [d - (s * (i - 1) + (k - 1) * dl + 1 - b - e)
                 for d, s, i, k, dl, b, e in zip(sizes, STRIDES, IN_T, KERNEL, DILATIONS, pb, pe)]
        assert all(0 <= x < s for x, s in zip(extra, STRIDES)), extra
        dst = cg.conv_transpose(src, w, **dict(attrs, auto_pad="none", pads_begin=pb, pads_end=pe,
                                               output_padding=extra))
        assert dst.shape == diff_dst.shape
        product = float(np.sum(dst * diff_dst))
        scale = math.prod(diff_dst.shape) * 1e-12
        assert abs(product - float(np.sum(src * diff_src))) <= scale, msg
        assert abs(product - float(np.sum(diff_weights * w))) <= scale, msg


def test_extra_rows_get_no_gradient_and_add_nothing():
    """The rows past S*(I-1) + EK - PB - PE: zero in ConvTransposeBackwardData's diff_dst
    sensitivity (changing them changes nothing) and in ConvTransposeBackwardWeights' sums."""
    rng, _ = fresh_rng()
    attrs = dict(strides=[2, 2], auto_pad="valid", data_format="NXC")
    w = rng.standard_normal((3, 3, 4, 5))  # XOI: diff_dst 4 channels, src 5
    diff_dst = rng.standard_normal((2, 16, 16, 4))
    src = rng.standard_normal((2, 7, 7, 5))
    changed = diff_dst.copy()
    changed[:, 15, :] = rng.standard_normal((2, 16, 4))
    changed[:, :, 15] = rng.standard_normal((2, 16, 4))
    for engine in ("fast", "reference"):
        first = cg.conv_transpose_backward_data(diff_dst, w, **attrs, engine=engine)
        assert first.shape == (2, 7, 7, 5)  # oneDNN's graph case: diff_src 7x7 from a 16x16 diff_dst
        np.testing.assert_array_equal(cg.conv_transpose_backward_data(changed, w, **attrs, engine=engine), first)
        np.testing.assert_array_equal(cg.conv_transpose_backward_weights(src, changed, w.shape, **attrs, engine=engine),
                                      cg.conv_transpose_backward_weights(src, diff_dst, w.shape, **attrs,
                                                                         engine=engine))
