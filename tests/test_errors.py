"""Every error class, triggered realistically through Op(kind, **attrs) and the functional API.

Each check asserts the exception class and that the message names the op, the attribute or input,
and the offending value; and that a failing call leaves its inputs alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import convgrad as cg
from convgrad.opdefs import ops_of

from oracle import (WEIGHTS_FORMATS, Case, Geometry, fresh_rng, function_of, random_tensors, tensor_hash,
                    torch_results)

GEOM = Geometry(n=2, groups=2, icg=2, ocg=3, in_size=(7, 5), kernel=(3, 2), strides=(2, 1), dilations=(1, 2),
                pads_begin=(1, 0), pads_end=(0, 1))  # NXC: x (2, 7, 5, 4), y (2, 3, 4, 6), w XIO (3, 2, 2, 6)


def set_attr(name, value):
    return lambda attrs, inputs: attrs.__setitem__(name, value)


def drop_attr(name):
    return lambda attrs, inputs: attrs.pop(name)


def set_input(index, make):
    return lambda attrs, inputs: inputs.__setitem__(index, make(inputs[index]))


def drop_inputs_from(index):
    return lambda attrs, inputs: inputs.__delitem__(slice(index, None))


BOTH, OP_ONLY, FUNCTIONAL_ONLY = ("op", "functional"), ("op",), ("functional",)
E = cg.errors
ERRORS = [  # (id, kind, mutation, exception, words the message must contain, APIs)
    ("typo", "Convolution", set_attr("stride", [2, 1]), E.UnknownAttributeError, ["'stride'", "[2, 1]"], BOTH),
    ("typo_shape", "ConvolutionBackwardWeights", set_attr("weight_shape", [3, 2, 2, 6]), E.UnknownAttributeError,
     ["'weight_shape'", "[3, 2, 2, 6]"], BOTH),
    ("no_strides", "ConvolutionBackwardData", drop_attr("strides"), E.MissingAttributeError, ["'strides'"],
     OP_ONLY),  # the functional API defaults strides to 1
    ("no_pads", "ConvolutionBackwardData", drop_attr("pads_begin"), E.MissingAttributeError, ["'pads_begin'"],
     OP_ONLY),  # the functional API defaults pads to 0
    ("no_dilations", "ConvTranspose", drop_attr("dilations"), E.MissingAttributeError, ["'dilations'"], OP_ONLY),
    ("float_stride", "Convolution", set_attr("strides", [2.0, 1]), E.AttributeTypeError, ["'strides'", "[2.0, 1]"],
     BOTH),
    ("str_groups", "ConvTranspose", set_attr("groups", "2"), E.AttributeTypeError, ["'groups'", "'2'"], BOTH),
    ("bool_groups", "Convolution", set_attr("groups", True), E.AttributeTypeError, ["'groups'", "True"], BOTH),
    ("zero_stride", "ConvolutionBackwardWeights", set_attr("strides", [0, 1]), E.AttributeValueError,
     ["'strides'", "[0, 1]", "positive"], BOTH),
    ("negative_pad", "ConvTransposeBackwardData", set_attr("pads_end", [0, -1]), E.AttributeValueError,
     ["'pads_end'", "[0, -1]", "non-negative"], BOTH),
    ("auto_pad_same", "ConvolutionBackpropFilters", set_attr("auto_pad", "same"), E.AttributeValueError,
     ["'auto_pad'", "'same'", "same_upper"], BOTH),
    ("data_format", "Convolution", set_attr("data_format", "NHWC"), E.AttributeValueError,
     ["'data_format'", "'NHWC'", "NCX"], BOTH),
    ("weights_format_of_conv", "ConvTranspose", set_attr("weights_format", "OIX"), E.AttributeValueError,
     ["'weights_format'", "'OIX'", "IOX"], BOTH),
    ("groups_divisor", "Convolution", set_attr("groups", 4), E.AttributeValueError, ["'groups'", "4", "6"], BOTH),
    ("output_padding_rank", "ConvTranspose", set_attr("output_padding", [1, 0, 1]), E.AttributeValueError,
     ["'output_padding'", "[1, 0, 1]"], BOTH),
    ("dilations_rank", "ConvolutionBackwardData", set_attr("dilations", [1]), E.AttributeValueError,
     ["'dilations'", "[1]"], BOTH),
    ("long_pads_nonzero_tail", "Convolution", set_attr("pads_begin", [1, 0] + [0] * 9 + [1]), E.AttributeValueError,
     ["'pads_begin'", "[1, 0, 0"], BOTH),
    ("missing_weights", "Convolution", drop_inputs_from(1), E.InputError, ["'weights'", "required"], BOTH),
    ("missing_shape", "ConvolutionBackwardData", drop_inputs_from(2), E.InputError, ["dst_shape", "missing"], BOTH),
    ("zero_shape_attr_is_unset", "ConvolutionBackwardWeights",
     lambda a, i: (drop_inputs_from(2)(a, i), a.__setitem__("weights_shape", [0] * 12)), E.InputError,
     ["weights_shape", "missing"], OP_ONLY),
    ("shape_2d", "ConvolutionBackwardWeights", set_input(2, lambda s: s.reshape(2, 2)), E.InputError,
     ["'weights_shape'", "(2, 2)"], BOTH),
    ("shape_s32", "ConvTransposeBackwardWeights", set_input(2, lambda s: s.astype(np.int64) * 2**31),
     E.InputError, ["'weights_shape'", "s32", str(3 * 2**31)], BOTH),
    ("too_many_inputs", "ConvTransposeBackwardData", lambda a, i: i.append(i[0]), E.InputError, ["at most 2"],
     OP_ONLY),
    ("cropped_diff_dst", "ConvolutionBackwardData", set_input(0, lambda a: a[:, :, :-1]), E.ShapeError,
     ["'diff_dst'", "[3, 3]", "[3, 4]"], BOTH),
    ("padded_diff_dst", "ConvTransposeBackwardWeights", set_input(1, lambda a: np.pad(a, [(0, 0), (0, 1), (0, 0),
     (0, 0)])), E.ShapeError, ["'diff_dst'", "[8, 5]", "[7, 5]"], BOTH),
    ("short_diff_dst", "ConvTransposeBackwardWeights", set_input(1, lambda a: a[:, :-2]), E.ShapeError,
     ["'diff_dst'", "[5, 5]", "from [6, 5] to [7, 5]"], BOTH),
    ("weights_channels", "ConvolutionBackwardData", set_input(1, lambda w: w[..., :-1]), E.ShapeError,
     ["'weights'", "[3, 2, 2, 5]", "O axis is 5, expected 6"], BOTH),
    ("weights_in_channels", "ConvTransposeBackwardData", set_input(1, lambda w: w[..., :1, :]), E.ShapeError,
     ["'weights'", "[3, 2, 1, 6]", "O axis is 1, expected 4 / groups = 2"], BOTH),
    ("groups_vs_weights", "Convolution", set_input(1, lambda w: w[..., :-1]), E.AttributeValueError,
     ["'groups'", "2", "5 channels"], BOTH),
    ("rank", "Convolution", set_input(0, lambda x: x[..., None, None]), E.ShapeError, ["'src'", "rank 6"], BOTH),
    ("batch", "ConvolutionBackpropFilters", set_input(1, lambda y: y[:1]), E.ShapeError,
     ["'output_delta'", "batch 1", "2"], BOTH),
    ("shape_length", "ConvolutionBackwardData", set_input(2, lambda s: s[:3]), E.ShapeError,
     ["'dst_shape'", "[2, 7, 5]"], BOTH),
    ("bias", "ConvTranspose", set_input(2, lambda b: b[:-1]), E.ShapeError, ["'bias'", "[3]", "[4]"], BOTH),
    ("output_too_small", "Convolution", set_attr("dilations", [4, 2]), E.ShapeError,
     ["'src'", "[7, 5]", "[9, 3]"], BOTH),
    ("ragged", "Convolution", set_input(0, lambda x: [[1.0, 2.0], [3.0]]), E.InputTypeError, ["'src'", "[3.0]"],
     BOTH),
    ("too_many_positional", "ConvolutionBackwardData", lambda a, i: i.append(i[0]), E.InputTypeError,
     ["convolution_backward_data", "positional"], FUNCTIONAL_ONLY),
    ("int_data", "ConvolutionBackwardWeights", set_input(0, lambda x: x.astype(np.int32)), E.DTypeError,
     ["'src'", "int32"], BOTH),
    ("mixed_dtypes", "ConvTransposeBackwardData", set_input(1, lambda w: w.astype(np.float32)), E.DTypeError,
     ["'weights'", "f32", "f64"], BOTH),
    ("float_shape", "ConvolutionBackwardData", set_input(2, lambda s: s.astype(np.float32)), E.DTypeError,
     ["'dst_shape'", "float32"], BOTH),
    ("engine", "ConvolutionBackwardWeights", lambda a, i: a.__setitem__("engine", "fastest"), E.EngineError,
     ["'fastest'", "reference"], BOTH),
]


def _base(kind: str):
    rng, _ = fresh_rng()
    case = Case(kind, GEOM, "NXC", WEIGHTS_FORMATS[kind][1], bias=True, shape_via="input")  # XIO / XOI
    return case.attrs(), case.inputs(torch_results(GEOM, random_tensors(GEOM, rng)))


def _call(api: str, kind: str, attrs: dict, inputs: list):
    engine = attrs.pop("engine", None)
    if api == "op":
        return cg.Op(kind, **attrs)(*inputs, engine=engine)
    return function_of(kind)(*inputs, **attrs, **({"engine": engine} if engine else {}))


@pytest.mark.parametrize("name,kind,mutate,error,words,api",
                         [(*e[:5], api) for e in ERRORS for api in e[5]], ids=lambda v: v if isinstance(v, str) else "")
def test_error(name, kind, mutate, error, words, api):
    attrs, inputs = _base(kind)
    _call(api, kind, dict(attrs), list(inputs))  # the unmodified call works
    mutate(attrs, inputs)
    before = [tensor_hash(a) for a in inputs]
    with pytest.raises(error) as info:
        _call(api, kind, attrs, inputs)
    message = str(info.value)
    if error is not E.EngineError:  # engines are chosen per call, not per op
        assert message.startswith(f"{kind}: "), message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert isinstance(info.value, cg.ConvgradError) and isinstance(info.value, (ValueError, TypeError))
    assert [tensor_hash(a) for a in inputs] == before


@pytest.mark.parametrize("kind", ["Convolutoin", "convolution", 3])
def test_unknown_op(kind):
    with pytest.raises(cg.UnknownOpError) as info:
        cg.Op(kind, strides=[1])
    assert repr(kind) in str(info.value) and "ConvTransposeBackwardWeights" in str(info.value)


def test_unsupported_dtype_name_in_infer():
    op = cg.Op("Convolution", strides=[1], pads_begin=[0], pads_end=[0], dilations=[1])
    with pytest.raises(cg.DTypeError, match="'int8'"):
        op.infer((1, 5, 2), (3, 2, 4), dtype="int8")


def test_every_error_class_is_triggered():
    raised = {e[3] for e in ERRORS} | {cg.UnknownOpError}
    # ResourceError belongs to memory budgets, which the core does not have yet
    classes = {getattr(E, n) for n in E.__all__ if n not in ("ConvgradError", "describe", "ResourceError")}
    assert classes <= raised, classes - raised


_RANK_ATTRS = ("strides", "pads_begin", "pads_end", "dilations", "output_padding")


def _rank_pieces(kind: str, attrs: dict, inputs: list) -> list[tuple[str, int | None]]:
    """(name, spatial axes of a tensor or shape, or None for a list attribute) in argument order."""
    pieces = []
    for spec, value in zip(cg.OPS[kind].inputs, inputs):
        if spec.role != "bias":
            pieces.append((spec.name, len(value) - 2 if spec.role == "shape" else value.ndim - 2))
    return pieces + [(name, None) for name in _RANK_ATTRS if name in attrs]


def _rank_variants(kind: str) -> list[tuple[str, int]]:
    """Each piece that can be given one spatial axis more or fewer than the others."""
    attrs, inputs = _base(kind)
    return [(name, delta) for name, _ in _rank_pieces(kind, attrs, inputs) for delta in (-1, 1)]


@pytest.mark.parametrize("kind,piece,delta",
                         [(kind, *v) for kind in ops_of("convolution") for v in _rank_variants(kind)])
def test_rank_mismatch_names_every_piece_once(kind, piece, delta):
    """Issue 14: whichever piece disagrees on the spatial rank (first input, weights, shape, a list
    attribute), one error names every piece and its rank in argument order: a ShapeError when the
    inputs disagree, an AttributeValueError naming the attribute when only an attribute does."""
    attrs, inputs = _base(kind)
    d = cg.OPS[kind]
    names = [s.name for s in d.inputs]
    if piece in names:
        i = names.index(piece)
        value, role = inputs[i], d.inputs[i].role
        if role == "shape":
            inputs[i] = np.insert(value, 1, 3) if delta > 0 else np.delete(value, 1)  # a kernel or spatial axis
        elif role == "w":  # XIO / XOI: the kernel axes come first
            inputs[i] = value[None] if delta > 0 else value[0]
        else:  # NXC data
            inputs[i] = value[:, None] if delta > 0 else value[:, 0]
    else:
        attrs[piece] = list(attrs[piece]) + [1] if delta > 0 else list(attrs[piece])[:1]
    pieces = _rank_pieces(kind, attrs, inputs)
    for api in ("op", "functional"):
        with pytest.raises((E.ShapeError, E.AttributeValueError)) as info:
            _call(api, kind, dict(attrs), list(inputs))
        message = str(info.value)
        assert isinstance(info.value, E.AttributeValueError if piece in _RANK_ATTRS else E.ShapeError), message
        assert "disagree on the spatial rank: " in message, message
        listing = message.split("disagree on the spatial rank: ")[1]
        (first, first_rank), rest = pieces[0], pieces[1:]
        assert listing.startswith(f"'{first}' has {first_rank} spatial ax"), message
        position = 0
        for name, rank in rest:
            text = f"'{name}' {rank}" if rank is not None else f"'{name}' {len(attrs[name])} value"
            assert text in listing[position:], f"{text!r} after position {position} in {message!r}"
            position = listing.index(text, position)


def test_rank_mismatch_of_the_issue():
    """A 3-D diff_dst with 2-D attributes and 4-D weights."""
    with pytest.raises(E.ShapeError) as info:
        cg.convolution_backward_data(np.ones((1, 3, 4), np.float32), np.ones((3, 3, 2, 4), np.float32), (1, 5, 5, 2),
                                     strides=[1, 1])
    assert ("inputs and attributes disagree on the spatial rank: 'diff_dst' has 1 spatial axis, 'weights' 2, "
            "'dst_shape' 2 ([1, 5, 5, 2]), 'strides' 2 values ([1, 1])") in str(info.value)


def test_ignored_pads_take_no_part_in_the_rank():
    """With auto_pad other than none the pads are ignored, whatever their length (SEMANTICS.md)."""
    x, dy = np.ones((1, 5, 5, 2), np.float32), np.ones((1, 5, 5, 3), np.float32)
    got = cg.Op("ConvolutionBackwardWeights", strides=[1, 1], dilations=[1, 1], auto_pad="same_upper",
                pads_begin=[1, 2, 3], pads_end=[4])(x, dy, [3, 3, 2, 3])
    assert got.shape == (3, 3, 2, 3)
    with pytest.raises(E.AttributeValueError, match="'pads_begin' 3 values"):
        cg.Op("ConvolutionBackwardWeights", strides=[1, 1], dilations=[1, 1], pads_begin=[1, 2, 3],
              pads_end=[1, 1])(x, dy, [3, 3, 2, 3])
