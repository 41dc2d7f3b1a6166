"""The fast engine (the default): a few strategies, one plan per problem.

Each call builds the problem's :class:`Features` once, asks :func:`select` for a :class:`Plan`
(a forced plan, else a cached one, else the tuning table's rule: :mod:`.plan`; a repeated call
finds both in :func:`.plan.planned`'s memo) and runs the plan's strategy, one module each with
``applies``, ``run`` and ``workspace_bytes``:

- ``direct`` (:mod:`.direct`): compiled loops over the data as it lies: small problems, and
  depthwise ones (vectorised over the channels);
- ``jit`` (:mod:`.jit`): implicit-GEMM convolutions on our JIT micro-kernels (f32 accumulation);
- ``gemm`` (:mod:`.gemm`): GEMMs on NumPy's BLAS over phase frames, output rows, pointwise
  blocks or per-image matrices (f64 always, and where the rule says).

Every parallel loop runs in one pool (numba's GNU OpenMP layer), safe under fork and one call at
a time (:mod:`.pool`).
An empty batch needs no plan: zeros. Every threshold is in :mod:`.tuning`; docs/engine-measurements.md has the
measurements behind them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ... import layout
from ...dtypes import compute_dtype
from ...problem import ConvGeometry
from .. import register
from . import blis, direct, direct_flat, pool, tune, workspace
from .features import Features
from .frame import Frame, empty_like_data
from .plan import (STRATEGIES, Plan, candidates, default_plan, forced_plan, forced_strategy, gemm_variant, jit_selected,
                   context, one_call, planned, select, strategy_module, warm)
from .tuning import TUNING

__all__ = ["FastEngine", "Features", "Plan", "STRATEGIES", "TUNING", "Frame", "candidates", "default_plan", "select",
           "forced_plan", "forced_strategy", "strategy_module", "jit_selected", "gemm_variant"]

class FastEngine:
    """The fast engine (``engine="fast"``, the default)."""

    name = "fast"
    #: Takes ``out_dtype``: bf16 results of our GEMM are rounded as its tiles are stored.
    rounds = True
    #: Sets ``np.errstate(all="ignore")`` itself where it computes with NumPy (not on the serial
    #: ``direct`` loops, whose compiled arithmetic raises no NumPy warnings: 1.4 µs of a tiny call).
    quiet = True
    #: One API call's scope: the selection context is read once for its estimate and its run.
    scope = staticmethod(one_call)
    #: What the plans, and so the memory estimates, depend on besides the problem (:func:`.plan.context`).
    state = staticmethod(context)

    @staticmethod
    def _run(g: ConvGeometry, task: str, a: np.ndarray, b: np.ndarray, out_dtype: np.dtype | None) -> np.ndarray:
        if g.n == 0:
            acc = compute_dtype(a.dtype)
            if task == "backward_weights":
                return np.zeros(g.w_shape, acc)
            return empty_like_data(g.y_shape if task == "forward" else g.x_shape, acc, a, fill=True)
        channels_first = layout.channels_first(a)
        hit = warm(g, task, a.dtype, channels_first)
        if hit is not None and direct.serial(hit[1]):     # a repeated small call: no pool, no workspace
            return FastEngine._serial(hit, g, task, a.dtype, out_dtype)(a, b)
        return FastEngine._pooled(g, task, a, b, out_dtype, channels_first, hit)

    @staticmethod
    def _pooled(g: ConvGeometry, task: str, a: np.ndarray, b: np.ndarray, out_dtype: np.dtype | None,
                channels_first: bool, hit: tuple[Features, Plan, int] | None) -> np.ndarray:
        """``task`` in the pool by the plan of ``hit`` (None: :func:`.plan.planned`'s, selected,
        and on a first call perhaps tuned, in the pool). OpenBLAS's threads, left spinning by a
        small ``gemm`` call, are stopped before another plan runs on numba's threads; a large
        ``gemm`` call stops them as it ends (:mod:`.pool`)."""
        if (hit is None or hit[1].strategy != "gemm") and pool.blas_spinning():
            pool.quiet_blas()
        with np.errstate(all="ignore"):  # IEEE arithmetic: NaN and Inf propagate, overflow gives Inf
            f, plan, result = pool.run(FastEngine._planned_run, g, task, a, b, out_dtype, channels_first, hit)
        if plan.strategy == "gemm":
            if f.flops >= TUNING.quiet_blas_flops:
                pool.quiet_blas()
            else:
                pool.blas_ran()
        tune.ran(f)
        return result

    @staticmethod
    def bind(g: ConvGeometry, task: str, dtype: np.dtype, channels_first: bool,
             out_dtype: np.dtype | None = None) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
        """``task`` on ``g`` for canonical inputs of ``dtype`` (stored channels-first or not) as a
        function ``run(a, b)`` of the inputs, where a call has run it before (under the current
        :func:`.plan.context`, which the caller keys it by), by the plan it ran: a serial
        ``direct`` loop on the calling thread, any other in the pool; else None. What a repeated
        call keeps (:func:`convgrad.execution.execute`)."""
        hit = warm(g, task, dtype, channels_first) if g.n else None
        if hit is None:
            return None
        if direct.serial(hit[1]):
            return FastEngine._serial(hit, g, task, dtype, out_dtype)
        return lambda a, b: FastEngine._pooled(g, task, a, b, out_dtype, channels_first, hit)

    @staticmethod
    def _at(g: ConvGeometry, task: str, dtype: np.dtype) -> tuple[Features, np.ndarray] | None:
        if dtype != np.float32 or g.groups != 1 or not g.n:
            return None
        f, plan, _ = planned(g, task, np.dtype(np.float32), False)
        if not direct.serial(plan) or plan.param("loops") != "flat":
            return None
        params = direct_flat.at_params(g, task, direct.loop_shapes(g)[:3])
        return (f, params) if params is not None else None

    @staticmethod
    def at_params(g: ConvGeometry, task: str, dtype: np.dtype) -> np.ndarray | None:
        """:func:`.direct_flat.run_at`'s parameters where ``task`` on ``g`` (f32, one group,
        canonical C-contiguous inputs of channels-last data) runs, by the plan now, on the serial
        ``flat`` loops: the call as a compiled function of the inputs' and result's addresses (an
        XLA custom call without Python, :mod:`convgrad.jax`); else None."""
        at = FastEngine._at(g, task, dtype)
        return at[1] if at is not None else None

    @staticmethod
    def bind_at(g: ConvGeometry, task: str, dtype: np.dtype) -> Callable[[int, int, int], None] | None:
        """:meth:`at_params`' run as ``run(a, b, out)`` on the addresses of the two canonical
        inputs and the result (f32, C-contiguous; :mod:`convgrad.torch`'s repeated small calls);
        the caller keys it by :func:`.plan.context`."""
        at = FastEngine._at(g, task, dtype)
        if at is None:
            return None
        f, params = at
        address = params.ctypes.data

        def run(a: int, b: int, out: int) -> None:
            direct_flat.run_at(a, b, out, address)
            tune.ran(f)
        run.params = params  # type: ignore[attr-defined]  # the memory at ``address``, alive as long as ``run``
        return run

    @staticmethod
    def _serial(hit: tuple[Features, Plan, int], g: ConvGeometry, task: str, dtype: np.dtype,
                out_dtype: np.dtype | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        f, plan, _ = hit
        loops = direct.bind(plan, g, task, dtype, _rounded(dtype, out_dtype))

        def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            result = loops(a, b)
            tune.ran(f)
            return result
        return run

    @staticmethod
    def _planned_run(g: ConvGeometry, task: str, a: np.ndarray, b: np.ndarray, out_dtype: np.dtype | None,
                     channels_first: bool, hit: tuple[Features, Plan, int] | None) -> tuple[Features, Plan, np.ndarray]:
        f, plan, _ = hit or planned(g, task, a.dtype, channels_first, tune=True)   # hit: :func:`.plan.warm`'s
        with workspace.call():   # the call's temporaries come from, and go back to, the engine's cache
            return f, plan, strategy_module(plan.strategy).run(plan, g, a, b, task, _rounded(a.dtype, out_dtype))

    def forward(self, g: ConvGeometry, x: np.ndarray, w: np.ndarray, out_dtype: np.dtype | None = None) -> np.ndarray:
        return self._run(g, "forward", x, w, out_dtype)

    def backward_data(self, g: ConvGeometry, dy: np.ndarray, w: np.ndarray,
                      out_dtype: np.dtype | None = None) -> np.ndarray:
        return self._run(g, "backward_data", dy, w, out_dtype)

    def backward_weights(self, g: ConvGeometry, x: np.ndarray, dy: np.ndarray,
                         out_dtype: np.dtype | None = None) -> np.ndarray:
        return self._run(g, "backward_weights", x, dy, out_dtype)

    @staticmethod
    def weights_in_format(array: np.ndarray, weights_format: str) -> np.ndarray:
        """:func:`convgrad.layout.weights_in_format` of a canonical weights result, its axes
        reversed in the pool (:func:`.blis.reversed_weights`) from ``TUNING.reversed_weights_bytes``:
        (K, ICg, OC) memory into OIX/IOX, or sums in OIX memory (the ``gemm`` strategy's of NCX
        data) into XIO/XOI."""
        view = layout.weights_from_canonical(array, weights_format)
        if array.nbytes >= TUNING.reversed_weights_bytes and not view.flags.c_contiguous:
            if weights_format[0] != "X":
                out = pool.run(blis.reversed_weights, array)
            else:
                oix = layout.weights_from_canonical(array, "OIX")      # (OC, ICg, *K): reversed, XIO
                out = pool.run(blis.reversed_weights, oix.reshape(*oix.shape[:2], -1)) \
                    if oix.flags.c_contiguous else None
                out = out.reshape(array.shape) if out is not None else None
            if out is not None:
                return out
        return layout.weights_in_format(array, weights_format)

    @staticmethod
    def result_dtype(dtype: np.dtype) -> np.dtype:
        """The dtype of the results: f32 for f32/bf16/f16 data, f64 for f64."""
        return compute_dtype(dtype)

    @staticmethod
    def workspace_bytes(g: ConvGeometry, task: str, dtype: np.dtype) -> int:
        """Upper estimate of the extra memory ``task`` allocates beyond its inputs (its result
        included for bf16/f16 data, whose f32 result the API rounds), for data of either memory
        order: the selected plan's strategy's own bound (:func:`.plan.select`)."""
        dtype = np.dtype(dtype)
        if g.n == 0:
            return math.prod(g.w_shape) * compute_dtype(dtype).itemsize + 4096
        now = context()
        return max(planned(g, task, dtype, channels_first, now=now)[2] for channels_first in (False, True))


def _rounded(dtype: np.dtype, out_dtype: np.dtype | None) -> bool:
    """Whether a 16-bit result may come back rounded to ``dtype`` (``out_dtype``: the caller's)."""
    return out_dtype is not None and np.dtype(out_dtype) == dtype != compute_dtype(dtype)


register(FastEngine(), default=True)
