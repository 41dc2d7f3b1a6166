"""benchdnn's graph options as its own harness files use them (issue 23): --attr-fpmath, --mb over
--in-shapes (also where the file dumps inner tensors with unknown sizes), --op-kind=ID:undef,
--in-shapes with a TAG, *TAG, full strides and -, --dt=ID:DT / undef, --tensor-property."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from convgrad.cli import main
from convgrad.graph import GraphError, load_graph, make_inputs, parse_in_shapes, plan_graph, rewrite
from convgrad.graph.rewrite import parse_dt, parse_fpmath, parse_op_kind, parse_tensor_property

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SUMMARY = re.compile(r"^tests:(\d+) passed:(\d+) skipped:\d+ failed:(\d+)$", re.M)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["graph", *args], catch_exceptions=False)
    return result.exit_code, result.output


def _tensor(tid: int, shape: list[int], prop: str = "undef") -> dict:
    unknown = -1 in shape
    stride = [-1] * len(shape) if unknown else [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    return {"id": tid, "dtype": "f32", "shape": shape, "stride": stride, "layout_type": "strided",
            "property_type": prop}


@pytest.fixture
def conv_bias_add(tmp_path) -> Path:
    """oneDNN's conv_bias_add_fusion pattern as dumps write it: conv with bias (tensors 0, 1, 2), the
    residual Add (tensor 3) reading the conv's output, whose sizes are unknown (-1)."""
    attrs = {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1]}
    conv = {"id": 0, "name": "conv", "kind": "Convolution",
            "attrs": {**{k: {"type": "s64[]", "value": v} for k, v in attrs.items()},
                      "data_format": {"type": "string", "value": "NCX"},
                      "weights_format": {"type": "string", "value": "OIX"}},
            "inputs": [_tensor(0, [50, 8, 6, 6]), _tensor(1, [8, 8, 1, 1], "constant"), _tensor(2, [8], "constant")],
            "outputs": [_tensor(4, [-1, -1, -1, -1])]}
    add = {"id": 1, "name": "residual", "kind": "Add", "attrs": {},
           "inputs": [_tensor(4, [-1, -1, -1, -1]), _tensor(3, [50, 8, 6, 6])], "outputs": [_tensor(5, [50, 8, 6, 6])]}
    path = tmp_path / "conv_bias_add_fusion.json"
    path.write_text(json.dumps({"version": "3.2.0", "engine_kind": "cpu", "fpmath_mode": "strict",
                                "graph": [conv, add]}))
    return path


def test_mb_wins_over_in_shapes_for_the_residual(conv_bias_add):
    code, out = run("--mb=2", "--in-shapes=0:50x8x6x6+1:8x8x1x1+2:8+3:50x8x6x6", f"--case={conv_bias_add}")
    assert code == 0 and "0:PASSED" in out, out
    graph = rewrite(load_graph(conv_bias_add), mb=2, in_shapes=parse_in_shapes("0:5x8x6x6+3:5x8x6x6"))
    plan = plan_graph(graph)
    assert plan.tensors[0].shape == plan.tensors[3].shape == (2, 8, 6, 6)
    assert plan.tensors[1].shape == (8, 8, 1, 1)  # weights keep their first axis


def test_attr_fpmath_as_harness_lines_write_it():
    assert parse_fpmath("strict,bf16,tf32") == ("strict", "bf16", "tf32")
    assert parse_fpmath("BF16:true,any:false") == ("bf16", "any")
    for bad in ("fast", "bf16:maybe", "strict,,bf16", ""):
        with pytest.raises(ValueError, match="--attr-fpmath"):
            parse_fpmath(bad)
    code, out = run("--attr-fpmath=strict,bf16,tf32", f"--case={EXAMPLES / 'conv_bias_relu_nxc_f32.json'}")
    assert code == 0 and "--attr-fpmath=strict,bf16,tf32" in out and SUMMARY.search(out).groups() == ("1", "1", "0")
    code, out = run("--attr-fpmath=fast", f"--case={EXAMPLES / 'conv_fwd_nxc_f32.json'}")
    assert code == 2 and "--attr-fpmath: 'fast': expected MODE" in out


def test_op_kind_undef_removes_an_op():
    path = EXAMPLES / "conv_add_relu_residual_ncx_f32.json"
    plan = plan_graph(rewrite(load_graph(path), op_kind=parse_op_kind("1:undef")))
    assert [s.source.kind for s in plan.steps] == ["Convolution", "ReLU"]
    assert plan.steps[1].source.inputs[0].id == 2  # ReLU reads the conv's output, Add's src_0
    plan = plan_graph(rewrite(load_graph(path), op_kind=parse_op_kind("2:UNDEF+1:undef")))
    assert [s.source.kind for s in plan.steps] == ["Convolution"]
    code, out = run("--op-kind=1:undef", f"--case={path}")
    assert code == 0 and "0:PASSED" in out, out
    with pytest.raises(GraphError, match=r"--op-kind: op 0 'conv' \(Convolution\) -> undef: only element-wise"):
        rewrite(load_graph(path), op_kind=parse_op_kind("0:undef"))
    training = EXAMPLES / "training_step_bias_relu_nxc_f32.json"
    graph = load_graph(training)
    backward = next(op for op in graph.ops if op.kind == "ReLUBackward")
    plan = plan_graph(rewrite(graph, op_kind={backward.id: "undef"}))
    assert "ReLUBackward" not in [s.source.kind for s in plan.steps]
    make_inputs(plan, np.random.default_rng())


def test_in_shapes_every_form_the_doc_lists():
    assert parse_in_shapes("0:*acdb+1:acdb+2:-+3:0+4:2x3*6x1+5:*3x1") == {
        0: (None, "acdb"), 1: (None, "acdb"), 2: ((), None), 3: ((0,), None), 4: ((2, 3), (6, 1)), 5: (None, (3, 1))}
    with pytest.raises(ValueError, match="strides '6x1x1' for tensor 0: expected 2 values"):
        parse_in_shapes("0:2x3*6x1x1")
    case = f"--case={EXAMPLES / 'conv_fwd_nxc_f32.json'}"  # src 2x14x14x8 (NXC)
    for option in ("0:*acdb", "0:2x14x14x8*abcd", "0:*1568x112x8x1", "0:2x14x14x8*3200x200x10x1"):
        code, out = run(f"--in-shapes={option}", case)
        assert code == 0 and "0:PASSED" in out, (option, out)
    plan = plan_graph(rewrite(load_graph(EXAMPLES / "conv_fwd_nxc_f32.json"),
                              in_shapes=parse_in_shapes("0:2x14x14x8*3200x200x10x1")))
    assert plan.tensors[0].stride == (3200, 200, 10, 1)  # padded rows, as a dump may have them
    code, out = run("--in-shapes=0:*1x1x1x1", case)
    assert code == 1 and "--in-shapes: tensor 0: strides = [1, 1, 1, 1]: elements of shape" in out
    code, out = run("--in-shapes=0:-", case)  # a 0-d src: the op names it
    assert code == 1 and "input 'src' has shape [] (rank 0)" in out


def test_dt_forms_and_tensor_property():
    assert parse_dt("undef") == {} and parse_dt("0:bf16+1:bf16") == {0: "bf16", 1: "bf16"}
    path = EXAMPLES / "conv_fwd_nxc_f32.json"
    code, out = run("--dt=0:bf16+1:bf16+2:bf16", f"--case={path}")
    assert code == 0 and "0:PASSED" in out, out
    assert parse_tensor_property("1:constant+0:variable") == {1: "constant", 0: "variable"}
    with pytest.raises(ValueError, match="--tensor-property: 'const' for tensor 1: expected one of undef"):
        parse_tensor_property("1:const")
    graph = rewrite(load_graph(path), tensor_property={1: "constant"})
    assert graph.ops[0].inputs[1].property_type == "constant"
    with pytest.raises(GraphError, match="--tensor-property: tensor 9 is not in the graph"):
        rewrite(load_graph(path), tensor_property={9: "constant"})
    code, out = run("--tensor-property=1:constant", f"--case={path}")
    assert code == 0 and "0:PASSED" in out, out
