"""Running a plan: random inputs laid out with their strides, dependency-ordered execution, the
check of an engine against the reference engine, and timing.

Inputs are random non-zero multiples of 1/8 in [-1, 1] (exact in f32, bf16 and f16), positive for
a graph input that an op needs positive (Log, Sqrt, Pow). A tensor with non-dense strides is a real strided view into a larger buffer whose gaps hold NaN, so an engine
that reads outside the logical elements produces NaN and fails the check.

The check runs every op on the graph's values with the engine under test and again with the
reference engine, on the same inputs (a convolution slab by slab, in bounded memory:
:mod:`.reference_check`), and compares elementwise relative to the largest finite reference
magnitude: ``max |got - ref| / max |ref| <= eps(out) + 8 * eps(acc) * sqrt(R)``, where
eps(out) covers the one final rounding, eps(acc) is the engine's accumulation precision (f32, or
f64 for f64 data) and R the reduction length (ICg*K forward, OCg*K backward-data, N*O
backward-weights, N*spatial for BiasAddBackward, 1 for the other element-wise ops). NaN where the
reference has NaN and the same infinity where it has one (Log of a negative conv output, 1/0) agree;
any other non-finite value fails.

Timing runs the whole plan and also clocks its convolutions, so a perf line's GFLOP/s is that of
the convolutions and the rest of the graph's time is reported beside it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..dtypes import DATA_DTYPES, compute_dtype
from ..engines import Engine, get_engine
from ..errors import ConvgradError
from ..limits import memory_budget
from ..problem import Problem
from ..tensor_ops import TensorProblem
from .model import GraphError, LogicalTensor, storage_size
from .plan import Plan, Step
from .reference_check import blocks, check_bytes, convolution_error, relative_error

__all__ = ["OpCheck", "Timing", "check_size", "make_inputs", "execute", "check", "time_plan", "tolerance",
           "reduction_length", "strided", "relative_error"]


def strided(values: np.ndarray, stride: tuple[int, ...] | None) -> np.ndarray:
    """``values`` as a view with ``stride`` (elements) into a buffer whose gaps hold NaN."""
    if stride is None or values.ndim == 0:
        return values
    buffer = np.full(max(storage_size(values.shape, stride), 1), np.nan, dtype=values.dtype)
    view = np.lib.stride_tricks.as_strided(buffer, values.shape, [s * values.itemsize for s in stride])
    view[...] = values
    return view


def _fill(rng: np.random.Generator, tensor: LogicalTensor, positive: bool = False) -> np.ndarray:
    values = np.empty(tensor.shape, DATA_DTYPES[tensor.dtype])
    for index in blocks(values.shape):  # bounded temporaries, whatever the tensor's size
        block = values[index]
        magnitude = rng.integers(1, 9, size=block.shape) / 8.0
        values[index] = magnitude if positive else np.where(rng.random(block.shape) < 0.5, -magnitude, magnitude)
    return strided(values, None if tensor.is_dense else tensor.stride)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def _positive_inputs(plan: Plan) -> set[int]:
    """Tensor ids some op reads through an input that must be positive (Log's src, ...)."""
    return {tid for step in plan.steps for spec, tid in zip(step.op.definition.inputs, step.input_ids)
            if spec.positive}


def _padded_shape(step: Step) -> tuple[int, ...]:
    """Shape of a zero-padded float64 copy of the op's data input (bounds the padded buffers an engine holds)."""
    g = step.problem.geometry
    return (g.n, *g.padded_size, g.ic)


def check_size(plan: Plan, limit: int | None = None) -> None:
    """Raise GraphError when a size does not fit in int64, or when the plan would need more than
    ``limit`` bytes (default: the library's memory budget, :func:`convgrad.limits.memory_budget`):
    every tensor with its strides' gaps, and the largest reference check of a convolution
    (:func:`~.reference_check.check_bytes`)."""
    limit = memory_budget() if limit is None else limit
    shapes = {f"tensor {tid} ({t.dtype})": t.shape for tid, t in plan.tensors.items()}
    convolutions = [step for step in plan.steps if step.is_convolution]
    shapes.update({f"{step.source.label}: padded input": _padded_shape(step) for step in convolutions})
    for name, shape in shapes.items():
        if any(size >= 2**63 for size in shape):
            raise GraphError(f"{plan.graph.source}: {name} has shape {list(shape)}: expected sizes below 2^63")
    needs = {f"tensor {tid} {list(t.shape)} ({t.dtype})":
             storage_size(t.shape, t.strides) * DATA_DTYPES.get(t.dtype, np.dtype(np.int32)).itemsize
             for tid, t in plan.tensors.items()}
    checks = {f"{step.source.label}: reference check (f64)": check_bytes(step.problem) for step in convolutions}
    total = sum(needs.values()) + max(checks.values(), default=0)
    if total > limit:
        name, nbytes = max({**needs, **checks}.items(), key=lambda item: item[1])
        raise GraphError(f"{plan.graph.source}: the case needs {_gib(total)} of memory (largest: {name}, "
                         f"{_gib(nbytes)}): expected at most {_gib(limit)}; use smaller shapes, --mb or pads")


def make_inputs(plan: Plan, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Fresh data for every graph input (shape tensors get their resolved values, the graph's
    constants their value), after
    :func:`check_size`."""
    check_size(plan)
    positive = _positive_inputs(plan)
    constants = dict(plan.graph.constants)
    return {tid: np.array(plan.shape_values[tid], dtype=np.int32) if tid in plan.shape_values
            else np.full(plan.tensors[tid].shape, constants[tid], DATA_DTYPES[plan.tensors[tid].dtype])
            if tid in constants else _fill(rng, plan.tensors[tid], tid in positive) for tid in plan.inputs}


def _run_step(step: Step, values: dict[int, np.ndarray], engine: Engine) -> np.ndarray:
    result = step.op(*(values[tid] for tid in step.input_ids), engine=engine)
    return result.astype(DATA_DTYPES[step.output.dtype], copy=False)


def execute(plan: Plan, engine: Engine | str | None, inputs: dict[int, np.ndarray],
            convolution_seconds: list[float] | None = None) -> dict[int, np.ndarray]:
    """Every tensor's value after running the plan's ops in order; outputs are laid out with
    their tensor's strides when those are not dense (so consumers see them as written). With
    ``convolution_seconds``, the time spent in convolution ops is added to its first entry."""
    engine = get_engine(engine)
    values = dict(inputs)
    for step in plan.steps:
        out = step.output
        start = time.perf_counter()
        try:
            result = _run_step(step, values, engine)
        except ConvgradError as exc:  # e.g. inputs whose dtypes differ (--dt=ID:DT)
            raise GraphError(f"{step.source.label}: {exc}") from None
        values[out.id] = strided(result, None if out.is_dense else out.stride)
        if convolution_seconds is not None and step.is_convolution:
            convolution_seconds[0] += time.perf_counter() - start
    return values


def reduction_length(problem: Problem | TensorProblem) -> int:
    """Number of products summed into one output element of the op's canonical problem."""
    if isinstance(problem, TensorProblem):
        return problem.reduction
    g = problem.geometry
    if problem.task == "forward":
        return g.icg * math.prod(g.kernel)
    if problem.task == "backward_data":
        return g.ocg * math.prod(g.kernel)
    return g.n * math.prod(g.out_size)


def tolerance(problem: Problem | TensorProblem, out_dtype: np.dtype) -> float:
    """Largest accepted error, relative to max |reference| (see the module docstring)."""
    eps_out = max(float(ml_dtypes.finfo(out_dtype).eps), float(ml_dtypes.finfo(problem.output_dtype).eps))
    eps_acc = float(np.finfo(compute_dtype(problem.dtype)).eps)
    return eps_out + 8 * eps_acc * math.sqrt(max(reduction_length(problem), 1))


@dataclass(frozen=True)
class OpCheck:
    """Result of checking one op: error relative to max |reference|, and the limit."""

    step: Step
    error: float
    limit: float

    @property
    def ok(self) -> bool:
        return bool(self.error <= self.limit)  # NaN fails

    def describe(self) -> str:
        return (f"{self.step.source.label}: max error {self.error:.3g} (relative to max |reference|) "
                f"{'<=' if self.ok else '>'} limit {self.limit:.3g}")


def check(plan: Plan, engine: Engine | str | None, inputs: dict[int, np.ndarray]) -> list[OpCheck]:
    """Run the plan with ``engine``, then check every op against the reference engine on the same
    inputs (convolutions slab by slab, :mod:`.reference_check`)."""
    values = execute(plan, engine, inputs)
    reference = get_engine("reference")
    checks = []
    for step in plan.steps:
        got, out_dtype = values[step.output.id], DATA_DTYPES[step.output.dtype]
        if isinstance(step.problem, Problem):
            problem, arrays = step.op.prepare(*(values[tid] for tid in step.input_ids))
            error = convolution_error(problem, arrays, got, out_dtype)
        else:
            error = relative_error(got, _run_step(step, values, reference))
        checks.append(OpCheck(step, error, tolerance(step.problem, out_dtype)))
    return checks


@dataclass(frozen=True)
class Timing:
    """One timed run of a plan: its seconds, and those spent in its convolutions."""

    seconds: float
    convolution_seconds: float


def time_plan(plan: Plan, engine: Engine | str | None, inputs: dict[int, np.ndarray], max_ms: float,
              times: int = 0) -> list[Timing]:
    """Timed runs of the whole plan: one warm-up run, then ``times`` runs, or (``times`` = 0)
    at least 3 runs and more while the total stays under ``max_ms``."""
    engine = get_engine(engine)
    execute(plan, engine, inputs)
    runs: list[Timing] = []
    while (len(runs) < times) if times else (len(runs) < 3 or sum(r.seconds for r in runs) * 1e3 < max_ms):
        convolution = [0.0]
        start = time.perf_counter()
        execute(plan, engine, inputs, convolution)
        runs.append(Timing(time.perf_counter() - start, convolution[0]))
    return runs
