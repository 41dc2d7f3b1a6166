"""Shared by the dask tests: the one LocalCluster fixture, problems for every op, and a worker
plugin that kills the worker running a chosen task (a worker dying mid-case)."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

import convgrad as cg
from convgrad.dtypes import DATA_DTYPES
from convgrad.graph.run import tolerance
from convgrad.opdefs import ops_of
from oracle import Geometry

OPS = tuple(ops_of("convolution"))  # the ops around them: test_dask_arrays' element-wise test
TRANSPOSED = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
# Which canonical tensor each input is (spec index order), and the output: x, y, w; "xs"/"ws" the
# shape of x / w as input 2.
ROLES = {
    "Convolution": (("x", "w", "b"), "y"),
    "ConvolutionBackwardData": (("y", "w", "xs"), "x"),
    "ConvolutionBackwardWeights": (("x", "y", "ws"), "w"),
    "ConvolutionBackpropFilters": (("x", "y", "ws"), "w"),
    "ConvTranspose": (("y", "w", "b"), "x"),
    "ConvTransposeBackwardData": (("x", "w"), "y"),
    "ConvTransposeBackwardWeights": (("y", "x", "ws"), "w"),
}


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes; a task whose worker dies is not retried."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
            yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as c:
        yield c


class Conv(Geometry):
    """The oracle's forward convolution ``y = conv(x, w)``, given by its total channel counts, with
    the shapes of its tensors in a layout."""

    def __init__(self, *, n: int, ic: int, oc: int, groups: int, **sizes: tuple[int, ...]) -> None:
        super().__init__(n=n, groups=groups, icg=ic // groups, ocg=oc // groups, **sizes)

    @property
    def output_padding(self) -> tuple[int, ...]:
        return self.extra

    def data(self, channels: int, size: tuple[int, ...], fmt: str) -> tuple[int, ...]:
        return (self.n, channels, *size) if fmt == "NCX" else (self.n, *size, channels)

    def weights(self, fmt: str) -> tuple[int, ...]:
        return (*self.kernel, self.icg, self.oc) if fmt[0] == "X" else (self.oc, self.icg, *self.kernel)


def weights_format(kind: str, data_format: str) -> str:
    """Channels-first weights with NCX data, spatial-first with NXC: both kinds get both."""
    if kind in TRANSPOSED:
        return "IOX" if data_format == "NCX" else "XOI"
    return "OIX" if data_format == "NCX" else "XIO"


def arguments(kind: str, conv: Conv, data_format: str, dtype: str, rng: np.random.Generator):
    """Inputs (spec order) and attributes of ``kind`` on ``conv``: random non-zero data."""
    wfmt = weights_format(kind, data_format)
    shapes = {"x": conv.data(conv.ic, conv.in_size, data_format), "y": conv.data(conv.oc, conv.out_size, data_format),
              "w": conv.weights(wfmt)}
    bias_channels = conv.oc if ROLES[kind][1] == "y" else conv.ic
    inputs = []
    for role in ROLES[kind][0]:
        if role == "xs":
            inputs.append(np.array(shapes["x"]))
        elif role == "ws":
            inputs.append(np.array(shapes["w"]))
        else:
            shape = (bias_channels,) if role == "b" else shapes[role]
            values = rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
            inputs.append(values.astype(DATA_DTYPES[dtype]))
    attrs = dict(strides=list(conv.strides), dilations=list(conv.dilations), pads_begin=list(conv.pads_begin),
                 pads_end=list(conv.pads_end), groups=conv.groups, data_format=data_format)
    attrs[cg.OPS[kind].weights_format_attr] = wfmt
    if "output_padding" in cg.OPS[kind].attr_names:
        attrs["output_padding"] = list(conv.output_padding)
    return inputs, attrs


def data_roles(kind: str) -> list[int]:
    """Indices of the data inputs (x, y roles) of ``kind``."""
    return [i for i, role in enumerate(ROLES[kind][0]) if role in ("x", "y")]


def assert_close(got: np.ndarray, want: np.ndarray, kind: str, inputs, attrs, what: str) -> None:
    """Equal up to the summation order of f32 (one rounding of the output dtype, f32 sums)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    problem = cg.Op(kind, lenient=True, **attrs).infer(*inputs)
    scale = max(float(np.abs(want.astype(np.float64)).max()), 1e-30)
    error = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / scale
    assert error <= tolerance(problem, want.dtype), f"{what}: error {error:.3g} relative to max |NumPy result|"


def function(kind: str):
    return getattr(cg, cg.OPS[kind].function)


class KillOnTask(WorkerPlugin):
    """Ends the worker process (as the kernel's out-of-memory killer would) when it starts a task
    whose key begins with ``prefix``."""

    name = "convgrad-test-kill"

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish == "executing" and str(key).startswith(self.prefix):
            os._exit(1)
