"""The ops around convolutions against PyTorch (CPU, float64): every element-wise op and its
backward op (autograd, from src and, with use_dst, from dst), the binary ops with broadcasting,
BiasAdd / BiasAddBackward, TypeCast's rounding and the layout ops."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from oracle import fresh_rng

torch = pytest.importorskip("torch")
F = torch.nn.functional

#: kind -> (attributes, torch forward); kinds with a backward op are differentiated by autograd.
ELTWISE = {
    "ReLU": ({}, torch.relu),
    "LeakyReLU": ({"alpha": 0.25}, lambda x: F.leaky_relu(x, 0.25)),
    "Sigmoid": ({}, torch.sigmoid),
    "Tanh": ({}, torch.tanh),
    "Elu": ({"alpha": 0.75}, lambda x: F.elu(x, 0.75)),
    "GELU": ({}, lambda x: F.gelu(x)),
    "GELU/tanh": ({"mode": "gelu_tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    # alpha is an f32 attribute: the f32 nearest 0.2 (F.hardsigmoid's 1/6 is not an f32)
    "HardSigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda x: torch.clamp(float(np.float32(0.2)) * x + 0.5, 0, 1)),
    "HardSwish": ({}, F.hardswish),
    "Mish": ({}, F.mish),
    "SoftPlus": ({}, F.softplus),
    "SoftPlus/beta": ({"beta": 2.5}, lambda x: F.softplus(x, beta=2.5)),
    "Clamp": ({"min": -0.75, "max": 1.5}, lambda x: torch.clamp(x, -0.75, 1.5)),
    "Abs": ({}, torch.abs),
    "Square": ({}, torch.square),
    "Sqrt": ({}, torch.sqrt),
    "Exp": ({}, torch.exp),
    "Log": ({}, torch.log),
    "Pow": ({"beta": 2.5}, lambda x: torch.pow(x, 2.5)),
    "Round": ({}, torch.round),
    "Reciprocal": ({}, torch.reciprocal),
}
POSITIVE = {"Sqrt", "Log", "Pow"}
WITH_BACKWARD = [k for k in ELTWISE if k.split("/")[0] + "Backward" in cg.OPS]
USE_DST = [k for k in WITH_BACKWARD if "use_dst" in cg.OPS[k.split("/")[0] + "Backward"].attr_names]


def _src(kind: str, shape=(2, 3, 4, 5)) -> tuple[np.ndarray, int]:
    rng, seed = fresh_rng()
    x = rng.uniform(0.1, 3.0, shape) if kind in POSITIVE else rng.uniform(-4.0, 4.0, shape)
    if kind == "Round":  # ties, to see ties to even
        x[0, 0, 0, :4] = [0.5, 1.5, 2.5, -0.5]
    return x, seed


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("name", list(ELTWISE))
def test_eltwise_forward_matches_torch(name, engine):
    attrs, reference = ELTWISE[name]
    x, seed = _src(name)
    got = cg.Op(name.split("/")[0], **attrs)(x, engine=engine)
    np.testing.assert_allclose(got, reference(torch.from_numpy(x)).numpy(), rtol=1e-12, atol=1e-14,
                               err_msg=f"seed {seed}")


@pytest.mark.parametrize("name,use_dst", [(n, False) for n in WITH_BACKWARD] + [(n, True) for n in USE_DST])
def test_eltwise_backward_matches_torch_autograd(name, use_dst):
    kind = name.split("/")[0]
    attrs, forward = ELTWISE[name]
    x, seed = _src(name)
    dd = fresh_rng()[0].uniform(-1, 1, x.shape)
    tx = torch.from_numpy(x).requires_grad_()
    ty = forward(tx)
    ty.backward(torch.from_numpy(dd))
    first = ty.detach().numpy() if use_dst else x
    extra = {"use_dst": use_dst} if name in USE_DST else {}
    got = cg.Op(f"{kind}Backward", **attrs, **extra)(first, dd, engine="reference")
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"seed {seed}")


BINARY = {"Add": torch.add, "Subtract": torch.sub, "Multiply": torch.mul, "Divide": torch.div,
          "Maximum": torch.maximum, "Minimum": torch.minimum,
          "SquaredDifference": lambda a, b: torch.square(a - b)}


@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((1, 4), (5, 3, 1)), ((3,), ())])
@pytest.mark.parametrize("kind", list(BINARY))
def test_binary_matches_torch_with_broadcasting(kind, shapes):
    rng, seed = fresh_rng()
    a, b = rng.uniform(-2, 2, shapes[0]), rng.uniform(0.5, 2, shapes[1]) * rng.choice([-1, 1], shapes[1])
    want = BINARY[kind](torch.from_numpy(a), torch.from_numpy(np.asarray(b))).numpy()
    for engine in ("reference", "fast"):
        got = getattr(cg, cg.OPS[kind].function)(a, b, engine=engine)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=0, err_msg=f"seed {seed}")


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_bias_add_and_its_backward_match_torch(data_format):
    rng, seed = fresh_rng()
    x, bias, dd = rng.standard_normal((2, 5, 3, 4)), rng.standard_normal(5), rng.standard_normal((2, 5, 3, 4))
    if data_format == "NXC":
        x, dd = x.transpose(0, 2, 3, 1), dd.transpose(0, 2, 3, 1)  # channels last: axis 3
    tb = torch.from_numpy(bias).requires_grad_()
    view = (-1, 1, 1) if data_format == "NCX" else (-1,)
    ty = torch.from_numpy(x) + tb.view(*view)
    ty.backward(torch.from_numpy(dd))
    np.testing.assert_allclose(cg.bias_add(x, bias, data_format=data_format), ty.detach().numpy(), rtol=1e-15)
    np.testing.assert_allclose(cg.bias_add_backward(dd, data_format=data_format, engine="reference"),
                               tb.grad.numpy(), rtol=1e-12, err_msg=f"seed {seed}")


@pytest.mark.parametrize("source,target", [("f32", "bf16"), ("f32", "f16"), ("bf16", "f32"), ("f16", "f32")])
def test_type_cast_rounds_as_torch_does(source, target):
    rng, seed = fresh_rng()
    names = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    t = torch.from_numpy(rng.standard_normal(4096) * 100).to(names[source])
    src = t.float().numpy().astype({"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[source])
    for engine in ("reference", "fast"):
        got = cg.type_cast(src, dtype=target, engine=engine)
        want = t.to(names[target]).float().numpy()
        np.testing.assert_array_equal(got.astype(np.float32), want, err_msg=f"seed {seed}, {engine}")


def test_layout_ops_match_torch():
    rng, _ = fresh_rng()
    x = rng.standard_normal((2, 3, 4, 5))
    tx = torch.from_numpy(x)
    np.testing.assert_array_equal(cg.static_transpose(x, order=[0, -1, 1, 2]), tx.permute(0, 3, 1, 2).numpy())
    np.testing.assert_array_equal(cg.static_reshape(x, shape=[0, -1, 5], special_zero=True),
                                  tx.reshape(2, -1, 5).numpy())
    np.testing.assert_array_equal(cg.reorder(x), x)
