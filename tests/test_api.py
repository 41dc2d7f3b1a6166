"""Inputs of any memory layout or origin, shape inference, attribute spellings, the shape input."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import torch

import convgrad as cg

from oracle import (BF16, OPS, SHAPE_ATTR, Case, Geometry, check, fresh_rng, function_of, random_tensors, resolve_pads,
                    tensor_hash, torch_results)

GEOM = Geometry(n=2, groups=2, icg=2, ocg=3, in_size=(7, 5), kernel=(3, 2), strides=(2, 1), dilations=(1, 2),
                pads_begin=(1, 0), pads_end=(0, 1))


def _problem(kind: str, **changes):
    rng, seed = fresh_rng()
    case = Case(kind, GEOM, "NXC", bias=True).with_(**changes)
    results = torch_results(case.geom, random_tensors(case.geom, rng))
    return case, results, seed


def _strided(a: np.ndarray) -> np.ndarray:
    big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _negative(a: np.ndarray) -> np.ndarray:
    return np.flip(np.flip(a).copy())


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


LAYOUTS = {"strided": _strided, "negative_strides": _negative, "fortran": np.asfortranarray, "readonly": _readonly,
           "torch": torch.from_numpy,
           "torch_permuted": lambda a: torch.from_numpy(np.moveaxis(a, -1, 0).copy()).movedim(0, -1)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", OPS)
def test_any_memory_layout_gives_the_same_result_and_is_left_alone(kind, layout):
    case, results, seed = _problem(kind)
    contiguous = case.inputs(results)
    want = case.run(contiguous)
    inputs = [LAYOUTS[layout](a) if a.dtype.kind == "f" else a for a in contiguous]
    if layout in ("strided", "negative_strides", "torch_permuted"):
        assert not all(np.asarray(a).flags.c_contiguous for a in inputs[:2])
    before = [tensor_hash(a) for a in inputs]
    got = case.run(inputs)
    assert [tensor_hash(a) for a in inputs] == before, seed
    if layout.startswith("torch"):  # torch in, torch out (DLPack, no copy: test_libraries.py)
        assert isinstance(got, torch.Tensor)
        got = got.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13, err_msg=f"seed={seed}")
    assert got.flags.c_contiguous and got.flags.writeable
    assert not any(np.shares_memory(got, np.asarray(a)) for a in inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_tensors_of_every_dtype(dtype):
    case, results, seed = _problem("ConvolutionBackwardWeights")
    x, dy, shape = case.inputs(results)
    tx, tdy = torch.from_numpy(x).to(dtype), torch.from_numpy(dy).to(dtype).transpose(1, 2)  # non-contiguous
    before = [tensor_hash(tx), tensor_hash(tdy)]
    got = case.run([tx, tdy.transpose(1, 2), torch.from_numpy(shape)])
    want_dtype = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: BF16}[dtype]
    ref = case.run([np.asarray(tx.float()).astype(want_dtype), np.asarray(tdy.transpose(1, 2).float())
                    .astype(want_dtype), shape])
    assert isinstance(got, torch.Tensor) and got.dtype == dtype  # torch in, torch out
    got = np.asarray(got.float()).astype(want_dtype)  # exact: every bf16/f16 value is an f32 one
    np.testing.assert_array_equal(got.astype(np.float64), ref.astype(np.float64), err_msg=f"seed={seed}")
    assert [tensor_hash(tx), tensor_hash(tdy)] == before


@pytest.mark.parametrize("kind", OPS)
def test_infer_gives_shape_dtype_and_pads_without_computing(kind):
    g = replace(GEOM, in_size=(8, 5), dilations=(1, 1))  # odd same_* totals on both axes, for every op
    pads = resolve_pads(kind, "same_lower", g.in_size, g.kernel, g.strides, g.dilations, (), ())
    case, results, _ = _problem(kind, auto_pad="same_lower", given_pads=(),
                                geom=replace(g, pads_begin=pads[0], pads_end=pads[1]))
    inputs = case.inputs(results)
    op = cg.Op(kind, **case.attrs())
    from_arrays = op.infer(*inputs)
    assert from_arrays.output_shape == case.run(inputs).shape
    assert from_arrays.output_dtype == np.float64
    shapes = [tuple(a.shape) if a.dtype.kind == "f" else a for a in inputs]
    from_shapes = op.infer(*shapes, dtype="bf16")
    assert from_shapes.output_shape == from_arrays.output_shape and from_shapes.output_dtype == BF16
    assert (from_shapes.pads_begin, from_shapes.pads_end) == pads
    assert sum(pads[0]) != sum(pads[1])  # an odd total somewhere: the split is checked


def test_infer_of_a_huge_problem_allocates_nothing():
    op = cg.Op("ConvolutionBackwardData", strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
               auto_pad="SAME_UPPER")
    start = time.perf_counter()
    problem = op.infer((100_000, 4096, 4096, 512), (3, 3, 512, 512), np.array([100_000, 4096, 4096, 512]))
    assert time.perf_counter() - start < 1
    assert problem.output_shape == (100_000, 4096, 4096, 512)
    assert (problem.pads_begin, problem.pads_end) == ((1, 1), (1, 1))


SPELLINGS = [
    ({"auto_pad": "none"}, {"auto_pad": "None"}),
    ({"auto_pad": "none"}, {"auto_pad": "NONE"}),
    ({"auto_pad": "same_upper"}, {"auto_pad": "SAME_UPPER"}),
    ({"auto_pad": "same_lower"}, {"auto_pad": "Same_Lower"}),
    ({"auto_pad": "valid"}, {"auto_pad": "VALID"}),
    ({"data_format": "NXC"}, {"data_format": "nxc"}),
    ({"weights_format": "OIX"}, {"weights_format": "oix"}),
    ({"strides": [2, 1]}, {"strides": (2, 1)}),
    ({"strides": [2, 1]}, {"strides": np.array([2, 1])}),
    ({"strides": [2, 1]}, {"strides": [np.int64(2), np.int32(1)]}),
    ({"groups": 2}, {"groups": np.int64(2)}),
    ({"groups": 2}, {"groups": np.array(2)}),
    ({"pads_begin": [1, 0]}, {"pads_begin": [1, 0] + [0] * 10}),
    ({"output_padding": [0, 0]}, {"output_padding": [0] * 12}),
    ({"output_padding": [0, 0]}, {"output_padding": []}),
]


@pytest.mark.parametrize("canonical,spelling", SPELLINGS, ids=lambda v: repr(v)[:40])
def test_attribute_spellings(canonical, spelling):
    kind = "ConvTranspose" if "output_padding" in canonical else "Convolution"
    g = replace(GEOM, in_size=(8, 5), dilations=(1, 1))  # extra = 0: output_padding [0, 0]
    case, results, seed = _problem(kind, geom=g, weights_format="OIX" if kind == "Convolution" else None)
    attrs = {**case.attrs(), **canonical}
    inputs = case.inputs(results)
    want = cg.Op(kind, **attrs)(*inputs)
    np.testing.assert_array_equal(cg.Op(kind, **{**attrs, **spelling})(*inputs), want)
    np.testing.assert_array_equal(function_of(kind)(*inputs, **{**attrs, **spelling}), want)
    if isinstance(next(iter(spelling.values())), str):
        assert cg.Op(kind, **{**attrs, **spelling}).attrs == cg.Op(kind, **attrs).attrs


@pytest.mark.parametrize("kind", list(SHAPE_ATTR))
def test_shape_tensor_input(kind):
    case, results, seed = _problem(kind, shape_via="input")
    data, shape = case.inputs(results)[:2], case.inputs(results)[2]
    want = case.expected(results)
    name = SHAPE_ATTR[kind]
    wrong = [v + 1 for v in shape.tolist()]
    variants = {
        "int32": (shape, {}),
        "int64": (shape.astype(np.int64), {}),
        "list": (shape.tolist(), {}),
        "tuple": (tuple(shape.tolist()), {}),
        "torch": (torch.from_numpy(shape), {}),
        "attribute": (None, {name: shape.tolist()}),
        "input_wins": (shape, {name: wrong}),
        "zeros_attribute_is_unset": (shape, {name: [0] * 12}),
    }
    for label, (value, extra) in variants.items():
        op = cg.Op(kind, **case.attrs(), **extra)
        got = op(*data, value) if value is not None else op(*data)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{label} seed={seed}")
        assert op.infer(*data, value).output_shape == want.shape, label


@pytest.mark.parametrize("kind", OPS)
def test_zero_batch(kind):
    rng, seed = fresh_rng()
    case = Case(kind, Geometry(0, 2, 2, 3, (7, 5), (3, 2), (2, 1), (1, 2), (1, 0), (0, 1)), "NCX", bias=True)
    got = check(case, torch_results(case.geom, random_tensors(case.geom, rng)), seed)
    assert got.shape[0] == 0 or not got.any()  # weight gradients of an empty batch are zeros


def test_op_reuses_its_last_resolution_only_for_the_same_inputs(rng):
    """A repeated call reuses the resolved problem; new shapes, dtypes or attributes resolve anew."""
    op = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
               data_format="NXC", weights_format="XIO")
    x1, x2 = rng.standard_normal((2, 6, 6, 3)), rng.standard_normal((1, 8, 7, 3))
    w = rng.standard_normal((3, 3, 3, 4))
    first = op.prepare(x1, w)[0]
    assert op.prepare(x1.copy(), w)[0] is first
    assert op.prepare(x2, w)[0].output_shape == (1, 6, 5, 4)
    assert op.prepare(x1.astype(np.float32), w.astype(np.float32))[0].dtype == np.float32
    assert op.prepare(x1, w)[0].output_shape == (2, 4, 4, 4)
    op.attrs["strides"] = (2, 2)
    assert op.prepare(x1, w)[0].output_shape == (2, 2, 2, 4)
    for x in (x1, x2, x1):
        fresh = cg.Op("Convolution", strides=[2, 2], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                      data_format="NXC", weights_format="XIO")
        np.testing.assert_array_equal(op(x, w), fresh(x, w))
