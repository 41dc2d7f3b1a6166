"""Running a resolved problem: canonical views in, one engine call, bias, one rounding, the user's
layout out. What :class:`convgrad.Op` and :mod:`convgrad.dask.arrays` (per block) both run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtypes import round_to
from .engines import Engine, get_engine
from .layout import channels_first, data_from_canonical, data_to_canonical, weights_in_format, weights_to_canonical
from .limits import check_memory, memory_budget
from .memo import Memo
from .problem import ConvGeometry, Problem
from .tensor_ops import TensorProblem, run_tensor_problem

__all__ = ["TASK_INPUTS", "Warm", "compiled_entry", "execute", "execute_canonical", "round_result", "finish"]

#: Entries of each of a :class:`Warm`'s memos (engines and engine states).
WARM_ENTRIES = 64
#: The engine's two inputs of each task, by role.
TASK_INPUTS = {"forward": ("x", "w"), "backward_data": ("y", "w"), "backward_weights": ("x", "y")}


@dataclass(frozen=True)
class Warm:
    """What repeated calls of one problem on inputs of one signature (shapes, dtypes, strides:
    :meth:`convgrad.Op.resolve`) keep, per engine and engine state (``engine.state()``): the
    memory estimates (:func:`~convgrad.limits.check_memory`) and the bound runs (:func:`execute`)."""

    estimates: Memo[tuple[Any, ...], tuple[int, int]] = field(default_factory=lambda: Memo(WARM_ENTRIES))
    runs: Memo[tuple[Any, ...], Callable[[dict[str, np.ndarray]], np.ndarray]] = \
        field(default_factory=lambda: Memo(WARM_ENTRIES))


def _canonical_inputs(problem: Problem) -> bool:
    """Whether ``problem``'s inputs (and result) are the engine's canonical arrays as given:
    channels-last data, X-first weights."""
    return problem.data_format == "NXC" and problem.weights_format[0] == "X"


def compiled_entry(problem: Problem, name: str) -> tuple[Engine, Any] | None:
    """(the default engine, its compiled entry ``name`` for ``problem``: ``at_params``, the
    parameters of a run on addresses; ``bind_at``, that run) where the problem's inputs and
    result are the engine's canonical arrays as given (channels-last data, X-first weights, no
    bias; two inputs) and the engine has such an entry for it; else None."""
    if not _canonical_inputs(problem) or problem.has_bias:
        return None
    engine = get_engine(None)
    entry = getattr(engine, name, None)
    value = entry(problem.geometry, problem.task, problem.dtype) if entry is not None else None
    return None if value is None else (engine, value)


def execute(problem: Problem | TensorProblem, arrays: dict[str, np.ndarray], engine: Engine,
            warm: Warm | None = None) -> np.ndarray:
    """Run a resolved problem: canonical views in, one engine call, bias, one rounding, user layout out
    (the other ops: :func:`~convgrad.tensor_ops.run_tensor_problem`). The memory guard runs first
    (``warm``: what calls of this signature keep: its estimates, and the run an engine with a
    ``bind`` bound for it, which a repeated call takes directly); NaN and Inf propagate as IEEE
    arithmetic does, without warnings."""
    if isinstance(problem, TensorProblem):
        return run_tensor_problem(problem, [arrays[s.name] for s in problem.definition.inputs], engine)
    if warm is None or not hasattr(engine, "bind"):
        return _unbound(problem, arrays, engine, warm)
    state = engine.state()  # an engine that binds has a state and a scope taking it (read once a call)
    run = warm.runs.get((engine, state))
    if run is not None:
        return run(arrays)
    with engine.scope(state):
        run = _bind(problem, arrays, engine, warm, (engine, state))
        return run(arrays) if run is not None else _unbound(problem, arrays, engine, warm)


def _unbound(problem: Problem, arrays: dict[str, np.ndarray], engine: Engine, warm: Warm | None) -> np.ndarray:
    bias = arrays.get("bias")
    return finish(problem, execute_canonical(problem, arrays, engine, rounded=bias is None,
                                             estimates=warm.estimates if warm is not None else None), bias, engine)


def _bind(problem: Problem, arrays: dict[str, np.ndarray], engine: Any, warm: Warm,
          key: tuple[Any, ...]) -> Callable[[dict[str, np.ndarray]], np.ndarray] | None:
    """:func:`execute` of ``problem`` on arrays like ``arrays`` as one function, where the engine
    binds its call (``engine.bind``: a repeated call it runs without its per-call layers; None
    else): the memory guard reduced to the budget's test (the estimate is the signature's), the
    canonical views, the bound call, bias and rounding, the user's layout. Kept in ``warm.runs``
    under ``key`` (the engine and its state now)."""
    first, second = TASK_INPUTS[problem.task]
    fmt, wfmt = problem.data_format, problem.weights_format
    views = not _canonical_inputs(problem)

    def canonical(role: str, array: np.ndarray) -> np.ndarray:
        return weights_to_canonical(array, wfmt) if role == "w" else data_to_canonical(array, fmt)

    a = canonical(first, arrays[first])
    rounded = "bias" not in arrays and getattr(engine, "rounds", False)
    loops = engine.bind(problem.geometry, problem.task, a.dtype, channels_first(a), problem.dtype if rounded else None)
    if loops is None:
        return None
    check_memory(problem, engine, warm.estimates)
    known = warm.estimates.get(key)
    if known is None:  # the engine's state changed meanwhile
        return None
    needed = sum(known)
    dtype, as_given = problem.dtype, not views and "bias" not in arrays  # finish: nothing to do on a result of dtype

    def run(arrays: dict[str, np.ndarray]) -> np.ndarray:
        if needed > memory_budget():
            check_memory(problem, engine, warm.estimates)  # the budget's error, naming the sizes
        a, b = arrays[first], arrays[second]
        if views:
            a, b = canonical(first, a), canonical(second, b)
        result = loops(a, b)
        if as_given and result.dtype == dtype and result.flags.c_contiguous:
            return result
        return finish(problem, result, arrays.get("bias"), engine)
    return warm.runs.put(key, run)


def execute_canonical(problem: Problem, arrays: dict[str, np.ndarray], engine: Engine,
                      rounded: bool = False, estimates: Memo | None = None) -> np.ndarray:
    """The engine's canonical result (data ``(N, *X, C)``, weights ``(*K, ICg, OC)``) in its
    accumulation dtype (f32, f64 for f64 data), before bias, rounding and layout: partial results
    that are summed later (batch or space chunks) are summed in this form and rounded once by
    :func:`finish`. With ``rounded`` (nothing is added before rounding) an engine that rounds
    (``engine.rounds``) may return it already rounded to the problem's dtype. The memory guard
    runs first; the engine runs under ``np.errstate(all="ignore")`` unless it says it is
    ``quiet`` (it sets that itself around its NumPy arithmetic)."""
    with getattr(engine, "scope", contextlib.nullcontext)():  # an engine's per-call state, read once
        check_memory(problem, engine, estimates)
        g, fmt, wfmt = problem.geometry, problem.data_format, problem.weights_format
        canonical = {role: (weights_to_canonical(a, wfmt) if role == "w" else data_to_canonical(a, fmt))
                     for role, a in arrays.items() if role != "bias"}
        rounds = {"out_dtype": problem.dtype} if rounded and getattr(engine, "rounds", False) else {}
        if getattr(engine, "quiet", False):
            return _engine_call(engine, problem.task, g, canonical, rounds)
        with np.errstate(all="ignore"):  # IEEE arithmetic: NaN and Inf propagate, overflow gives Inf
            return _engine_call(engine, problem.task, g, canonical, rounds)


def _engine_call(engine: Engine, task: str, g: ConvGeometry, canonical: dict[str, np.ndarray],
                 rounds: dict[str, np.dtype]) -> np.ndarray:
    if task == "forward":
        return engine.forward(g, canonical["x"], canonical["w"], **rounds)
    if task == "backward_data":
        return engine.backward_data(g, canonical["y"], canonical["w"], **rounds)
    return engine.backward_weights(g, canonical["x"], canonical["y"], **rounds)


def round_result(problem: Problem, result: np.ndarray, bias: np.ndarray | None = None,
                 out_dtype: np.dtype | None = None) -> np.ndarray:
    """A canonical result plus bias, rounded once to the problem's dtype (then to ``out_dtype``
    where given)."""
    if bias is None and result.dtype == problem.dtype and out_dtype in (None, result.dtype):
        return result  # nothing to add or round (and no errstate to pay for)
    with np.errstate(all="ignore"):
        if bias is not None:
            result = result + bias.astype(result.dtype)
        result = round_to(result, problem.dtype)
        return result if out_dtype is None else result.astype(out_dtype, copy=False)


def finish(problem: Problem, result: np.ndarray, bias: np.ndarray | None = None,
           engine: Engine | None = None) -> np.ndarray:
    """A canonical result of :func:`execute_canonical` as the op's output: plus bias, rounded once
    to the output dtype, in the user's layout (a fresh C-contiguous array; a weights result by
    the engine's ``weights_in_format`` where it has one)."""
    result = round_result(problem, result, bias)
    if problem.definition.output.role == "w":
        return getattr(engine, "weights_in_format", weights_in_format)(result, problem.weights_format)
    return np.ascontiguousarray(data_from_canonical(result, problem.data_format))
