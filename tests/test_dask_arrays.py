"""convgrad on dask arrays: every op chunked along the batch and the spatial axes equals the NumPy
path (on a LocalCluster of worker processes and on the threaded scheduler), a volume in zarr over
the memory budget computes block by block, and shape errors come at call time."""

from __future__ import annotations

import subprocess
import sys

import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import dask  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import convgrad as cg  # noqa: E402
from convgrad.dask.blocks import split_axis  # noqa: E402
from convgrad.limits import estimate_bytes  # noqa: E402

from dask_support import (OPS, Conv, arguments, assert_close, client, cluster, data_roles,  # noqa: E402,F401
                          function)

CONV = Conv(n=5, ic=4, oc=6, groups=2, in_size=(13, 10), kernel=(3, 2), strides=(2, 1), dilations=(1, 2),
            pads_begin=(1, 0), pads_end=(2, 1))


def chunked(inputs, kind: str, attrs, how: str):
    """The inputs with dask data (and, chunked in space, dask weights): ``batch`` splits the batch
    (3, 2); ``space`` splits every spatial axis in two, at different places in x and y (a task on
    a cluster costs milliseconds here: few blocks)."""
    out = list(inputs)
    spatial = range(2, 4) if attrs["data_format"] == "NCX" else range(1, 3)
    for i in data_roles(kind):
        if how == "batch":
            out[i] = da.from_array(inputs[i], chunks={0: (3, 2)})
        else:
            out[i] = da.from_array(inputs[i], chunks={a: inputs[i].shape[a] // 2 + 1 for a in spatial})
    if how == "space":
        out[1] = da.from_array(inputs[1], chunks=-1)
    return out


@pytest.mark.parametrize("kind", OPS)
def test_chunked_equals_numpy_on_a_cluster(kind, client, rng):
    """Both layouts, f32/bf16/f16, batch and space chunks: one compute on the cluster."""
    cases = []
    for fmt in ("NCX", "NXC"):
        for dtype in ("f32", "bf16", "f16"):
            inputs, attrs = arguments(kind, CONV, fmt, dtype, rng)
            want = function(kind)(*inputs, **attrs)
            for how in ("batch", "space"):
                lazy = function(kind)(*chunked(inputs, kind, attrs, how), **attrs)
                assert isinstance(lazy, da.Array) and lazy.shape == want.shape and lazy.dtype == want.dtype
                cases.append((lazy, want, inputs, attrs, f"{kind} {fmt} {dtype} chunked by {how}"))
    results = client.gather(client.compute([c[0] for c in cases]))
    for got, (_, want, inputs, attrs, what) in zip(results, cases):
        assert_close(got, want, kind, inputs, attrs, what)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_1d_blocks_equal_numpy(data):
    """Random strides, dilations, pads and chunks (also smaller than the halo): forward, data and
    weights gradients of a 1-D convolution, f64 on the synchronous scheduler."""
    k, s, d = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    pb, pe = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4))
    size = data.draw(st.integers(max(1, (k - 1) * d + 1 - pb - pe), 30))
    conv = Conv(n=2, ic=2, oc=3, groups=1, in_size=(size,), kernel=(k,), strides=(s,), dilations=(d,),
                pads_begin=(pb,), pads_end=(pe,))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    fmt = data.draw(st.sampled_from(["NCX", "NXC"]))
    axis = 2 if fmt == "NCX" else 1
    for kind in ("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvTranspose"):
        inputs, attrs = arguments(kind, conv, fmt, "f64", rng)
        want = function(kind)(*inputs, **attrs)
        lazy = list(inputs)
        for i in data_roles(kind):
            length = inputs[i].shape[axis]
            lazy[i] = da.from_array(inputs[i], chunks={axis: data.draw(st.integers(1, length))})
        got = function(kind)(*lazy, **attrs).compute(scheduler="sync")
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{kind} {conv} {fmt}")


@given(st.lists(st.integers(1, 40), min_size=0, max_size=6), st.integers(1, 60), st.integers(1, 5),
       st.integers(0, 6), st.integers(1, 12), st.sampled_from(["x", "y"]), st.sampled_from(["left", "right"]))
def test_split_axis_aligns_to_the_stride(cuts, in_size, stride, pad, eff, cuts_in, halo):
    """Blocks are aligned (i_j = o_j*S - PB), strictly inside the axis and at least their halo."""
    pe = max(0, eff - in_size - pad)
    out_size = (in_size + pad + pe - eff) // stride + 1
    split = split_axis(cuts, in_size=in_size, out_size=out_size, stride=stride, pad_begin=pad, eff_kernel=eff,
                       cuts_in=cuts_in, halo=halo)
    assert split.o[0] == 0 and split.o[-1] == out_size and split.i[0] == 0 and split.i[-1] == in_size
    assert all(i == o * stride - pad for i, o in zip(split.i[1:-1], split.o[1:-1]))
    assert min(split.o_sizes()) > 0 and min(split.i_sizes()) > 0
    if split.blocks > 1:
        need = split.right_halo if halo == "right" else split.left_halo
        assert min(split.i_sizes() if halo == "right" else split.o_sizes()) >= need


def test_weights_gradient_is_rounded_once(rng):
    """32 batch chunks: the f32 partial sums rounded once give the unchunked bf16 result within
    one bf16 step, where rounding each chunk's gradient would be far off."""
    conv = Conv(n=32, ic=3, oc=4, groups=1, in_size=(9, 9), kernel=(3, 3), strides=(1, 1), dilations=(1, 1),
                pads_begin=(1, 1), pads_end=(1, 1))
    inputs, attrs = arguments("ConvolutionBackwardWeights", conv, "NXC", "bf16", rng)
    want = cg.convolution_backward_weights(*inputs, **attrs).astype(np.float64)
    x, dy = (da.from_array(a, chunks={0: 1}) for a in inputs[:2])
    got = cg.convolution_backward_weights(x, dy, inputs[2], **attrs).compute(scheduler="threads")
    got = got.astype(np.float64)
    step = np.maximum(np.abs(want), np.abs(got)) * 2.0**-7  # one bf16 step (8 significant bits)
    assert np.all(np.abs(got - want) <= step)
    per_chunk = sum(cg.convolution_backward_weights(inputs[0][i:i + 1], inputs[1][i:i + 1], inputs[2], **attrs)
                    .astype(np.float64) for i in range(conv.n))
    assert np.any(np.abs(per_chunk - want) > 2 * step)  # what rounding per chunk would give


def test_zarr_volume_over_the_budget_computes_block_by_block(tmp_path, rng, monkeypatch):
    """A 3-D volume in zarr whose whole problem the memory guard rejects: forward and data
    gradient write zarr block by block (each block call passing the guard), the weights gradient
    is tree-summed; all equal NumPy."""
    conv = Conv(n=1, ic=4, oc=4, groups=1, in_size=(40, 40, 40), kernel=(3, 3, 3), strides=(2, 1, 1),
                dilations=(1, 2, 1), pads_begin=(1, 2, 0), pads_end=(1, 1, 2))
    attrs = dict(strides=list(conv.strides), dilations=list(conv.dilations), pads_begin=list(conv.pads_begin),
                 pads_end=list(conv.pads_end), data_format="NXC")
    x = rng.uniform(-1, 1, conv.data(4, conv.in_size, "NXC")).astype(np.float32)
    w = rng.uniform(-1, 1, conv.weights("XIO")).astype(np.float32)
    dy = rng.uniform(-1, 1, conv.data(4, conv.out_size, "NXC")).astype(np.float32)
    want = {"y": cg.convolution(x, w, **attrs), "dx": cg.convolution_backward_data(dy, w, x.shape, **attrs),
            "dw": cg.convolution_backward_weights(x, dy, w.shape, **attrs)}
    da.from_array(x, chunks=(1, 10, 10, 10, 4)).to_zarr(str(tmp_path / "x.zarr"))
    da.from_array(dy, chunks=(1, 10, 10, 10, 4)).to_zarr(str(tmp_path / "dy.zarr"))
    # The frame strategy (forced: the estimates below are its own) needs at most about 4.6 MiB
    # for a block and 8.7 MiB for the whole forward problem.
    monkeypatch.setenv("CONVGRAD_STRATEGY", "frame")
    budget = 5 * 2**20
    whole = cg.Op("Convolution", lenient=True, **attrs).infer(x.shape, w.shape)
    assert estimate_bytes(whole, cg.get_engine()) > 1.5 * budget
    cg.set_memory_budget(budget)
    try:
        with pytest.raises(cg.ResourceError):
            cg.convolution(x, w, **attrs)
        xz, dyz = da.from_zarr(str(tmp_path / "x.zarr")), da.from_zarr(str(tmp_path / "dy.zarr"))
        with dask.config.set(scheduler="threads"):
            cg.convolution(xz, w, **attrs).to_zarr(str(tmp_path / "y.zarr"))
            dx = cg.convolution_backward_data(dyz, w, x.shape, **attrs)  # aligned: the first chunks PB shorter
            dx.rechunk((1, 10, 10, 10, 4)).to_zarr(str(tmp_path / "dx.zarr"))
            dw = cg.convolution_backward_weights(xz, dyz, w.shape, **attrs).compute()
    finally:
        cg.set_memory_budget(None)
    for name, got in (("y", zarr.open_array(str(tmp_path / "y.zarr"))[...]),
                      ("dx", zarr.open_array(str(tmp_path / "dx.zarr"))[...]), ("dw", dw)):
        np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=2e-5 * np.abs(want[name]).max(), err_msg=name)


def test_errors_come_at_call_time():
    """Shape errors are convgrad's, raised before any block is computed; a block over the budget
    is refused when the lazy array is built."""
    def boom(block):
        raise AssertionError("computed")

    x = da.ones((2, 8, 8, 3), chunks=(1, 4, 4, 3), dtype=np.float32).map_blocks(boom, dtype=np.float32)
    with pytest.raises(cg.ShapeError, match="Convolution"):
        cg.convolution(x, np.ones((3, 3, 4, 5), np.float32), strides=[1, 1])
    with pytest.raises(cg.DTypeError):
        cg.convolution(x, np.ones((3, 3, 3, 5), np.float16), strides=[1, 1])
    lazy = cg.convolution(x, np.ones((3, 3, 3, 5), np.float32), strides=[1, 1])
    assert lazy.shape == (2, 6, 6, 5)
    unknown = x[x[:, 0, 0, 0] > 0]
    with pytest.raises(cg.InputError, match="unknown"):
        cg.convolution(unknown, np.ones((3, 3, 3, 5), np.float32), strides=[1, 1])
    cg.set_memory_budget(1000)
    try:
        with pytest.raises(cg.ResourceError):
            cg.convolution(x, np.ones((3, 3, 3, 5), np.float32), strides=[1, 1])
    finally:
        cg.set_memory_budget(None)


def test_op_objects_and_numpy_inputs_with_dask_weights(rng):
    """``Op.__call__`` on dask inputs; NumPy data with dask weights is lazy too; NumPy stays NumPy."""
    x = rng.standard_normal((3, 2, 9), dtype=np.float32)
    w = rng.standard_normal((4, 2, 3), dtype=np.float32)
    op = cg.Op("Convolution", strides=[2], pads_begin=[1], pads_end=[1], dilations=[1], data_format="NCX",
               weights_format="OIX")
    want = op(x, w)
    assert isinstance(want, np.ndarray)
    for inputs in ((da.from_array(x, chunks=(1, 2, 4)), w), (x, da.from_array(w))):
        got = op(*inputs)
        assert isinstance(got, da.Array)
        np.testing.assert_array_equal(got.compute(scheduler="threads"), want)
    assert isinstance(op(x, w), np.ndarray)
    dy = rng.standard_normal(want.shape, dtype=np.float32)
    grad = cg.Op("ConvolutionBackwardWeights", **{k: v for k, v in op.attrs.items()})
    lazy = grad(da.from_array(x, chunks=(2, 2, 9)), dy, da.from_array(np.array(w.shape)))  # a dask shape input
    np.testing.assert_allclose(lazy.compute(scheduler="threads"), grad(x, dy, w.shape), rtol=1e-5, atol=1e-5)


def test_import_convgrad_does_not_import_dask():
    code = ("import sys, numpy as np, convgrad as cg; "
            "cg.convolution(np.ones((1, 4, 4, 1), np.float32), np.ones((3, 3, 1, 1), np.float32), strides=[1, 1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'zarr')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



def test_elementwise_binary_and_typecast_ops_run_block_by_block():
    """The ops around convolutions whose elements are independent take dask arrays too: each block is
    the op on the matching (broadcast) blocks, equal to the NumPy call; the others say they need NumPy."""
    rng = np.random.default_rng()
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)
    dy = rng.standard_normal((6, 5, 4)).astype(np.float32)
    bias = rng.standard_normal((1, 4)).astype(np.float32)
    lazy_x, lazy_dy = da.from_array(x, chunks=(2, 3, 4)), da.from_array(dy, chunks=(3, 5, 2))
    with dask.config.set(scheduler="threads"):
        for got, want in [
            (cg.relu(lazy_x), cg.relu(x)),
            (cg.gelu(lazy_x, mode="gelu_tanh"), cg.gelu(x, mode="gelu_tanh")),
            (cg.relu_backward(lazy_x, lazy_dy, use_dst=False), cg.relu_backward(x, dy, use_dst=False)),
            (cg.add(lazy_x, bias), cg.add(x, bias)),  # broadcast operand, NumPy
            (cg.multiply(lazy_x, da.from_array(bias)), cg.multiply(x, bias)),
            (cg.type_cast(lazy_x, dtype="bf16"), cg.type_cast(x, dtype="bf16")),
        ]:
            assert isinstance(got, da.Array) and got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got.compute(), want)
    with pytest.raises(cg.InputTypeError, match=r"BiasAdd: input 'src'.*dask array.*\.compute\(\)"):
        cg.bias_add(lazy_x, np.ones(4, np.float32))
    with pytest.raises(cg.ShapeError):  # shapes are still checked at call time
        cg.add(lazy_x, da.ones((6, 5, 3), dtype=np.float32, chunks=2))
