"""Every ConvTranspose the forward accepts has both gradients (issue 23, docs/semantics.md
"output_padding"): output_padding P at or above the stride (PyTorch allows P < max(S, D)) and
beyond, every auto_pad mode, 1-3 spatial axes, groups, both layouts.

The adjoint identity in f64 on both engines,
    <conv_transpose(x, w), dy> = <x, conv_transpose_backward_data(dy, w)>
                               = <w, conv_transpose_backward_weights(x, dy)>,
the three ops refusing together what none accepts, and ``convgrad.torch`` against PyTorch for
every output_padding PyTorch accepts.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convgrad as cg

from reliability_support import examples

AUTO_PADS = ("none", "valid", "same_upper", "same_lower")
#: 30 examples per property in the default suite (each new shape compiles kernel variants: 18 s of
#: a cold suite at 50 on a Zen 3); ``make test-all`` 50, ``CONVGRAD_FUZZ_EXAMPLES`` that many.
SETTINGS = settings(max_examples=examples(30, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _vdot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.vdot(a.astype(np.float64), b.astype(np.float64)))


def test_the_issue_example():
    x, w = np.array([[[1.0, 2.0]]]), np.array([[[1.0, 10.0]]])
    kw = dict(strides=[1], dilations=[2], output_padding=[1], data_format="NCX", weights_format="IOX")
    y = cg.conv_transpose(x, w, **kw)
    np.testing.assert_array_equal(y, [[[1, 2, 10, 20, 0]]])
    dy = np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
    np.testing.assert_array_equal(cg.conv_transpose_backward_data(dy, w, **kw), [[[1 + 30, 2 + 40]]])
    np.testing.assert_array_equal(cg.conv_transpose_backward_weights(x, dy, [1, 1, 2], **kw),
                                  [[[1 + 4, 3 + 8]]])


@st.composite
def problems(draw):
    """A random ConvTranspose: P up to max(S, D) + 1 (PyTorch's bound and beyond), random pads,
    auto_pad, groups, layouts."""
    rank = draw(st.integers(1, 3))
    ax = lambda lo, hi: tuple(draw(st.integers(lo, hi)) for _ in range(rank))  # noqa: E731
    strides, dilations, kernel = ax(1, 3), ax(1, 3), ax(1, 3)
    output_padding = tuple(draw(st.integers(0, max(s, d) + 1)) for s, d in zip(strides, dilations))
    src_size = ax(1, 4 if rank < 3 else 3)
    groups, icg, ocg = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs = dict(strides=list(strides), dilations=list(dilations), output_padding=list(output_padding),
                 pads_begin=list(ax(0, 2)), pads_end=list(ax(0, 2)), groups=groups,
                 auto_pad=draw(st.sampled_from(AUTO_PADS)), data_format=draw(st.sampled_from(("NCX", "NXC"))),
                 weights_format=draw(st.sampled_from(("IOX", "XOI"))))
    n = draw(st.integers(1, 2))
    x_shape = (n, groups * icg, *src_size) if attrs["data_format"] == "NCX" else (n, *src_size, groups * icg)
    w_shape = (groups * icg, ocg, *kernel) if attrs["weights_format"] == "IOX" else (*kernel, ocg, groups * icg)
    return attrs, x_shape, w_shape


@SETTINGS
@given(problems())
def test_adjoint_identity_for_every_output_padding(problem):
    attrs, x_shape, w_shape = problem
    rng = np.random.default_rng()
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    try:
        y = cg.conv_transpose(x, w, engine="reference", **attrs)
    except cg.ConvgradError as exc:  # an output size below 1: nothing to differentiate
        assert "must be positive" in str(exc)
        return
    dy = rng.standard_normal(y.shape)
    for engine in ("reference", "fast"):
        np.testing.assert_allclose(cg.conv_transpose(x, w, engine=engine, **attrs), y, rtol=1e-12, atol=1e-12)
        dx = cg.conv_transpose_backward_data(dy, w, engine=engine, **attrs)
        dw = cg.conv_transpose_backward_weights(x, dy, w.shape, engine=engine, **attrs)
        assert dx.shape == x.shape and dw.shape == w.shape
        scale = np.abs(y).sum() * np.abs(dy).max() + 1
        assert abs(_vdot(y, dy) - _vdot(x, dx)) <= 1e-12 * scale
        assert abs(_vdot(y, dy) - _vdot(w, dw)) <= 1e-12 * scale


def test_output_padding_at_or_above_the_stride_takes_the_forwards_size_exactly():
    """S=1, D=2, P=1: the forward's diff_dst is 5 for src 2. The gradients accept 5 and refuse 4 and
    6 (no src size gives them with P=1) with the rule and the sizes."""
    kw = dict(strides=[1], dilations=[2], output_padding=[1], data_format="NCX", weights_format="IOX")
    w, x = np.ones((1, 1, 2)), np.ones((1, 1, 2))
    for size in (4, 6):
        dy = np.ones((1, 1, size))
        with pytest.raises(cg.ShapeError, match=rf"'diff_dst' has spatial size \[{size}\]: expected a size from "
                           r"\[5\] to \[5\]"):
            cg.conv_transpose_backward_weights(x, dy, [1, 1, 2], **kw)
        if size == 6:  # 6 = S*(3-1) + 3 + 1: src 3
            assert cg.conv_transpose_backward_data(dy, w, **kw).shape == (1, 1, 3)
    kw["output_padding"], kw["strides"] = [3], [2]  # S=2, P=3: D = 2*(I-1) + 3 + 3 is even
    with pytest.raises(cg.ShapeError, match=r"'diff_dst' has spatial size \[9\]: no ConvTranspose input size"):
        cg.conv_transpose_backward_data(np.ones((1, 1, 9)), w, **kw)
    assert cg.conv_transpose_backward_data(np.ones((1, 1, 10)), w, **kw).shape == (1, 1, 3)


@pytest.mark.parametrize("kind", ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"))
def test_what_none_accepts_all_three_refuse_alike(kind):
    attrs = dict(strides=[2], dilations=[1], output_padding=[-1], data_format="NCX", weights_format="IOX")
    with pytest.raises(cg.AttributeValueError, match=f"^{kind}: attribute 'output_padding' = \\[-1\\]"):
        cg.Op(kind, pads_begin=[0], pads_end=[0], **attrs)


torch = pytest.importorskip("torch")
F = torch.nn.functional


def _torch_cases():
    """Every output_padding PyTorch accepts (P < max(S, D)) for S, D in 1..3 (1-D, K=2), and
    PyTorch's own 2-D/3-D case (stride (3, 2, 1), dilation 4, output_padding (2, 3, 1), groups 2)."""
    for s, d in itertools.product((1, 2, 3), repeat=2):
        for p in range(max(s, d)):
            yield (s,), (d,), (p,), (2,), (3,), 1
    yield (3, 2), (4, 4), (2, 3), (2, 3), (3, 2), 2
    yield (3, 2, 1), (4, 4, 4), (2, 3, 1), (2, 2, 2), (2, 3, 2), 2


@pytest.mark.parametrize("strides, dilations, output_padding, kernel, size, groups", list(_torch_cases()))
def test_convgrad_torch_matches_pytorch(strides, dilations, output_padding, kernel, size, groups):
    import convgrad.torch as ct

    rank = len(strides)
    x = torch.randn(2, 2 * groups, *size, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2 * groups, 3, *kernel, dtype=torch.float64, requires_grad=True)
    pads = [1] * rank
    ref = getattr(F, f"conv_transpose{rank}d")(x, w, stride=strides, padding=pads, output_padding=output_padding,
                                               groups=groups, dilation=dilations)
    got = ct.conv_transpose(x, w, strides=strides, dilations=dilations, output_padding=output_padding,
                            pads_begin=pads, pads_end=pads, groups=groups, data_format="NCX", weights_format="IOX")
    torch.testing.assert_close(got, ref)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (x, w), g)
    got_grads = torch.autograd.grad(got, (x, w), g)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b)
