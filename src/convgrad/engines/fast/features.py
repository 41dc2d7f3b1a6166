"""The one record of a problem that plan selection reads (:class:`Features`), built once per call."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass, fields

import numpy as np

from ...dtypes import DATA_DTYPES, compute_dtype
from ...problem import ConvGeometry
from . import isa
from .frame import Frame
from .geometry import pointwise as is_pointwise
from .tuning import TUNING

__all__ = ["Features", "TASKS"]

TASKS = ("forward", "backward_data", "backward_weights")
_DTYPES = {np.dtype(d).name: np.dtype(d) for d in DATA_DTYPES.values()}


@dataclass(frozen=True)
class Features:
    """Everything :func:`.plan.select` reads about one problem: the task, the data's dtype and
    memory order, the convolution's sizes and the host's kernel family."""

    task: str                      #: "forward" | "backward_data" | "backward_weights"
    dtype: str                     #: the data's dtype: "float32" | "bfloat16" | "float16" | "float64"
    n: int
    groups: int
    icg: int
    ocg: int
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    channels_first: bool           #: NCX data memory (False: NXC)
    shared: bool                   #: PyTorch is loaded: its OpenMP threads share the cores
    family: str                    #: :func:`.isa.family` when built

    @classmethod
    def of(cls, g: ConvGeometry, task: str, dtype: np.dtype | str, channels_first: bool,
           shared: bool | None = None) -> Features:
        """The features of ``task`` on ``g`` for data of ``dtype`` stored NCX (``channels_first``)
        or NXC; ``shared`` (default: whether ``torch`` is imported) that another framework's
        thread pool runs beside ours."""
        if task not in TASKS:
            raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
        shared = "torch" in sys.modules if shared is None else bool(shared)
        return cls(task, np.dtype(dtype).name, g.n, g.groups, g.icg, g.ocg, g.in_size, g.out_size, g.kernel,
                   g.strides, g.dilations, g.pads_begin, g.pads_end, bool(channels_first), shared, isa.family())

    def key(self) -> str:
        """A stable text of every field but ``family`` (a plan cache adds the CPU and family)."""
        return ";".join(f"{fl.name}={_text(getattr(self, fl.name))}" for fl in fields(self) if fl.name != "family")

    # -- derived --------------------------------------------------------------------------------
    @functools.cached_property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry(self.n, self.groups, self.groups * self.icg, self.groups * self.ocg, self.in_size,
                            self.out_size, self.kernel, self.strides, self.dilations, self.pads_begin, self.pads_end)

    @property
    def data_dtype(self) -> np.dtype:
        return _DTYPES[self.dtype]

    @property
    def acc(self) -> np.dtype:
        """The accumulation dtype: f64 for f64 data, else f32."""
        return compute_dtype(self.data_dtype)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def flops(self) -> int:
        """2*N*OC*ICg*prod(K)*prod(O): the multiply-adds of any of the three tasks, twice."""
        return 2 * self.n * self.groups * self.ocg * self.icg * self.taps * math.prod(self.out_size)

    @property
    def depthwise(self) -> bool:
        return self.icg == 1 and self.ocg == 1

    @property
    def unpadded(self) -> bool:
        return not any(self.pads_begin) and not any(self.pads_end)

    @property
    def pointwise(self) -> bool:
        """A 1x1 kernel without padding and with one group (any stride): one GEMM."""
        return is_pointwise(self.geometry)

    @property
    def frame_size(self) -> tuple[int, ...]:
        """Positions per axis of the ``gemm`` strategy's phase frame (:class:`.frame.Frame`)."""
        return Frame.of(self.geometry).size

    def junk_heavy(self) -> bool:
        """Whether a gradient's frame has ``TUNING.junk_ratio`` times more rows than there are
        outputs (a large dilation on a small output)."""
        return self.task != "forward" and \
            math.prod(self.frame_size) >= TUNING.junk_ratio[self.task] * max(1, math.prod(self.out_size))

    @property
    def io_bytes(self) -> int:
        """Bytes of the op's inputs and output in the data's dtype."""
        g = self.geometry
        return (math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape)) * self.data_dtype.itemsize

    @property
    def result_shape(self) -> tuple[int, ...]:
        g = self.geometry
        return {"forward": g.y_shape, "backward_data": g.x_shape, "backward_weights": g.w_shape}[self.task]


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return "x".join(map(str, value)) if value else "-"
    return str(value).lower() if isinstance(value, bool) else str(value)
