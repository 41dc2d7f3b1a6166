"""The benchdnn-style command line: ``convgrad graph`` and ``convgrad conv`` end to end."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from child_env import subprocess_env
from click.testing import CliRunner

import convgrad as cg
from convgrad import engines
from convgrad.cli import main
from convgrad.engines.reference import ReferenceEngine
from convgrad.opdefs import ops_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SUMMARY = re.compile(r"^tests:(\d+) passed:(\d+) skipped:\d+ failed:(\d+)$", re.M)


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, tuple[int, int, int] | None]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    match = SUMMARY.search(result.output)
    return result.exit_code, result.output, tuple(map(int, match.groups())) if match else None


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_every_example_passes(path):
    code, out, summary = run("graph", f"--case={path}")
    assert code == 0, out
    assert summary == (1, 1, 0)
    assert re.search(r"^0:PASSED __REPRO: convgrad graph .*--seed=\d+ .*--case=", out, re.M)


def test_examples_cover_the_family():
    ops, formats, dtypes, shape_inputs = set(), set(), set(), 0
    for path in EXAMPLES.glob("*.json"):
        for op in json.loads(path.read_text())["graph"]:
            ops.add(op["kind"])
            if cg.OPS[op["kind"]].family == "convolution":
                formats.add(op["attrs"]["data_format"]["value"])
            dtypes.update(t["dtype"] for t in op["inputs"])
            shape_inputs += any(t["dtype"] == "s32" for t in op["inputs"])
    assert set(ops_of("convolution")) <= ops and formats == {"NCX", "NXC"} and {"f32", "bf16", "f16"} <= dtypes
    assert shape_inputs >= 3
    assert {"BiasAdd", "BiasAddBackward", "ReLU", "ReLUBackward", "Add", "GELU", "TypeCast", "Reorder",
            "StaticTranspose", "StaticReshape", "Multiply"} <= ops


def test_example_batches():
    code, out, summary = run("graph", f"--batch={EXAMPLES / 'graph_all.batch'}")
    assert code == 0 and summary == (28, 28, 0), out
    code, out, summary = run("conv", f"--batch={EXAMPLES / 'conv_small.batch'}")
    assert code == 0 and summary == (19, 19, 0), out
    assert "--dir=BWD_D --dt=bf16 --tag=ncx" in out  # options persist within a line's nested batch


def test_conv_descriptors_on_the_command_line():
    code, out, summary = run("conv", "--dir=BWD_W", "--tag=ncx", "--mb=1", "g2ic4ih6oc4oh3kh3sh2ph1", "ic3iw9oc2ow9kw3pw1")
    assert code == 0 and summary == (2, 2, 0), out


def test_performance_mode_csv_and_plot(tmp_path):
    png = tmp_path / "perf.png"
    code, out, summary = run("conv", "--mode=P", "--perf-template=csv", "--fix-times-per-prb=2", f"--plot={png}",
                             "--dir=BWD_D", 'mb2ic8ih10oc8oh10kh3ph1n"a"', "ic4ih6oc4oh6kh1")
    assert code == 0, out
    rows = [r for r in csv.reader(line for line in out.splitlines() if line.startswith("perf,"))]
    assert rows[0][:6] == ["perf", "engine", "impl", "name", "prb", "Gops"] and len(rows) == 3
    gops, best_ms, best_gflops = float(rows[1][5]), float(rows[1][6]), float(rows[1][7])
    # GFLOP/s over the time spent in the convolution, which is all of this one-op graph but its loop
    assert gops == pytest.approx(2 * 2 * 8 * 8 * 9 * 100 / 1e9) and best_gflops >= gops / best_ms * 1e3
    assert best_gflops == pytest.approx(gops / best_ms * 1e3, rel=0.5)
    assert png.stat().st_size > 1000


def test_custom_perf_template():
    code, out, _ = run("graph", "--mode=P", "--fix-times-per-prb=1", "--perf-template=%name%|%Gops%",
                       f"--case={EXAMPLES / 'conv_fwd_nxc_f32.json'}")
    assert code == 0 and re.search(r"^conv_fwd_nxc_f32\|[\d.e-]+$", out, re.M), out


def test_bad_files_and_lines_are_counted_and_the_rest_runs(tmp_path):
    good = EXAMPLES / "conv_fwd_nxc_f32.json"
    doc = json.loads(good.read_text())
    doc["graph"][0]["kind"] = "MaxPool"
    (tmp_path / "relu.json").write_text(json.dumps(doc))
    doc = json.loads(good.read_text())
    doc["graph"][0]["inputs"][0]["stride"] = [1, 1, 1]
    (tmp_path / "stride.json").write_text(json.dumps(doc))
    doc = json.loads(good.read_text())
    doc["graph"][0]["attrs"]["strides"]["type"] = "s32[]"
    (tmp_path / "attr.json").write_text(json.dumps(doc))
    (tmp_path / "broken.json").write_text("{ not json")
    (tmp_path / "cases.batch").write_text(
        f"--in-shapes=0:2xAx3 --case={good}\n"
        "--nonsense=1\n"
        "--case=missing.json\n"
        "--case=relu.json\n"
        "--case=stride.json\n"
        "--case=attr.json\n"
        "--case=broken.json\n"
        f"--op-attrs=0:groups:3 --case={good}\n"
        "--batch=cases.batch\n"
        f"--reset --case={good}\n")
    code, out, summary = run("graph", f"--batch={tmp_path / 'cases.batch'}")
    assert code == 1 and summary == (10, 1, 9), out
    batch = f"{tmp_path / 'cases.batch'}"
    for expected in (f"{batch}:1: --in-shapes: --in-shapes: '2xAx3'", f"{batch}:2: '--nonsense=1': unknown option",
                     "missing.json: cannot read the case file", "kind 'MaxPool'", "inputs[0].stride: = [1, 1, 1]",
                     "attrs.strides.type: = 's32[]'", "broken.json:1:3: not valid JSON",
                     "attribute 'groups' = 3: expected a divisor", "includes itself"):
        assert expected in out, expected
    assert re.search(r"^9:PASSED", out, re.M)


def test_usage_errors_exit_2():
    for args in (["graph", "--mode=X", "--case=a.json"], ["graph", "--in-shapes=0:1xqx2", "--case=a.json"],
                 ["graph"], ["conv", "--dir=BWD_X", "ic1ih1oc1oh1kh1"], ["conv", "--plot=a.png", "ic1ih1oc1kh1"]):
        code, out, _ = run(*args)
        assert code == 2, (args, out)


def test_wrong_engine_fails_the_check(monkeypatch):
    class Broken(ReferenceEngine):
        name = "broken"

        def backward_weights(self, g, x, dy):
            result = super().backward_weights(g, x, dy)
            result.flat[0] += 1.0
            return result

    monkeypatch.setitem(engines._ENGINES, "broken", Broken())
    code, out, summary = run("graph", f"--case={EXAMPLES / 'training_step_nxc_f32.json'}",
                             env={"CONVGRAD_ENGINE": "broken"})
    assert code == 1 and summary == (1, 0, 1)
    assert "op 2 'bwd_weights' (ConvolutionBackwardWeights): max error" in out and "--engine=broken" in out


def test_help_is_complete():
    code, out, _ = run("--help")
    assert code == 0 and all(word in out for word in ("demo", "graph", "conv", "Exit codes"))
    code, out, _ = run("graph", "--help")
    for word in ("--case", "--batch", "--dt", "--in-shapes", "--op-attrs", "--op-kind", "--mb", "--mode", "--engine",
                 "--seed", "--perf-template", "--plot", "--reset", "Exit codes", "--expected-n-partitions",
                 "ignored"):
        assert word in out, word
    code, out, _ = run("conv", "--help")
    assert all(word in out for word in ("--dir", "--tag", "DESCRIPTOR", "BWD_W"))


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "convgrad", "conv", "--seed=7", "ic2ih4oc2oh4kh3ph1"],
                            capture_output=True, text=True, cwd=ROOT, check=False,
                            env=subprocess_env())
    assert result.returncode == 0, result.stderr
    imported = subprocess.run([sys.executable, "-c", "import convgrad; print(convgrad.__file__)"], capture_output=True,
                              text=True, cwd=ROOT, check=True, env=subprocess_env()).stdout.strip()
    assert Path(imported).resolve() == Path(cg.__file__).resolve()  # the package under test, not the checkout
    assert "0:PASSED __REPRO: convgrad conv --mode=C --engine=" in result.stdout
    assert "--seed=7 ic2ih4oc2oh4kh3ph1" in result.stdout


def test_seed_reproduces_the_inputs():
    from convgrad.graph import load_graph, make_inputs, plan_graph

    plan = plan_graph(load_graph(EXAMPLES / "training_step_nxc_f32.json"))
    a, b = (make_inputs(plan, np.random.default_rng(5)) for _ in range(2))
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_inputs_are_signed_eighths_filled_block_by_block():
    """Every input value is a non-zero multiple of 1/8 in [-1, 1] with both signs, also in a
    tensor of more values than one filling block (2^22), whose blocks must all be filled."""
    from convgrad.graph import make_inputs, plan_graph
    from convgrad.graph.conv import ConvSetup, descriptor_graph
    from convgrad.descriptor import parse_descriptor

    plan = plan_graph(descriptor_graph(parse_descriptor("mb3ic16ih300iw300oc2oh300ow300kh1kw1"), ConvSetup("FWD_D")))
    inputs = make_inputs(plan, np.random.default_rng())
    src = max(inputs.values(), key=lambda a: a.size)
    assert src.size > 2**22
    values = src.reshape(-1).astype(np.float64)
    assert np.all(values * 8 == np.round(values * 8)) and np.all((values != 0) & (np.abs(values) <= 1))
    for block in np.array_split(values, 8):  # each part has both signs and several magnitudes
        assert block.min() < 0 < block.max() and len(np.unique(np.abs(block))) == 8
