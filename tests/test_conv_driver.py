"""``convgrad conv`` with benchdnn's conv-driver options: option lists, FWD_I and BWD_WB, per-tensor
data types, memory tags, post-ops, --alg/--impl/--match, integer quantization SKIPPED, and small
copies of oneDNN's own input files (tests/data/onednn_conv/)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from convgrad.cli import main
from convgrad.descriptor import parse_descriptor
from convgrad.graph import execute, make_inputs, plan_graph
from convgrad.graph.conv import ConvSetup, descriptor_graph
from convgrad.graph.post_ops import parse_post_ops
from convgrad.graph.tags import tag_order
from oracle import fresh_rng

ONEDNN = Path(__file__).resolve().parent / "data" / "onednn_conv"
SUMMARY = re.compile(r"^tests:(\d+) passed:(\d+) skipped:(\d+) failed:(\d+)$", re.M)


def run(*args: str) -> tuple[int, str, tuple[int, ...]]:
    result = CliRunner().invoke(main, ["conv", *args], catch_exceptions=False)
    match = SUMMARY.search(result.output)
    assert match, result.output
    return result.exit_code, result.output, tuple(map(int, match.groups()))


def statuses(out: str) -> list[str]:
    return re.findall(r"^\d+:(PASSED|SKIPPED|FAILED)", out, re.M)


def run_graph(text: str, setup: ConvSetup) -> tuple[list[np.ndarray], dict[int, np.ndarray], list[np.ndarray]]:
    """The graph's inputs in the order the builder makes them (src or diff_dst first, then weights,
    bias, post-op operands), every tensor's value, and the plan's outputs."""
    plan = plan_graph(descriptor_graph(parse_descriptor(text), setup))
    inputs = make_inputs(plan, fresh_rng()[0])
    values = execute(plan, "fast", inputs)
    return [inputs[t] for t in sorted(plan.inputs)], values, [values[t] for t in plan.graph.output_ids()]


# --- option lists, directions, quantization, refusals --------------------------------------------


def test_lists_run_every_combination_in_order():
    code, out, summary = run("--seed=1", "--dir=FWD_B,BWD_D", "--dt=f32,bf16", "--mb=1,3", "ic2ih4oc3oh4kh3ph1")
    assert code == 0 and summary == (8, 8, 0, 0), out
    repros = re.findall(r"__REPRO: convgrad conv \S+ \S+ \S+ (.*)$", out, re.M)
    assert repros[:3] == ["--mb=1 ic2ih4oc3oh4kh3ph1", "--mb=3 ic2ih4oc3oh4kh3ph1", "--dt=bf16 --mb=1 ic2ih4oc3oh4kh3ph1"]
    assert repros[-1] == "--dir=BWD_D --dt=bf16 --mb=3 ic2ih4oc3oh4kh3ph1"


def test_lists_are_counted_before_running(tmp_path):
    """--max-cases counts every combination of the list options, in batch files too, before any
    case runs (the nested file inherits the options in force and passes its own back)."""
    inner = tmp_path / "inner"
    inner.write_text("--dt=f32,bf16,f16\nic2ih4oc3oh4kh3ph1\n")
    batch = tmp_path / "outer"
    batch.write_text("--dir=FWD_B,BWD_D --mb=1,2\nic2ih4oc3oh4kh3ph1\n--batch=inner\nic2ih5oc3oh5kh3ph1\n")
    # 4 (2 dirs x 2 mb) + 12 (x 3 dts, in the nested file) + 12 (the dts persist after it)
    result = CliRunner().invoke(main, ["conv", f"--batch={batch}", "--max-cases=27"])
    assert result.exit_code == 2 and "hold 28 cases" in result.output, result.output
    result = CliRunner().invoke(main, ["conv", "--dir=FWD_B,BWD_D,BWD_W", "--mb=1,2", "--max-cases=5",
                                       "ic2ih4oc3oh4kh3ph1"])
    assert result.exit_code == 2 and "hold 6 cases" in result.output, result.output
    code, out, summary = run("--seed=2", f"--batch={batch}", "--max-cases=28")
    assert code == 0 and summary == (28, 28, 0, 0), out


def test_integer_quantization_is_skipped_and_does_not_fail(tmp_path):
    batch = tmp_path / "quant"
    batch.write_text("--reset --dt=u8:s8:u8 ic4ih5oc4oh5kh3ph1\n"
                     "--reset --dt=f32 --attr-scales=wei:common:0.25 ic4ih5oc4oh5kh3ph1\n"
                     "--reset --attr-zero-points=src:common:1 ic4ih5oc4oh5kh3ph1\n"
                     "--reset --attr-post-ops=sum:0.5:1 ic4ih5oc4oh5kh3ph1\n"
                     "--reset --dt=f32,s8:s8:s32 --dir=FWD_I ic4ih5oc4oh5kh3ph1\n")
    code, out, summary = run(f"--batch={batch}")
    assert code == 0 and summary == (6, 1, 5, 0), out
    assert statuses(out) == ["SKIPPED"] * 4 + ["PASSED", "SKIPPED"]
    for reason in ("integer data type u8 (--dt=u8:s8:u8)", "--attr-scales=wei:common:0.25",
                   "--attr-zero-points=src:common:1", "post-op 'sum:0.5:1': zero point 1",
                   "integer data type s8 (--dt=s8:s8:s32)"):
        assert f"SKIPPED (integer quantization is not convgrad's job: {reason}" in out, reason
    batch.write_text("--dt=u8:s8:u8 ic4ih5oc4oh5kh3ph1\n--dt=f32 --nonsense=1 ic4ih5oc4oh5kh3ph1\n")
    code, out, summary = run(f"--batch={batch}")
    assert code == 1 and summary == (2, 0, 1, 1), out
    assert "'--nonsense=1': unknown option" in out


@pytest.mark.parametrize("options, expected", [
    (["--attr-post-ops=linear:2:1"], "'linear:2:1': convgrad cannot apply linear: no graph element-wise op"),
    (["--attr-post-ops=relu+eq:f32"], "'eq:f32': convgrad cannot apply eq: a comparison"),
    (["--attr-post-ops=bogus"], "'bogus': unknown post-op 'bogus'"),
    (["--attr-post-ops=add:f32:per_hw"], "'add:f32:per_hw': mask 'per_hw': expected common"),
    (["--dir=BWD_D", "--attr-post-ops=relu"], "post-ops apply to the forward directions (FWD_B, FWD_D, FWD_I), "
                                               "not BWD_D"),
    (["--wtag=ogiw"], "--wtag: tag 'ogiw': grouped weights need g immediately outside o"),
    (["--stag=abcde"], "tag 'abcde' does not fit a 3D data tensor (ncw)"),
])
def test_refused_options_fail_the_line_naming_the_option(tmp_path, options, expected):
    batch = tmp_path / "bad"
    batch.write_text(" ".join(options) + " g2ic4iw6oc4ow6kw3pw1\n")
    code, out, summary = run(f"--batch={batch}")
    assert code == 1 and summary[3] == 1 and expected in out, out


def test_bad_values_on_the_command_line_are_usage_errors():
    for option in ("--dt=f32:f32", "--dt=f8_e5m2", "--stag=aBQ", "--match=(", "--alg=fft", "--bia-dt=f64"):
        result = CliRunner().invoke(main, ["conv", option, "ic2ih4oc2oh4kh3ph1"])
        assert result.exit_code == 2 and option.split("=")[0] in result.output, (option, result.output)


def test_match_runs_only_matching_problems_and_notes_are_printed():
    code, out, summary = run("--match=.*k[dhw]3.*", "--alg=wino", "--impl=brg", "--skip-impl=ref,x64:gemm",
                             "--stag=aBx16b", "--dtag=aBx16b", "ic2ih4oc2oh4kh3ph1", "ic2ih4oc2oh4kh1", "ic2iw5oc2kw3")
    assert code == 0 and summary == (2, 2, 0, 0), out
    assert "kh1" not in out.split("┏")[0]
    for note in ("note: --alg=wino: convgrad computes the same convolution for every algorithm",
                 "note: --impl=brg: names oneDNN implementations", "note: --skip-impl=ref,x64:gemm",
                 "note: --stag: tag aBx16b: oneDNN's blocked storage of the same values; convgrad has no blocked "
                 "layout and computes with the plain order abx"):
        assert note in out, note


def test_help_documents_every_option():
    result = CliRunner().invoke(main, ["conv", "--help"])
    for word in ("--dir", "FWD_I", "BWD_WB", "--dt", "SRC:WEI:DST", "--bia-dt", "--stag", "--wtag", "--dtag", "--tag",
                 "--alg", "--attr-post-ops", "--attr-scales", "--attr-zero-points", "--match", "--impl", "--skip-impl",
                 "SKIPPED", "skipped:S", "comma-separated"):
        assert word in result.output, word


# --- memory tags ----------------------------------------------------------------------------------


def test_tags_name_benchdnn_dims_in_memory_order():
    assert tag_order("axb", "data", 2) == ["n", "h", "w", "c"]
    assert tag_order("acdb", "data", 2) == ["n", "h", "w", "c"]
    assert tag_order("nhwc", "data", 2) == ["n", "h", "w", "c"]
    assert tag_order("xba", "weights", 2) == ["h", "w", "i", "o"]
    assert tag_order("goiw", "weights", 1, grouped=True) == ["g", "o", "i", "w"]
    assert tag_order("abxc", "weights", 2, grouped=True) == ["g", "o", "h", "w", "i"]
    assert tag_order("aBx16b", "data", 3) == ["n", "c", "d", "h", "w"]


@pytest.mark.parametrize("layout", ["nxc", "ncx"])
def test_tags_set_the_strides_and_the_case_passes(layout):
    setup = ConvSetup("FWD_B", layout=layout, stag="abx", wtag="goihw", dtag="axb")
    graph = descriptor_graph(parse_descriptor("g2mb2ic4ih5iw6oc6oh5ow6kh3kw3ph1pw1"), setup)
    tensors = {t.id: t for op in graph.ops for t in (*op.inputs, *op.outputs)}
    src, weights, dst = tensors[graph.input_ids()[0]], tensors[graph.input_ids()[1]], tensors[graph.output_ids()[0]]
    n_first = layout == "ncx"  # the ops' logical axes: NCX/OIX or NXC/XIO
    assert src.stride == ((120, 30, 6, 1) if n_first else (120, 6, 1, 30))  # n c h w in memory
    assert dst.stride == ((180, 1, 36, 6) if n_first else (180, 36, 6, 1))  # n h w c in memory
    assert weights.stride == ((18, 9, 3, 1) if n_first else (3, 1, 9, 18))  # (g o) i h w in memory
    code, out, summary = run(f"--tag={layout}", "--stag=abx", "--wtag=goihw", "--dtag=axb", "--dir=FWD_B,BWD_D,BWD_WB",
                             "g2mb2ic4ih5iw6oc6oh5ow6kh3kw3ph1pw1")
    assert code == 0 and summary == (3, 3, 0, 0), out


# --- values against independent references ---------------------------------------------------------


def _torch_layout(x: np.ndarray, w: np.ndarray):
    torch = pytest.importorskip("torch")
    return (torch.from_numpy(np.moveaxis(x.astype(np.float64), -1, 1).copy()),
            torch.from_numpy(np.transpose(w.astype(np.float64), (3, 2, 0, 1)).copy()))


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16:f32:f16"])
def test_bwd_wb_bias_gradient_matches_pytorch(dt):
    torch = pytest.importorskip("torch")
    src_dt, wei_dt, dst_dt = (dt.split(":") * 3)[:3]
    text = "g2mb3ic4ih7iw6oc6oh4ow3kh3kw3sh2sw2ph1pw1"
    (x, dy), values, (dw, db) = run_graph(text, ConvSetup("BWD_WB", src_dt, wei_dt, dst_dt))
    assert db.dtype == np.float32 and dw.dtype == (ml_dtypes.bfloat16 if wei_dt == "bf16" else np.float32)
    xt = torch.from_numpy(np.moveaxis(x.astype(np.float64), -1, 1).copy())
    w = torch.zeros((6, 2, 3, 3), dtype=torch.float64, requires_grad=True)
    b = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xt, w, b, stride=2, padding=1, groups=2).backward(
        torch.from_numpy(np.moveaxis(dy.astype(np.float64), -1, 1).copy()))
    assert np.any(db != 0)
    np.testing.assert_allclose(db, b.grad.numpy(), rtol=1e-6, atol=1e-6)
    eps = 2.0**-8 if wei_dt == "bf16" else 1e-6
    np.testing.assert_allclose(dw.astype(np.float64), w.grad.numpy().transpose(2, 3, 1, 0), rtol=eps, atol=eps * 4)


def test_mixed_types_accumulate_in_f32_and_round_once():
    # bf16 data, f32 dst: the f32 result carries far more than bf16's 8 bits
    (x, w), _, (y,) = run_graph("mb2ic16ih6oc8oh6kh3ph1", ConvSetup("FWD_D", "bf16", "bf16", "f32"))
    assert x.dtype == ml_dtypes.bfloat16 and y.dtype == np.float32
    xt, wt = _torch_layout(x, w)
    import torch
    expected = np.moveaxis(torch.nn.functional.conv2d(xt, wt, padding=1).numpy(), 1, -1)
    np.testing.assert_allclose(y, expected.astype(np.float32), rtol=0, atol=1e-5)
    assert np.any(y.astype(ml_dtypes.bfloat16).astype(np.float32) != y)
    # f32 diff_src from bf16 diff_dst and weights; and a bf16 output rounded once from the f32 sum
    (dy, w), _, (dx,) = run_graph("mb2ic8ih6oc16oh6kh3ph1", ConvSetup("BWD_D", "f32", "bf16", "bf16"))
    assert dy.dtype == ml_dtypes.bfloat16 and dx.dtype == np.float32
    (x, w), _, (y,) = run_graph("mb2ic16ih6oc8oh6kh3ph1", ConvSetup("FWD_D", "f32", "bf16", "bf16"))
    xt, wt = _torch_layout(x, w)
    exact = np.moveaxis(torch.nn.functional.conv2d(xt, wt, padding=1).numpy(), 1, -1)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, exact.astype(np.float32).astype(ml_dtypes.bfloat16))


def test_post_ops_match_pytorch():
    torch = pytest.importorskip("torch")
    post_ops = parse_post_ops("sum:2+relu:0.25+add:f32:per_oc+prelu:per_oc+mul:f32:per_tensor+logistic")
    (x, w, b, previous, scale_input, add, slope, mul), values, (y,) = \
        run_graph("mb2ic4ih5oc6oh5kh3ph1", ConvSetup("FWD_B", post_ops=post_ops))
    assert np.all(scale_input == 2) and add.shape == (1, 1, 1, 6) and mul.shape == y.shape
    xt, wt = _torch_layout(x, w)
    def t(a: np.ndarray):
        return torch.from_numpy(np.moveaxis(np.broadcast_to(a.astype(np.float64), y.shape), -1, 1).copy())

    z = torch.nn.functional.conv2d(xt, wt, torch.from_numpy(b.astype(np.float64)), padding=1) + 2 * t(previous)
    z = torch.nn.functional.leaky_relu(z, 0.25) + t(add)
    z = torch.where(z > 0, z, t(slope) * z) * t(mul)
    expected = np.moveaxis(torch.sigmoid(z).numpy(), 1, -1)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


def test_every_eltwise_and_binary_post_op_passes_the_check():
    entries = ("abs,exp,gelu_erf,gelu_tanh,tanh_dst,logistic_dst,mish,round,square,sqrt_dst,log,elu:0.5,"
               "clip:-0.5:0.5,clip_v2_dst:-1:1,hardsigmoid:0.2:0.5,hardswish:0.1666667:0.5,soft_relu:2,pow:1:2,"
               "relu_dst:0.1,eltwise_relu,binary_add:f16:per_oc,div:f32:common,max:bf16:per_tensor:axb,sub:f32:3,"
               "min:f32:per_dim_01,mul:f32:per_oc+sum:0.5+prelu:per_tensor")
    code, out, summary = run("--seed=3", f"--attr-post-ops={entries}", "--dir=FWD_B,FWD_I", "mb2ic3ih4iw5oc4kh3kw2ph1")
    assert code == 0 and summary == (52, 52, 0, 0), out


def test_dw_post_op_runs_a_depthwise_convolution_after_the_1x1():
    torch = pytest.importorskip("torch")
    setup = ConvSetup("FWD_B", post_ops=parse_post_ops("relu+dw:k3s2p1+sqrt"))
    (x, w, b, dw_w, dw_b), values, (y,) = run_graph("mb2ic4ih6iw7oc8kh1kw1ph0pw0", setup)
    assert dw_w.shape == (3, 3, 1, 8) and y.shape == (2, 3, 4, 8)  # ceil(6 / 2), ceil(7 / 2)
    xt, wt = _torch_layout(x, w)
    z = torch.relu(torch.nn.functional.conv2d(xt, wt, torch.from_numpy(b.astype(np.float64))))
    z = torch.nn.functional.conv2d(torch.nn.functional.pad(z, (1, 1, 1, 1)), _torch_layout(x, dw_w)[1],
                                   torch.from_numpy(dw_b.astype(np.float64)), stride=2, groups=8)
    expected = np.moveaxis(torch.sqrt(z).numpy(), 1, -1)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6, equal_nan=True)
    assert np.isnan(y).any() and not np.isnan(y).all()  # sqrt of negative sums: NaN where the reference has NaN
    code, out, summary = run("--attr-post-ops=relu+dw:k3s2p1+sqrt,sum+relu,prelu,add:bf16:per_oc",
                             "--dt=f32,bf16:bf16:f32", "mb2ic4ih6iw7oc8kh1kw1ph0pw0")
    assert code == 0 and summary == (8, 8, 0, 0), out


# --- oneDNN's own input files (small copies) ------------------------------------------------------

#: file -> (tests, skipped) as benchdnn counts them (None: not pinned). harness_conv_auto is not
#: copied: its two shapes are 300x300 images, too slow for the suite (it is the style of
#: harness_conv_tags: a harness of option lists over a shapes file).
ONEDNN_FILES = {
    "harness_conv_regression_excerpt": (None, None),
    "harness_conv_tags": (None, None),
    "harness_conv_dw_bfloat16_nxc": (None, 0),
    "harness_conv_dw_float16_nxc": (None, 0),
    "harness_conv_deepbench": (None, 0),
    "harness_conv_dilated_3d": (10, 0),
}


@pytest.mark.parametrize("name", sorted(ONEDNN_FILES))
def test_onednn_files_pass(name):
    path = ONEDNN / name
    assert "Apache-2.0" in path.read_text() and "uxlfoundation/oneDNN" in path.read_text()
    code, out, (tests, passed, skipped, failed) = run("--seed=5", f"--batch={path}")
    assert code == 0 and failed == 0 and passed + skipped == tests > 0, out
    expected_tests, expected_skipped = ONEDNN_FILES[name]
    assert tests == (expected_tests or tests) and skipped == (skipped if expected_skipped is None else expected_skipped)
    reasons = re.findall(r"^\d+:SKIPPED \((.*?)\) __REPRO", out, re.M)
    assert len(reasons) == skipped and all(r.startswith("integer quantization is not convgrad's job") for r in reasons)


def test_post_ops_on_bf16_data_run_on_the_f32_accumulator_and_round_once():
    setup = ConvSetup("FWD_D", "bf16", "bf16", "bf16", post_ops=parse_post_ops("sum+relu"))
    assert setup.compute_dtype() == "f32" and ConvSetup("FWD_D", "bf16", "bf16", "bf16").compute_dtype() == "bf16"
    graph = descriptor_graph(parse_descriptor("mb2ic4ih5oc6oh5kh3ph1"), setup)
    assert [op.kind for op in graph.ops] == ["TypeCast", "TypeCast", "Convolution", "TypeCast", "Add", "ReLU",
                                             "TypeCast"]
