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


_PLAIN = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
_T2 = dict(strides=[2, 2], pads_begin=[1, 0], pads_end=[0, 0], dilations=[1, 1])


@pytest.mark.parametrize("args,expected", [
    # where output_padding P >= S: D = S*(I-1) + EK - PB - PE + P exactly (here 2*6 + 3 - 1 + 2 = 16)
    ((16, 2, 3, 1, 0, 2), 7),
    ((17, 2, 3, 1, 0, 2), None),   # 17 - 2 + 1 - 3 = 13: not a multiple of S
    ((19, 2, 3, 1, 0, 3), 8),      # P = 3 > S
    # where P < S: I = floor((D + PB + PE - EK) / S) + 1 for every D of the range
    ((16, 2, 3, 1, 0, 1), 8), ((15, 2, 3, 1, 0, 0), 7), ((14, 2, 3, 1, 0, 1), 7),
    ((3, 2, 3, 0, 0, 0), 1),
    ((2, 2, 3, 0, 0, 0), None),    # D + PB + PE - EK = -1: no I >= 1
])
def test_transposed_input_size(args, expected) -> None:
    assert problem.transposed_input_size(*args) == expected


@pytest.mark.parametrize("out,mode,output_padding,expected", [
    # P >= S: exactly S*(O-1) + EK - PB - PE + P (S 2, EK 3, PB 1, PE 0, O = 7)
    ((7,), "none", (2,), ((16,), (16,))),
    ((7,), "none", (3,), ((17,), (17,))),
    # P < S: from S*(O-1) + EK - PB - PE, S - 1 more
    ((7,), "none", (1,), ((14,), (15,))),
    # same_*: P != 0 keeps the ConvTranspose's own pads, max(0, EK - S) = 1 in all; P = 0 follows D
    ((4,), "same_upper", (1,), ((8,), (9,))),
    ((4,), "same_upper", (0,), ((7,), (8,))),
])
def test_input_size_range_with_output_padding(out, mode, output_padding, expected) -> None:
    assert problem.input_size_range(out, (2,), (3,), (1,), (0,), mode, output_padding) == expected


def test_transposed_gradient_auto_pad_keeps_the_forward_pads_where_output_padding_is_given() -> None:
    """ConvTransposeBackwardData, diff_dst 9x9, S 2, EK 3, same_upper: axis 0 (P 0) takes pads
    that follow D (9 % 2 = 1: total EK - 1 = 2, (1, 1)), axis 1 (P 1) the ConvTranspose's own
    (max(0, EK - S) = 1: (0, 1)); the sizes follow: floor((9 + 2 - 3) / 2) + 1 = 5, (9 + 1 - 3) // 2 + 1 = 4."""
    p = cg.Op("ConvTransposeBackwardData", strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
              output_padding=[0, 1], auto_pad="same_upper").infer((1, 9, 9, 4), (3, 3, 4, 2))
    assert (p.pads_begin, p.pads_end, p.output_shape) == ((1, 0), (1, 1), (1, 5, 4, 2))


def test_sizes_of_one_are_accepted() -> None:
    """A window exactly as large as the padded input (output size 1), a ConvTranspose output of 1, a
    weights shape starting with 1."""
    conv = cg.Op("Convolution", strides=[1, 1], pads_begin=[1, 0], pads_end=[0, 0], dilations=[1, 1])
    assert conv.infer((1, 2, 3, 2), (3, 2, 2, 3)).output_shape == (1, 1, 2, 3)
    assert cg.Op("ConvTranspose", **_PLAIN).infer((1, 1, 1, 3), (1, 1, 2, 3)).output_shape == (1, 1, 1, 2)
    # a weights shape whose first value is 1 (XIO: a 1-row kernel; one output channel in OIX)
    for fmt, shape in (("XIO", [1, 1, 2, 1]), ("OIX", [1, 2, 1, 1])):
        grad = cg.Op("ConvolutionBackwardWeights", weights_shape=shape, weights_format=fmt, **_PLAIN)
        assert grad.infer((1, 6, 6, 2), (1, 6, 6, 1)).output_shape == tuple(shape)


def test_defaults_and_the_functional_apis_omitted_lists() -> None:
    """data_format defaults to NXC; the functional API fills omitted strides, pads and dilations
    (1, 0, 1); has_bias says whether a bias was given."""
    p = cg.Op("Convolution", **_PLAIN).infer((1, 6, 6, 2), (3, 3, 2, 3))
    assert (p.data_format, p.weights_format, p.has_bias) == ("NXC", "XIO", False)
    assert cg.Op("Convolution", **_PLAIN).infer((1, 6, 6, 2), (3, 3, 2, 3), (3,)).has_bias
    rng = np.random.default_rng()
    x, w = rng.standard_normal((1, 6, 5, 2)).astype(np.float32), rng.standard_normal((3, 2, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(cg.convolution(x, w, engine="reference"),
                                  cg.convolution(x, w, engine="reference", **_PLAIN))
    assert cg.convolution(x, w).shape == (1, 4, 4, 3)


@pytest.mark.parametrize("kind,shapes,attrs,message", [
    ("Convolution", ((1, 3, 3, 3), (3, 3, 3), (3,), (3,)), dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[1]),
     "takes at most 3 inputs (src, weights, bias); 4 were given"),
    ("Convolution", ((1, 3, 3, 3),), dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[1]),
     "input 'weights' is required but was not given"),
    ("Convolution", ((1, 3, 3, 3, 3, 3), (3, 3, 3)), dict(strides=[1], pads_begin=[0], pads_end=[0], dilations=[1]),
     "input 'src' has shape [1, 3, 3, 3, 3, 3] (rank 6): expected rank 3, 4 or 5 (N, C and 1, 2 or 3 spatial axes)"),
    # the shape of the output, given as attribute or input 2
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), _PLAIN,
     "input 'dst_shape' is missing: give it as input 2 or as attribute 'dst_shape' (the shape of diff_src)"),
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 6]),
     "attribute 'dst_shape' = [1, 6]: expected 4 positive sizes (the NXC shape of diff_src for a 2-D problem, a "
     "batch of 0 is allowed)"),
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 6, 6]),
     "inputs and attributes disagree on the spatial rank: 'diff_dst' has 2 spatial axes, 'weights' 2, 'dst_shape' 1 "
     "([1, 6, 6]), 'strides' 2 values ([1, 1]), 'pads_begin' 2 values ([0, 0]), 'pads_end' 2 values ([0, 0]), "
     "'dilations' 2 values ([1, 1])"),
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 0, 6, 2]),
     "attribute 'dst_shape' = [1, 0, 6, 2]: expected 4 positive sizes (the NXC shape of diff_src for a 2-D problem, "
     "a batch of 0 is allowed)"),
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3), [-1, 6, 6, 2]), _PLAIN,
     "input 'dst_shape' = [-1, 6, 6, 2]: expected 4 positive sizes (the NXC shape of diff_src for a 2-D problem, a "
     "batch of 0 is allowed)"),
    ("ConvolutionBackwardWeights", ((1, 6, 6, 2), (1, 4, 4, 3), [0, 3, 2, 3]), _PLAIN,
     "input 'weights_shape' = [0, 3, 2, 3]: expected 4 positive sizes (the XIO shape of diff_weights for a 2-D "
     "problem)"),
    # channels and groups
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 6, 6, 5]),
     "input 'weights' has shape [3, 3, 2, 3] (XIO): its I axis is 2, expected 5 / groups = 5 (the channels of "
     "'dst_shape' divided by groups=1)"),
    ("ConvolutionBackwardData", ((1, 4, 4, 0), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 6, 6, 2]),
     "input 'diff_dst' has shape [1, 4, 4, 0]: expected positive sizes (a batch of 0 is allowed)"),
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 6, 6, 2], data_format="NCX"),
     "input 'weights' has shape [3, 3, 2, 3] (XIO): its O axis is 3, expected 4, the channels of 'diff_dst' (did "
     "you mean data_format='NXC'?)"),
    ("ConvTranspose", ((1, 6, 6, 4), (3, 3, 2, 5)), _PLAIN,
     "input 'weights' has shape [3, 3, 2, 5] (XOI): its I axis is 5, expected 4, the channels of 'src'"),
    ("ConvTransposeBackwardData", ((1, 9, 9, 2), (3, 3, 4, 2)), dict(_PLAIN, strides=[2, 2]),
     "input 'weights' has shape [3, 3, 4, 2] (XOI): its O axis is 4, expected 2 / groups = 2 (the channels of "
     "'diff_dst' divided by groups=1)"),
    ("Convolution", ((1, 6, 6, 4), (3, 3, 2, 6)), dict(_PLAIN, groups=4),
     "attribute 'groups' = 4: expected a divisor of the 6 channels of 'dst'"),
    ("ConvolutionBackwardData", ((1, 4, 4, 6), (3, 3, 2, 6)), dict(_PLAIN, dst_shape=[1, 6, 6, 4], groups=4),
     "attribute 'groups' = 4: expected a divisor of the 6 channels of 'diff_dst'"),
    ("Convolution", ((1, 6, 6, 9), (3, 3, 2, 6)), dict(_PLAIN, groups=2),
     "attribute 'groups' = 2: expected a divisor of the 9 channels of 'src'"),
    ("Convolution", ((1, 6, 6, 6), (3, 3, 2, 6)), dict(_PLAIN, groups=2),
     "input 'weights' has shape [3, 3, 2, 6] (XIO): its I axis is 2, expected 6 / groups = 3 (the channels of 'src' "
     "divided by groups=2)"),
    # spatial sizes
    ("ConvolutionBackwardData", ((1, 4, 4, 3), (3, 3, 2, 3)), dict(_PLAIN, dst_shape=[1, 2, 6, 2]),
     "input 'dst_shape' has spatial size [2, 6]: with pads_begin [0, 0], pads_end [0, 0] and effective kernel [3, 3] "
     "(dilations applied) the output size would be below 1"),
    ("ConvTranspose", ((1, 1, 1, 3), (1, 1, 2, 3)), dict(_PLAIN, pads_begin=[1, 0]),
     "input 'src' has spatial size [1, 1]: the output size S*(I-1) + EK - PB - PE + output_padding = [0, 1] must be "
     "positive (did you mean data_format='NCX', weights_format='IOX'?)"),
    ("ConvTransposeBackwardData", ((1, 9, 9, 4), (3, 3, 4, 2)),
     dict(_PLAIN, strides=[2, 2], output_padding=[2, 1], auto_pad="same_upper"),
     "input 'diff_dst' has spatial size [9, 9]: no ConvTranspose input size I gives it as D = S*(I-1) + EK - PB - PE "
     "+ P, I >= 1 (P = output_padding where it is >= S, else any P from 0 to S - 1): D + PB + PE - EK - P = [5, 7] "
     "must be >= 0, and a multiple of S where P >= S (S=[2, 2], EK=[3, 3], PB=[0, 0], PE=[1, 1], P=[2, 1])"),
    ("ConvTransposeBackwardWeights", ((1, 7, 8, 2), (1, 3, 3, 4), [3, 3, 4, 2]), dict(_T2, output_padding=[2, 0]),
     "input 'diff_dst' has spatial size [3, 3]: expected a size from [16, 17] to [16, 18] per axis, the sizes D of "
     "the ConvTranspose output for its input size I=[7, 8] of 'src': S*(I-1) + EK - PB - PE + P where output_padding "
     "P >= S, else from S*(I-1) + EK - PB - PE (S*(I-1) + 1 with auto_pad none, whose pads then follow D) up to S - "
     "1 more (the rows an output_padding < S adds); S=[2, 2], EK=[3, 3], PB=[1, 0], PE=[0, 0], P=[2, 0]"),
    # layout hints: PyTorch's layouts first, NCX before NXC, OIX/IOX before XIO/XOI
    ("Convolution", ((1, 3, 6, 6), (4, 3, 3, 3)), _PLAIN,
     "input 'weights' has shape [4, 3, 3, 3] (XIO): its I axis is 3, expected 6 / groups = 6 (the channels of 'src' "
     "divided by groups=1) (did you mean data_format='NCX', weights_format='OIX'?)"),
    ("Convolution", ((1, 6, 6, 3), (5, 3, 2, 2)), _PLAIN,
     "input 'weights' has shape [5, 3, 2, 2] (XIO): its I axis is 2, expected 3 / groups = 3 (the channels of 'src' "
     "divided by groups=1) (did you mean weights_format='OIX'?)"),
    ("Convolution", ((1, 2, 4, 3), (2, 3, 2, 2)), _PLAIN,  # NCX/XIO and NXC/OIX fit: NCX first
     "input 'weights' has shape [2, 3, 2, 2] (XIO): its I axis is 2, expected 3 / groups = 3 (the channels of 'src' "
     "divided by groups=1) (did you mean data_format='NCX'?)"),
    ("Convolution", ((1, 4, 4, 4), (4, 4, 1, 1)), _PLAIN,  # NCX/OIX and NXC/OIX fit
     "input 'weights' has shape [4, 4, 1, 1] (XIO): its I axis is 1, expected 4 / groups = 4 (the channels of 'src' "
     "divided by groups=1) (did you mean data_format='NCX', weights_format='OIX'?)"),
    ("Convolution", ((1, 6, 6, 3), (3, 3, 3, 4)), dict(_PLAIN, data_format="NCX", weights_format="OIX"),
     "input 'weights' has shape [3, 3, 3, 4] (OIX): its I axis is 3, expected 6 / groups = 6 (the channels of 'src' "
     "divided by groups=1) (did you mean data_format='NXC'?)"),
    ("Convolution", ((1, 2, 3, 2), (3, 2, 2, 3)), _PLAIN,
     "input 'src' has spatial size [2, 3]: with pads_begin [0, 0], pads_end [0, 0] and effective kernel [3, 2] "
     "(dilations applied) the output size would be below 1 (did you mean data_format='NCX'?)"),
])
def test_shape_inference_messages(kind, shapes, attrs, message) -> None:
    with pytest.raises(cg.ConvgradError) as info:
        cg.Op(kind, **attrs).infer(*shapes)
    assert str(info.value) == f"{kind}: {message}"


def test_the_functional_api_gets_the_layout_hint() -> None:
    with pytest.raises(cg.ShapeError) as info:
        cg.convolution(np.ones((1, 3, 6, 6), np.float32), np.ones((4, 3, 3, 3), np.float32))
    assert str(info.value).endswith("(did you mean data_format='NCX', weights_format='OIX'?)")


def test_a_shape_input_bears_its_attributes_name() -> None:
    """The rank message names the shape by its attribute (problem._Inference._rank): every op
    with a shape input names it like the attribute that can stand for it."""
    from convgrad.opdefs import OPS
    shaped = [d for d in OPS.values() if any(spec.role == "shape" for spec in d.inputs)]
    assert len(shaped) == 4
    for d in shaped:
        assert [spec.name for spec in d.inputs if spec.role == "shape"] == [d.shape_attr]
