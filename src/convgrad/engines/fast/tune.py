"""Plans measured on this machine: time a problem's candidate plans and cache the fastest.

For one problem (:class:`Features`), every plan of :func:`candidates` runs on the same random
inputs: a warm-up call each (JIT compiles happen there), a pause, then :data:`ROUNDS` rounds in
which each plan in turn (the order rotated every round) takes its timed calls (at least
``min_runs`` in all, until ``block_seconds`` have passed in all). **In sequence**: each timed
call comes right after a call of each ``context`` problem (the layers next to it in ``convgrad
tune``'s list; for ``CONVGRAD_AUTOTUNE`` the process's previous problem) with the plan that runs
it, as it will in a training step: a plan whose threads slow its neighbours' (or is slowed by
them: OpenBLAS's spinning next to numba's) is timed so. **Against the default, round by round**:
a plan's score is the median over the rounds of its time over the default plan's in the same
round, so that a slow spell of a shared host, which falls on whichever plan is timed then, does
not choose the plan (timed in blocks one after the other, the Zen 3 stored plans up to 1.9x
slower than the default when timed again). The best-scoring plan is stored in the plan cache
(:mod:`.plan_cache`) unless its score is above ``1 - margin`` (then the default is stored: a
plan is never changed on noise). Used by ``convgrad tune`` and by ``CONVGRAD_AUTOTUNE=1`` (each
new problem tuned at its first call, as ``cudnn.benchmark`` does).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ... import layout
from ...limits import memory_budget
from ...problem import ConvGeometry
from . import plan_cache
from .features import Features
from .plan import Plan, candidates, default_plan, forced_plan, strategy_module

__all__ = ["Timing", "Tuned", "inputs", "measure", "tune", "confirm", "autotuned", "ran"]

#: Relative speed-up a candidate needs over the default plan to be chosen instead of it.
MARGIN = 0.03
#: Rounds of timed calls per plan (each plan in turn within a round).
ROUNDS = 5


@dataclass(frozen=True)
class Timing:
    """One plan's measurement: median and fastest of ``runs`` timed calls, in milliseconds, and
    its score: the median over the rounds of its median time over the first plan's (the
    default's) in the same round."""

    plan: Plan
    median_ms: float
    min_ms: float
    runs: int
    score: float = 1.0


@dataclass(frozen=True)
class Tuned:
    """The outcome of tuning one problem: every plan's timing, the default and the plan chosen."""

    features: Features
    timings: tuple[Timing, ...]
    default: Plan
    chosen: Plan

    def timing(self, plan: Plan) -> Timing:
        return next(t for t in self.timings if t.plan == plan)

    @property
    def speedup(self) -> float:
        """The default plan's time over the chosen plan's, round by round (1.0: the default kept)."""
        return 1 / self.timing(self.chosen).score


def inputs(f: Features, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random canonical inputs of ``f``'s task (x and w, dy and w, or x and dy) in its dtype and
    memory order (NCX data with OIX weights where ``f.channels_first``, else NXC with XIO)."""
    g = f.geometry
    dtype = f.data_dtype
    fmt, wfmt = ("NCX", "OIX") if f.channels_first else ("NXC", "XIO")

    def data(shape: tuple[int, ...]) -> np.ndarray:
        stored = (shape[0], shape[-1], *shape[1:-1]) if f.channels_first else shape
        return layout.data_to_canonical(rng.standard_normal(stored, np.float32).astype(dtype), fmt)

    def weights() -> np.ndarray:
        shape = g.w_shape
        stored = (shape[-1], shape[-2], *shape[:-2]) if f.channels_first else shape
        return layout.weights_to_canonical(rng.standard_normal(stored, np.float32).astype(dtype), wfmt)

    if f.task == "forward":
        return data(g.x_shape), weights()
    if f.task == "backward_data":
        return data(g.y_shape), weights()
    return data(g.x_shape), data(g.y_shape)


def _run(f: Features, g: ConvGeometry, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    from . import FastEngine
    with np.errstate(all="ignore"):
        getattr(FastEngine(), f.task)(g, *arrays)


Context = tuple[tuple[Features, tuple[np.ndarray, np.ndarray]], ...]


def measure(plans: Sequence[Plan], f: Features, arrays: tuple[np.ndarray, np.ndarray], *, min_runs: int = 3,
            block_seconds: float = 0.2, pause: float = 0.05, context: Context = ()) -> tuple[Timing, ...]:
    """Each of ``plans`` on ``f``: one warm-up call each, a pause, then :data:`ROUNDS` rounds in
    which each plan in turn (the order rotated by one every round) takes timed calls (at least
    ``ceil(min_runs / ROUNDS)``, until ``block_seconds / ROUNDS`` have passed), each right after a
    call of every ``context`` problem on its own plan; scores relative to ``plans[0]``."""
    g = f.geometry
    for plan in plans:
        with forced_plan(plan):
            _run(f, g, arrays)
    time.sleep(pause)
    times: list[list[list[float]]] = [[[] for _ in range(ROUNDS)] for _ in plans]
    runs, seconds = max(1, -(-min_runs // ROUNDS)), block_seconds / ROUNDS
    for r in range(ROUNDS):
        for i in [(r + j) % len(plans) for j in range(len(plans))]:
            spent = times[i][r]
            while len(spent) < runs or sum(spent) < seconds:
                for other, other_arrays in context:
                    _run(other, other.geometry, other_arrays)
                with forced_plan(plans[i]):
                    t0 = time.perf_counter()
                    _run(f, g, arrays)
                    spent.append(time.perf_counter() - t0)
    base = [statistics.median(round_times) for round_times in times[0]]
    out = []
    for plan, rounds in zip(plans, times):
        every = [t for round_times in rounds for t in round_times]
        score = statistics.median(statistics.median(t) / b for t, b in zip(rounds, base))
        out.append(Timing(plan, 1e3 * statistics.median(every), 1e3 * min(every), len(every), score))
    return tuple(out)


def tune(f: Features, *, store: bool = True, min_runs: int = 3, block_seconds: float = 0.2, pause: float = 0.05,
         margin: float = MARGIN, seed: int = 0, context: Sequence[Features] = ()) -> Tuned:
    """Time every candidate plan of ``f`` against the default (:func:`measure`, each call after a
    call of every ``context`` problem) and, with ``store`` (and plans not turned off by
    ``CONVGRAD_PLANS=off``), cache the best-scoring one (the default plan unless another's score
    is below ``1 - margin``). Plans whose memory bound exceeds the memory budget are not tried."""
    default = default_plan(f)
    budget = memory_budget()
    plans = list(dict.fromkeys([default, *(p for p in candidates(f)
                                            if strategy_module(p.strategy).workspace_bytes(f, p) <= budget)]))
    tuned = Tuned(f, (Timing(default, math.nan, math.nan, 0),), default, default) if len(plans) == 1 else \
        _choose(f, plans, seed, context, min_runs, block_seconds, pause, margin)
    if store and plan_cache.enabled():
        _store(tuned)
    return tuned


def confirm(tuned: Tuned, *, store: bool = True, min_runs: int = 3, block_seconds: float = 0.2,
            pause: float = 0.05, margin: float = MARGIN, context: Sequence[Features] = ()) -> Tuned:
    """``tuned`` checked once its neighbours have their own plans: a chosen plan other than the
    default is timed against it again (:func:`measure`, each call after a call of every
    ``context`` problem on the plan the cache now gives it) and kept only if it still scores below
    ``1 - margin``, else the default is (and, with ``store``, is cached). ``convgrad tune`` runs
    this over its list once every problem is tuned: a plan chosen beside its neighbours' default
    plans may lose beside their tuned ones (a BLAS plan beside another's spinning threads)."""
    if tuned.chosen == tuned.default:
        return tuned
    checked = _choose(tuned.features, [tuned.default, tuned.chosen], 1, context, min_runs, block_seconds, pause,
                      margin)
    if store and plan_cache.enabled():
        _store(checked)
    return checked


def _choose(f: Features, plans: Sequence[Plan], seed: int, context: Sequence[Features], min_runs: int,
            block_seconds: float, pause: float, margin: float) -> Tuned:
    """``plans`` (the default first) measured on random inputs (``seed``) beside ``context``
    (:func:`measure`); the best-scoring one chosen unless its score is above ``1 - margin``."""
    rng = np.random.default_rng(seed)
    arrays = inputs(f, rng)
    around = tuple((other, inputs(other, rng)) for other in context if other != f)
    timings = measure(plans, f, arrays, min_runs=min_runs, block_seconds=block_seconds, pause=pause, context=around)
    best = min(timings, key=lambda t: t.score)
    return Tuned(f, timings, plans[0], best.plan if best.score < 1 - margin else plans[0])


def _store(tuned: Tuned) -> None:
    """Cache the chosen plan of ``tuned`` with its median time and the default plan's."""
    def ms(t: Timing) -> float | None:
        return None if math.isnan(t.median_ms) else t.median_ms
    plan_cache.store(tuned.features, tuned.chosen, ms(tuned.timing(tuned.chosen)), ms(tuned.timing(tuned.default)))


# -- CONVGRAD_AUTOTUNE ---------------------------------------------------------------------------
_tuning: list[bool] = []
_previous: list[Features] = []


def ran(f: Features) -> None:
    """Note ``f`` as the process's latest problem (the context an autotuned next one is timed in)."""
    _previous[:] = [f]


@contextlib.contextmanager
def _tuning_now() -> Iterator[None]:
    _tuning.append(True)
    try:
        yield
    finally:
        _tuning.pop()


def autotuned(f: Features) -> Plan | None:
    """With ``CONVGRAD_AUTOTUNE=1`` and plans on: the plan :func:`tune` stores for ``f`` (not
    re-entered while tuning); otherwise ``None``."""
    if _tuning or not plan_cache.autotune_enabled() or not plan_cache.enabled():
        return None
    with _tuning_now():
        tuned = tune(f, store=False, context=tuple(_previous))
    try:
        _store(tuned)
    except OSError as exc:  # a read-only or full cache directory: the plan still serves this call
        plan_cache.warn(f"plan cache {plan_cache.cache_file()}: cannot be written ({exc}); plans tuned by "
                        "CONVGRAD_AUTOTUNE are not kept")
    return tuned.chosen
