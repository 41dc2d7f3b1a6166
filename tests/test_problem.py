"""Shape inference's small functions (convgrad.problem) with expected values written out by hand
from docs/semantics.md, and its messages word for word: each kills mutants that the op-level
tests let through (docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest

import convgrad as cg
from convgrad import problem


@pytest.mark.parametrize("mode,in_size,strides,eff,begin,end", [
    ("valid", (7, 8), (2, 3), (3, 5), (0, 0), (0, 0)),
    # same_*: total = max(0, EK - S) if I % S == 0 else max(0, EK - I % S)
    ("same_upper", (8,), (2,), (5,), (1,), (2,)),      # 8 % 2 = 0: total 3, odd extra at the end
    ("same_lower", (8,), (2,), (5,), (2,), (1,)),      # odd extra at the beginning
    ("same_upper", (7,), (2,), (5,), (2,), (2,)),      # 7 % 2 = 1: total 4
    ("same_upper", (7,), (3,), (2,), (0,), (1,)),      # 7 % 3 = 1: total 1
    ("same_lower", (7,), (3,), (2,), (1,), (0,)),
    ("same_upper", (9,), (3,), (2,), (0,), (0,)),      # EK < S: no padding
    ("same_upper", (7,), (4,), (2,), (0,), (0,)),      # 7 % 4 = 3 > EK: no padding
    ("same_upper", (4, 5), (1, 1), (3, 4), (1, 1), (1, 2)),
    ("same_lower", (4, 5), (1, 1), (3, 4), (1, 2), (1, 1)),
    ("same_upper", None, (2,), (5,), (1,), (2,)),       # ConvTranspose: max(0, EK - S) = 3
    ("same_lower", None, (3,), (2,), (0,), (0,)),
])
def test_auto_pads(mode, in_size, strides, eff, begin, end) -> None:
    assert problem.auto_pads(mode, in_size, strides, eff) == (begin, end)


@pytest.mark.parametrize("out,strides,eff,pb,pe,mode,expected", [
    # floor((I + PB + PE - EK) / S) + 1 = O for I from S*(O-1) + EK - PB - PE, S - 1 more
    ((4,), (2,), (3,), (1,), (0,), "none", ((8,), (9,))),
    ((3, 2), (1, 3), (2, 4), (0, 1), (2, 0), "none", ((2, 6), (2, 8))),
    # valid: the pads are 0 whatever is given
    ((4,), (2,), (3,), (1,), (2,), "valid", ((9,), (10,))),
    # same_*: O = ceil(I / S)
    ((4,), (3,), (5,), (9,), (9,), "same_upper", ((10,), (12,))),
    ((1,), (1,), (3,), (0,), (0,), "same_lower", ((1,), (1,))),
    # a lower bound below 1 is raised to 1 where the upper one allows ...
    ((1,), (2,), (1,), (1,), (0,), "none", ((1,), (1,))),        # lo 0, hi 1
    ((1,), (3,), (1,), (2,), (1,), "none", ((-2,), (0,))),       # lo -2, hi 0: no size fits, kept
    ((1,), (2,), (1,), (3,), (1,), "none", ((-3,), (-2,))),
    ((1,), (4,), (2,), (0,), (2,), "none", ((1,), (3,))),        # lo 0, hi 3
])
def test_input_size_range(out, strides, eff, pb, pe, mode, expected) -> None:
    assert problem.input_size_range(out, strides, eff, pb, pe, mode) == expected


def test_shape_layouts() -> None:
    assert problem.data_shape(2, 3, (4, 5), "NCX") == (2, 3, 4, 5)
    assert problem.data_shape(2, 3, (4, 5), "NXC") == (2, 4, 5, 3)
    assert problem.split_data_shape((2, 3, 4, 5), "NCX") == (2, 3, (4, 5))
    assert problem.split_data_shape((2, 4, 5, 3), "NXC") == (2, 3, (4, 5))
    assert problem.weights_shape(6, 2, (3, 4), "OIX") == (6, 2, 3, 4)
    assert problem.weights_shape(6, 2, (3, 4), "IOX") == (6, 2, 3, 4)
    assert problem.weights_shape(6, 2, (3, 4), "XIO") == (3, 4, 2, 6)
    assert problem.weights_shape(6, 2, (3, 4), "XOI") == (3, 4, 2, 6)
    assert problem.split_weights_shape((6, 2, 3, 4), "OIX") == (6, 2, (3, 4))
    assert problem.split_weights_shape((3, 4, 2, 6), "XIO") == (6, 2, (3, 4))


@pytest.mark.parametrize("kwargs,shapes,message", [
    (dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[1]), ((1, 4, 2), (3, 2, 2, 5)),
     "inputs and attributes disagree on the spatial rank: 'src' has 1 spatial axis, 'weights' 2, 'strides' 1 value "
     "([1]), 'pads_begin' 1 value ([0]), 'pads_end' 1 value ([0]), 'dilations' 1 value ([1])"),
    (dict(strides=[1, 1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1]), ((1, 4, 4, 2), (3, 3, 2, 2)),
     "attribute 'strides' = [1, 1, 1]: expected 2 values, one per spatial axis of the 2-D problem (inputs and "
     "attributes disagree on the spatial rank: 'src' has 2 spatial axes, 'weights' 2, 'strides' 3 values ([1, 1, 1]), "
     "'pads_begin' 2 values ([0, 0]), 'pads_end' 2 values ([0, 0]), 'dilations' 2 values ([1, 1]))"),
])
def test_rank_disagreement_messages(kwargs, shapes, message) -> None:
    with pytest.raises(cg.ConvgradError) as info:
        cg.Op("Convolution", **kwargs).infer(*shapes)
    assert str(info.value) == f"Convolution: {message}"


def test_problem_tensor_shapes_and_repr() -> None:
    p = cg.Op("ConvolutionBackwardWeights", strides=[2, 1], pads_begin=[1, 0], pads_end=[0, 2], dilations=[1, 1],
              groups=2, data_format="NCX", weights_format="OIX").infer((3, 4, 7, 6), (3, 6, 3, 7), [6, 2, 3, 2])
    assert p.tensor_shapes() == {"src": (3, 4, 7, 6), "diff_dst": (3, 6, 3, 7), "diff_weights": (6, 2, 3, 2)}
    g = p.geometry
    assert (g.n, g.groups, g.ic, g.oc, g.icg, g.ocg) == (3, 2, 4, 6, 2, 3)
    assert (g.in_size, g.out_size, g.padded_size, g.effective_kernel) == ((7, 6), (3, 7), (8, 8), (3, 2))
    assert g.flops == 2 * 3 * 6 * 2 * 6 * 21
    assert repr(p) == ("Problem(ConvolutionBackwardWeights: diff_weights (6, 2, 3, 2) f32, pads_begin=[1, 0], "
                       "pads_end=[0, 2], groups=2, NCX/OIX)")


@pytest.mark.parametrize("shapes,message", [
    (((1, 4, 4, 2), (0, 2, 3, 3)), "input 'weights' has shape [0, 2, 3, 3]: expected positive sizes"),
    (((1, 4, 4, 2), (3, 2, 3, 0)), "input 'weights' has shape [3, 2, 3, 0]: expected positive sizes"),
    (((1, 4, 4, 0), (3, 2, 3, 3)), "input 'src' has shape [1, 4, 4, 0]: expected positive sizes (a batch of 0 is "
                                   "allowed)"),
    (((1, 0, 4, 2), (3, 2, 3, 3)), "input 'src' has shape [1, 0, 4, 2]: expected positive sizes (a batch of 0 is "
                                   "allowed)"),
])
def test_zero_sizes_are_refused_but_a_zero_batch(shapes, message) -> None:
    op = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
               weights_format="OIX")
    with pytest.raises(cg.ShapeError) as info:
        op.infer(*shapes)
    assert str(info.value) == f"Convolution: {message}"
    assert op.infer((0, 4, 4, 2), (3, 2, 3, 3)).output_shape == (0, 2, 2, 3)


def test_bias_rank_and_dtype_messages() -> None:
    op = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    x, w = np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 2), np.float32)
    with pytest.raises(cg.ShapeError) as info:
        op(x, w, np.ones((2, 1), np.float32))
    assert str(info.value) == "Convolution: input 'bias' has shape [2, 1] (rank 2): expected rank 1"
    with pytest.raises(cg.DTypeError) as info:
        op(x, w.astype(np.float16))
    assert str(info.value) == ("Convolution: input 'weights' has dtype f16: expected f32 like input 'src' (all data "
                               "inputs share a dtype)")
