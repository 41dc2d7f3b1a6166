"""The ops around convolutions: backward ops against finite differences, BiasAddBackward by
adjointness, the f32 fast path against the f64 reference in every dtype, auto_broadcast, attribute
and input errors, and the graph runner's multi-op graphs and --op-kind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad.dtypes import DATA_DTYPES
from convgrad.graph import GraphError, load_graph, parse_op_attrs, parse_op_kind, plan_graph, rewrite
from convgrad.graph.run import relative_error
from convgrad.opdefs import ops_of
from oracle import fresh_rng

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: Attributes for the ops that require some, and the points where their derivative jumps.
ATTRS = {"LeakyReLU": {"alpha": 0.25}, "Elu": {"alpha": 0.75}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
         "Clamp": {"min": -0.75, "max": 1.5}, "Pow": {"beta": 2.5}, "SoftPlus": {"beta": 1.5}}
KINKS = {"ReLU": [0.0], "Clamp": [-0.75, 1.5], "Abs": [0.0], "HardSigmoid": [-2.5, 2.5], "HardSwish": [-3.0, 3.0],
         "Elu": [0.0]}
POSITIVE = {"Sqrt", "Log", "Pow"}
BACKWARD = ops_of("eltwise_backward")


def _attrs(kind: str) -> dict:
    return dict(ATTRS.get(kind.removesuffix("Backward"), {}))


def _src(kind: str, rng: np.random.Generator, shape=(3, 4, 5)) -> np.ndarray:
    forward = kind.removesuffix("Backward")
    x = rng.uniform(0.2, 3.0, shape) if forward in POSITIVE else rng.uniform(-4.0, 4.0, shape)
    for kink in KINKS.get(forward, []):  # keep finite differences off the kinks
        x = np.where(np.abs(x - kink) < 1e-3, x + 0.01, x)
    return x


@pytest.mark.parametrize("kind,use_dst", [(k, False) for k in BACKWARD]
                         + [(k, True) for k in BACKWARD if "use_dst" in cg.OPS[k].attr_names])
def test_backward_ops_match_finite_differences(kind, use_dst):
    d = cg.OPS[kind]
    rng, seed = fresh_rng()
    forward = cg.Op(kind.removesuffix("Backward"), **_attrs(kind))
    x, dd, h = _src(kind, rng), rng.uniform(-1, 1, (3, 4, 5)), 1e-6
    numeric = dd * (forward(x + h, engine="reference") - forward(x - h, engine="reference")) / (2 * h)
    extra = {"use_dst": use_dst} if "use_dst" in d.attr_names else {}
    first = forward(x, engine="reference") if use_dst else x
    got = cg.Op(kind, **_attrs(kind), **extra)(first, dd, engine="reference")
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-7, err_msg=f"seed {seed}")


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_bias_add_backward_is_the_adjoint_of_bias_add(data_format):
    rng, seed = fresh_rng()
    dd, bias = rng.standard_normal((2, 6, 5, 3)), rng.standard_normal(6 if data_format == "NCX" else 3)
    lhs = np.dot(cg.bias_add_backward(dd, data_format=data_format, engine="reference"), bias)
    rhs = np.sum(dd * cg.bias_add(np.zeros_like(dd), bias, data_format=data_format, engine="reference"))
    assert lhs == pytest.approx(rhs, rel=1e-12), f"seed {seed}"


def _cases() -> list[tuple[str, tuple]]:
    """(kind, inputs) of every op of the families around convolutions, on random f64 data."""
    rng, _ = fresh_rng()
    x = rng.uniform(-3, 3, (2, 3, 4, 5))
    out = []
    for kind in ops_of("eltwise"):
        out.append((kind, (_src(kind, rng, x.shape),)))
    for kind in BACKWARD:
        out.append((kind, (_src(kind, rng, x.shape), rng.uniform(-1, 1, x.shape))))
    for kind in ops_of("binary"):
        out.append((kind, (x, rng.uniform(0.5, 2, (3, 1, 5)))))
    out += [("BiasAdd", (x, rng.standard_normal(5))), ("BiasAddBackward", (x,)), ("Reorder", (x,)),
            ("StaticReshape", (x,)), ("StaticTranspose", (x,)), ("TypeCast", (x,))]
    return out


LAYOUT_ATTRS = {"StaticReshape": {"shape": [0, -1], "special_zero": True}, "StaticTranspose": {"order": [3, 2, 1, 0]},
                "TypeCast": {"dtype": "f32"}}


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64"])
def test_fast_path_matches_the_reference_in_every_dtype(dtype):
    """Each op on f32/bf16/f16/f64 data: the f32 fast path (f64 for f64) against the f64 reference,
    both rounded once to the data type: equal to within one rounding and f32 evaluation error."""
    for kind, inputs in _cases():
        attrs = {**_attrs(kind), **LAYOUT_ATTRS.get(kind, {})}
        data = [a.astype(DATA_DTYPES[dtype]) for a in inputs]
        before = [a.copy() for a in data]
        op = cg.Op(kind, **attrs)
        fast, ref = op(*data, engine="fast"), op(*data, engine="reference")
        out = DATA_DTYPES["f32" if kind == "TypeCast" else dtype]
        assert fast.dtype == ref.dtype == out, kind
        eps = float(ml_dtypes.finfo(out).eps)
        reduction = 60 if kind == "BiasAddBackward" else 1
        assert relative_error(fast.astype(np.float64), ref.astype(np.float64)) <= eps + 16 * 2**-23 * reduction, kind
        assert all(np.array_equal(a, b) for a, b in zip(data, before)), f"{kind} modified an input"
        if dtype == "f64":
            np.testing.assert_array_equal(fast, ref, err_msg=kind)


def test_results_are_rounded_once():
    """f64 -> bf16 in one rounding: 1 + 2^-8 + 2^-30 is above the halfway point (rounds up); a double
    rounding through f32 would land on the halfway point and round to even (down)."""
    x = np.array([1 + 2**-8 + 2**-30])
    assert cg.type_cast(x, dtype="bf16")[0] == ml_dtypes.bfloat16(1 + 2**-7)
    assert cg.relu(x.astype(np.float32).astype(ml_dtypes.bfloat16)).dtype == ml_dtypes.bfloat16
    assert cg.add(np.float16([1.0]), np.float16([2**-11]), engine="fast")[0] == np.float16(1.0)  # ties to even


def test_auto_broadcast_numpy_and_none():
    a, b = np.ones((2, 3, 4)), np.arange(4.0)
    assert cg.add(a, b).shape == (2, 3, 4) and cg.multiply(b, a).shape == (2, 3, 4)
    assert cg.subtract(np.ones((3, 1)), np.ones((1, 5))).shape == (3, 5)
    with pytest.raises(cg.ShapeError, match=r"'src_1' has shape \[4\]: expected \[2, 3, 4\].*auto_broadcast is none"):
        cg.add(a, b, auto_broadcast="none")
    with pytest.raises(cg.ShapeError, match=r"'src_1' has shape \[3, 5\]: it does not broadcast with \[2, 3, 4\]"):
        cg.maximum(a, np.ones((3, 5)))
    with pytest.raises(cg.AttributeValueError, match="auto_broadcast' = 'full': expected one of 'none', 'numpy'"):
        cg.Op("Add", auto_broadcast="full")
    np.testing.assert_array_equal(cg.divide(a, a, auto_broadcast="NONE"), a)


def test_errors_name_the_op_the_attribute_or_input_and_what_was_expected():
    x = np.ones((2, 3))
    cases = [
        (lambda: cg.elu(x), cg.MissingAttributeError, "Elu: attribute 'alpha' is required"),
        (lambda: cg.elu(x, alpha=-1), cg.AttributeValueError, "'alpha' = -1: expected a non-negative"),
        (lambda: cg.soft_plus(x, beta=0), cg.AttributeValueError, "'beta' = 0: expected a non-zero"),
        (lambda: cg.clamp(x, min=2, max=1), cg.AttributeValueError, "'max' = 1.0: expected at least min"),
        (lambda: cg.gelu(x, mode="erf"), cg.AttributeValueError, "'mode' = 'erf': expected one of 'gelu_erf'"),
        (lambda: cg.relu_backward(x, x, use_dst="yes"), cg.AttributeTypeError, "'use_dst' = 'yes'"),
        (lambda: cg.leaky_relu(x, alpha=float("nan")), cg.AttributeValueError, "'alpha' = nan"),
        (lambda: cg.relu_backward(x, np.ones((3, 2))), cg.ShapeError, "'diff_dst' has shape [3, 2]: expected [2, 3]"),
        (lambda: cg.add(x, x.astype(np.float32)), cg.DTypeError, "'src_1' has dtype f32: expected f64"),
        (lambda: cg.bias_add(x, np.ones(2)), cg.ShapeError, "'bias' has shape [2]: expected [3]"),
        (lambda: cg.bias_add(np.ones(3), np.ones(3)), cg.ShapeError, "'src' has shape [3] (rank 1): expected rank 2"),
        (lambda: cg.static_reshape(x, shape=[-1, -1], special_zero=False), cg.AttributeValueError, "at most one -1"),
        (lambda: cg.static_reshape(x, shape=[4, 2], special_zero=False), cg.ShapeError, "expected 8 elements"),
        (lambda: cg.static_transpose(x, order=[0, 0]), cg.AttributeValueError, "a permutation of the 2 axes"),
        (lambda: cg.type_cast(x, dtype="s8"), cg.AttributeValueError, "'dtype' = 's8'"),
        (lambda: cg.Op("ReLU", alpha=1.0), cg.UnknownAttributeError, "alpha"),
        (lambda: cg.Op("ReLU")(x, x), cg.InputError, "takes 1 input (src); 2 were given"),
        (lambda: cg.Op("Add")(x), cg.InputError, "input 'src_1' is required"),
    ]
    for call, error, text in cases:
        with pytest.raises(error) as info:
            call()
        assert text in str(info.value), (text, str(info.value))


def test_special_zero_and_negative_order():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert cg.static_reshape(x, shape=[0, 12], special_zero=True).shape == (2, 12)
    assert cg.static_reshape(np.ones((0, 3)), shape=[0, 3], special_zero=False).shape == (0, 3)
    np.testing.assert_array_equal(cg.static_transpose(x, order=[-1, 0, 1]), x.transpose(2, 0, 1))
    out = cg.reorder(x)
    out[0, 0, 0] = -1
    assert x[0, 0, 0] == 0  # a copy, never the caller's memory


# --- graphs -----------------------------------------------------------------------------------

def test_training_step_example_plans_every_op():
    plan = plan_graph(rewrite(load_graph(EXAMPLES / "training_step_bias_relu_nxc_f32.json"), mb=3))
    assert [s.source.kind for s in plan.steps] == ["Convolution", "BiasAdd", "ReLU", "ReLUBackward", "BiasAddBackward",
                                                    "ConvolutionBackwardData", "ConvolutionBackwardWeights"]
    assert plan.tensors[8].shape == (12,) and plan.tensors[9].shape == (3, 9, 9, 8) and plan.tensors[6].shape[0] == 3
    assert plan.flops == 3 * plan.steps[0].problem.flops


def test_mb_changes_a_residual_operand_but_not_a_broadcast_one():
    plan = plan_graph(rewrite(load_graph(EXAMPLES / "conv_layout_ops_nxc_f16.json"), mb=3))
    assert plan.tensors[6].shape == (8, 1) and plan.tensors[7].shape == (3, 8, 36)
    graph = load_graph(EXAMPLES / "conv_add_relu_residual_ncx_f32.json")
    graph = rewrite(graph, op_kind=parse_op_kind("1:Subtract"))
    assert plan_graph(rewrite(graph, mb=4)).tensors[4].shape == (4, 8, 10, 10)


def test_op_kind_swaps_within_a_family_and_refuses_others():
    graph = load_graph(EXAMPLES / "conv_add_relu_residual_ncx_f32.json")
    swapped = rewrite(graph, op_kind=parse_op_kind("1:SquaredDifference+2:HardSwish"))
    assert [op.kind for op in swapped.ops] == ["Convolution", "SquaredDifference", "HardSwish"]
    assert swapped.ops[1].attrs == {"auto_broadcast": "numpy"}
    for text, message in (("2:Add", "expected a kind of the same family (eltwise): one of ReLU"),
                          ("1:ReLU", "expected a kind of the same family (binary)"),
                          ("0:Convolution", "only element-wise, element-wise backward and binary ops"),
                          ("2:MaxPool", "unknown op kind 'MaxPool'"),
                          ("9:ReLU", "op 9 is not in the graph")):
        with pytest.raises(GraphError, match=re.escape(message)):
            rewrite(graph, op_kind=parse_op_kind(text))
    with pytest.raises(ValueError, match="is not ID:VALUE"):
        parse_op_kind("ReLU")


def test_op_attrs_reads_bool_and_f32_values():
    graph = load_graph(EXAMPLES / "training_step_bias_relu_nxc_f32.json")
    ops = rewrite(graph, op_kind=parse_op_kind("2:Elu+3:EluBackward"),
                  op_attrs=parse_op_attrs("2:alpha:0.5+3:alpha:0.5*use_dst:FALSE")).ops
    assert ops[3].kind == "EluBackward" and ops[3].attrs == {"alpha": 0.5, "use_dst": False}
    for text, message in (("3:use_dst:maybe", "'use_dst' = 'maybe': expected true or false"),
                          ("2:alpha:big", "'alpha' = 'big': expected a non-negative finite number")):
        with pytest.raises(GraphError, match=re.escape(message)):
            rewrite(graph, op_kind=parse_op_kind("2:Elu+3:EluBackward"), op_attrs=parse_op_attrs(text))


def test_graph_errors_for_the_new_ops(tmp_path):
    doc = json.loads((EXAMPLES / "conv_bias_relu_nxc_f32.json").read_text())
    doc["graph"][2]["outputs"][0]["dtype"] = "bf16"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"op 2 'relu' \(ReLU\): output tensor 5 has dtype bf16: expected f32"):
        plan_graph(load_graph(path))
    doc["graph"][2]["outputs"][0]["dtype"] = "f32"
    doc["graph"][1]["inputs"][1]["shape"] = [15]
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"op 1 'bias' \(BiasAdd\): BiasAdd: input 'bias' has shape \[15\]"):
        plan_graph(load_graph(path))


def test_performance_mode_reports_convolution_gflops_and_the_rest():
    from click.testing import CliRunner

    from convgrad.cli import main

    result = CliRunner().invoke(main, ["graph", "--mode=P", "--fix-times-per-prb=2", "--expected-n-partitions=3",
                                       "--perf-template=%Gops%|%-time%|%-Gflops%|%-other%|%0other%",
                                       f"--case={EXAMPLES / 'conv_bias_relu_nxc_f32.json'}"])
    assert result.exit_code == 0, result.output
    gops, total, gflops, other, mean_other = map(float, result.output.splitlines()[0].split("|"))
    assert gops == pytest.approx(2 * 2 * 10 * 10 * 16 * 8 * 9 / 1e9) and 0 < other < total
    assert gflops > gops / total * 1e3 and mean_other > 0  # the convolution alone is faster than the graph
    assert "other ops ms" in result.output
