"""What users arriving from PyTorch meet first (issue 23): per-axis scalars and default strides in
the functional API, required attributes refused when an Op is built, results in the inputs' own
array library, a layout hint for PyTorch-layout arrays, the extras naming what to install, and no
import cycle between the core and convgrad.dask."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import convgrad as cg

SRC = Path(cg.__file__).resolve().parent


def test_scalars_and_defaults_in_the_functional_api(rng):
    x, w = rng.standard_normal((2, 9, 9, 3)), rng.standard_normal((3, 3, 3, 4))
    want = cg.convolution(x, w, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    np.testing.assert_array_equal(cg.convolution(x, w, strides=2, pads_begin=1, pads_end=1, dilations=1), want)
    np.testing.assert_array_equal(cg.convolution(x, w, strides=np.int64(2), pads_begin=1, pads_end=[1, 1]), want)
    np.testing.assert_array_equal(cg.convolution(x, w), cg.convolution(x, w, strides=[1, 1]))
    dy = rng.standard_normal((2, 4, 4, 5))
    got = cg.conv_transpose(rng.standard_normal((2, 4, 4, 3)), rng.standard_normal((3, 3, 5, 3)), strides=2,
                            output_padding=1)
    assert got.shape == (2, 10, 10, 5)
    assert cg.convolution_backward_weights(x, dy, [3, 3, 3, 5], strides=2).shape == (3, 3, 3, 5)
    with pytest.raises(cg.AttributeValueError, match="Convolution: attribute 'strides' = 0: expected a positive"):
        cg.convolution(x, w, strides=0)
    with pytest.raises(cg.AttributeTypeError, match="attribute 'dilations' = 1.0"):
        cg.convolution(x, w, dilations=1.0)
    with pytest.raises(cg.AttributeTypeError, match="attribute 'strides' = True"):
        cg.convolution(x, w, strides=True)


def test_op_refuses_a_missing_required_attribute_when_built():
    with pytest.raises(cg.MissingAttributeError, match="ConvolutionBackwardData: attribute 'pads_begin' is required"):
        cg.Op("ConvolutionBackwardData", strides=[2, 2])
    with pytest.raises(cg.MissingAttributeError, match="Convolution: attribute 'strides' is required"):
        cg.Op("Convolution", pads_begin=[0], pads_end=[0], dilations=[1])
    with pytest.raises(cg.MissingAttributeError, match="Elu: attribute 'alpha' is required"):
        cg.Op("Elu")
    with pytest.raises(cg.AttributeTypeError, match="'strides' = 2"):  # Op keeps the spec's lists
        cg.Op("Convolution", strides=2, pads_begin=[0], pads_end=[0], dilations=[1])
    cg.Op("Convolution", strides=[1], dilations=[1], auto_pad="same_upper")  # pads may be omitted then
    cg.Op("ConvolutionBackwardData", strides=[2, 2], lenient=True)


def test_results_come_back_in_the_inputs_library(rng):
    torch = pytest.importorskip("torch")
    x, w = rng.standard_normal((1, 6, 6, 2)).astype(np.float32), rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
    want = cg.convolution(x, w, pads_begin=1, pads_end=1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        got = cg.convolution(torch.from_numpy(x).to(dtype), torch.from_numpy(w).to(dtype), pads_begin=1, pads_end=1)
        assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got.float().numpy(), want, rtol=0.05, atol=0.1)  # bf16 inputs rounded
    assert type(cg.convolution(x.astype(np.float64).tolist(), w.astype(np.float64), pads_begin=1)) is np.ndarray
    assert type(cg.convolution(x, torch.from_numpy(w), pads_begin=1, pads_end=1)) is np.ndarray  # the first input's
    jnp = pytest.importorskip("jax.numpy")
    got = cg.convolution(jnp.asarray(x), jnp.asarray(w), pads_begin=1, pads_end=1)
    assert type(got).__module__.startswith("jax") and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_pytorch_layouts_get_a_hint(rng):
    x, w = np.zeros((2, 64, 14, 14), np.float32), np.zeros((128, 64, 3, 3), np.float32)
    with pytest.raises(cg.ShapeError, match=r"\(did you mean data_format='NCX', weights_format='OIX'\?\)$"):
        cg.convolution(x, w, pads_begin=1, pads_end=1)
    with pytest.raises(cg.ShapeError, match=r"\(did you mean weights_format='OIX'\?\)$"):
        cg.convolution(x, w, data_format="NCX")
    with pytest.raises(cg.ShapeError, match=r"did you mean data_format='NCX', weights_format='IOX'\?"):
        cg.conv_transpose(x, np.zeros((64, 32, 3, 3), np.float32))
    with pytest.raises(cg.ShapeError) as info:  # no format fits: no hint
        cg.convolution(x, np.zeros((128, 63, 3, 3), np.float32), data_format="NCX", weights_format="OIX")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("extra, library", [("torch", "PyTorch"), ("jax", "JAX"), ("dask", "dask")])
def test_an_extra_without_its_library_names_what_to_install(extra, library):
    code = f"import sys; sys.modules[{extra!r}] = None\nimport convgrad.{extra}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert (f"ModuleNotFoundError: convgrad.{extra} needs {library}, which is not installed: "
            f"pip install 'convgrad[{extra}]'") in result.stderr


def _imports(path: Path) -> set[str]:
    """The modules a file imports at run time (not under TYPE_CHECKING), relative ones with their dots."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for top in tree.body if isinstance(top, ast.If) and getattr(top.test, "id", None) ==
                   "TYPE_CHECKING" for n in ast.walk(top)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_core_and_dask_arrays_do_not_import_each_other():
    assert "..op" not in _imports(SRC / "dask" / "arrays.py")
    assert "..execution" in _imports(SRC / "dask" / "arrays.py")


def test_a_single_case_shows_that_it_runs_on_a_terminal():
    """On a terminal (stderr a tty) one case gets the progress line too: the elapsed time, the case
    and what it does; piped output gets none."""
    import os
    import pty

    command = [sys.executable, "-c", "from convgrad.cli import main; main()", "conv", "--dir=BWD_W",
               "mb2ic16ih14oc16oh14kh3ph1"]
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    master, slave = pty.openpty()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    stdout, _ = process.communicate(timeout=300)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0 and b"0:PASSED" in stdout
    assert "0: --dir=BWD_W mb2ic16ih14oc16oh14kh3ph1 (checking against the reference engine)" in terminal
    assert re.search(r"0:00:\d\d", terminal)
    piped = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert piped.returncode == 0 and "checking against" not in piped.stderr


def test_the_framework_adapters_take_scalars_and_default_strides(rng):
    jnp = pytest.importorskip("jax.numpy")
    import convgrad.jax as cj

    x, w = jnp.asarray(rng.standard_normal((2, 9, 9, 3)), jnp.float32), jnp.asarray(rng.standard_normal((3, 3, 3, 4)),
                                                                                      jnp.float32)
    want = cj.convolution(x, w, strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    np.testing.assert_array_equal(np.asarray(cj.convolution(x, w, strides=2, pads_begin=1, pads_end=1)), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(cj.convolution(x, w)), np.asarray(cj.convolution(x, w, strides=[1, 1])))
