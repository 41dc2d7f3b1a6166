"""Plans: which strategy runs a problem, with which parameters, and the one function that picks it.

A :class:`Plan` names a strategy (``direct``, ``jit`` or ``gemm``, each a module with
``applies``, ``run`` and ``workspace_bytes``) and its parameters. :func:`select` returns, in
order: a plan forced by :func:`forced_plan` / :func:`forced_strategy` / ``CONVGRAD_STRATEGY``
(where it applies), the plan cached for the problem (:func:`.plan_cache.lookup`, where it still
applies), else :func:`default_plan`, the tuning table's rule:

1. depthwise (ICg = OCg = 1): ``direct`` (its depthwise loops);
2. at most ``TUNING.direct_flops`` of work: ``direct``;
3. ``jit`` (f32-accumulating problems on a family of ``TUNING.jit_families``; pointwise ones on our
   GEMM, :mod:`.blis`), for the gradients from ``TUNING.jit_min_input_channels[task]`` input
   channels (a weights gradient: rows, ``jit.input_rows``, its last kernel axis folded in where
   ``jit.folds``; of fewer than backward data's only where its block idles at most
   ``TUNING.jit_narrow_idle`` for the vectors' width and datapath), a junk-heavy gradient
   (``Features.junk_heavy``) only for the unit-stride data gradient of bf16 on the dot instruction
   (the drivers skip the taps that read rows of padding) and, within ``TUNING.junk_memory`` times
   the inputs and output in temporaries, for the weights gradient of bf16 pairs on it and for f32
   data where PyTorch's threads share the cores (one pool: the output-row GEMMs' BLAS threads
   fought them), and a multi-tap weights gradient only of f32 data or of bf16 pairs on the dot
   instruction (:func:`.jit.weights_in_pairs`) and not of output rows of at most
   ``TUNING.jit_weights_short_rows[family]`` positions: every such problem of bf16 data, of NXC
   data, or of any data where PyTorch's threads share the cores (``Features.shared``: one pool); of
   the others (NCX f32 alone) those of several taps with at most ``TUNING.jit_channels[task]``
   channels per group on either side;
4. at most ``TUNING.direct_gemm_flops`` of work: ``direct``;
5. ``gemm``, its variant by the first that applies: ``pointwise`` (1x1 bf16/f16 NXC),
   ``output_rows`` (junk-heavy or wide gradients), ``image_gemms`` (1x1 NCX with at least
   ``TUNING.image_gemm_rows`` positions per image), else ``frame``.

An empty batch is no plan: the engine returns zeros.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ...environment import env
from ...errors import EngineError
from ...memo import Memo
from ...problem import ConvGeometry
from . import direct, gemm, isa, jit, kernels, plan_cache, pool
from .features import Features
from .tuning import TUNING

__all__ = ["Plan", "STRATEGIES", "candidates", "default_plan", "select", "planned", "warm", "forced_plan", "forced_strategy",
           "strategy_module", "jit_selected", "gemm_variant"]

#: The strategies, in the order :func:`candidates` lists them.
STRATEGIES = ("direct", "jit", "gemm")
_MODULES: dict[str, ModuleType] = {"direct": direct, "jit": jit, "gemm": gemm}

Value = int | str | bool


@dataclass(frozen=True)
class Plan:
    """A strategy and its parameters, as sorted (name, value) pairs (missing ones take the
    strategy's defaults for the problem)."""

    strategy: str
    params: tuple[tuple[str, Value], ...] = ()

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"plan strategy {self.strategy!r}: expected one of {', '.join(STRATEGIES)}")
        names = [p[0] if isinstance(p, tuple) and len(p) == 2 else None for p in self.params]
        if any(not isinstance(n, str) for n in names) or names != sorted(set(names)):
            raise ValueError(f"plan params {self.params!r}: expected sorted (name, value) pairs, names unique")
        for name, value in self.params:
            if not isinstance(value, (int, str)):
                raise ValueError(f"plan param {name}={value!r}: expected an int, a str or a bool")

    @classmethod
    def of(cls, strategy: str, **params: Value) -> Plan:
        return cls(strategy, tuple(sorted(params.items())))

    def param(self, name: str, default: Value | None = None) -> Value | None:
        return dict(self.params).get(name, default)

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "params": dict(self.params)}

    @classmethod
    def from_json(cls, d: dict) -> Plan:
        """The plan of :meth:`to_json`'s dict; ValueError on anything malformed."""
        if not isinstance(d, dict) or set(d) - {"strategy", "params"} or not isinstance(d.get("strategy"), str) \
                or not isinstance(d.get("params", {}), dict):
            raise ValueError(f"not a plan: {d!r}")
        return cls.of(d["strategy"], **d.get("params", {}))

    def __str__(self) -> str:
        return self.strategy + "".join(f" {k}={v}" for k, v in self.params)


def strategy_module(name: str) -> ModuleType:
    """The module of strategy ``name``."""
    return _MODULES[name]


def _complete(f: Features, plan: Plan) -> Plan | None:
    """``plan`` with its missing parameters defaulted for ``f``, or None where it cannot run ``f``."""
    module = _MODULES[plan.strategy]
    if not module.applies(f):
        return None
    params = dict(plan.params)
    if plan.strategy == "gemm":
        params.setdefault("variant", gemm_variant(f))
    full = Plan.of(plan.strategy, **module.complete(f, params))
    return full if module.applies(f, full) else None


def jit_selected(f: Features) -> bool:
    """Whether the rule picks the jit strategy for ``f`` (rule 3 of the module docstring)."""
    if not jit.applies(f) or f.family not in TUNING.jit_families:
        return False
    if f.junk_heavy() and not _junk_on_jit(f):
        return False
    if f.task == "backward_weights" and f.data_dtype != f.acc and not f.pointwise and not TUNING.jit_weights_16_bit \
            and not jit.weights_in_pairs(f):
        return False
    if f.task == "backward_weights" and f.taps > 1 and f.out_size[-1] <= TUNING.jit_weights_short_rows.get(f.family, 0):
        return False
    rows = jit.input_rows(f) if f.task == "backward_weights" else f.icg
    narrow = rows < TUNING.jit_min_input_channels[f.task] or \
        rows < TUNING.jit_min_input_channels["backward_data"] and \
        jit.idle(f) > TUNING.jit_narrow_idle[isa.WIDTH[f.family], isa.halved_vectors()]
    if narrow and not (jit.on_tiles(f) and f.task == "backward_data"):    # tiles: conv1's dx 0.74x the frame's
        return False
    one_pool = f.shared or f.dtype == "bfloat16" or not f.channels_first
    return one_pool or f.taps > 1 and max(f.icg, f.ocg) <= TUNING.jit_channels[f.task]


def _junk_on_jit(f: Features) -> bool:
    """Whether a junk-heavy gradient still runs on ``jit``: the unit-stride bf16 data gradient on
    the dot instruction (the drivers skip the taps that read rows of padding), and where
    ``jit``'s temporaries stay within ``TUNING.junk_memory`` times the inputs and output, the
    bf16 weights gradient in pairs on it (the output-row GEMMs widen each chunk: the dilated
    suite's layers 21-24 2.7-3x slower on a Zen 5) and f32 beside PyTorch (one pool)."""
    if jit.on_dot_product(f) and f.task == "backward_data" and all(s == 1 for s in f.strides):
        return True
    fits = f.task == "backward_weights" and jit.weights_in_pairs(f) or \
        f.shared and f.data_dtype == f.acc == np.float32
    return fits and jit.workspace_bytes(f, Plan.of("jit", **jit.complete(f, {}))) <= TUNING.junk_memory * f.io_bytes


def gemm_variant(f: Features) -> str:
    """The rule's ``gemm`` variant for ``f`` (rule 5): ``pointwise`` for 16-bit NXC pointwise
    layers; ``output_rows`` for junk-heavy gradients (:meth:`.Features.junk_heavy`) and multi-tap
    ones from ``TUNING.wide_channels`` (ICg, OCg) channels per group (backward data also from that
    ICg where the frame would sum narrow results at their shifts); ``image_gemms`` for pointwise
    NCX layers with at least ``TUNING.image_gemm_rows`` positions per image; else ``frame``."""
    if gemm.variant_applies(f, "pointwise") and not f.channels_first:
        return "pointwise"
    if f.task != "forward":
        icg, ocg = TUNING.wide_channels[f.task]
        wide = f.taps > 1 and f.icg >= icg and (
            f.ocg >= ocg or f.task == "backward_data" and kernels.spreads(f.taps, f.ocg, f.icg))
        if f.junk_heavy() or wide:
            return "output_rows"
    if gemm.variant_applies(f, "image_gemms") and f.channels_first \
            and math.prod(f.out_size) >= TUNING.image_gemm_rows:
        return "image_gemms"
    return "frame"


def default_plan(f: Features) -> Plan:
    """The tuning table's rule (the module docstring) for a non-empty problem ``f``."""
    if f.depthwise or f.flops <= TUNING.direct_flops:
        return Plan.of("direct", **direct.complete(f, {}))
    if jit_selected(f):
        return Plan.of("jit", **jit.complete(f, {}))
    if f.flops <= TUNING.direct_gemm_flops:
        return Plan.of("direct", **direct.complete(f, {}))
    return Plan.of("gemm", **gemm.complete(f, {"variant": gemm_variant(f)}))


def candidates(f: Features) -> list[Plan]:
    """The plans worth timing for ``f``, the default first: each strategy that applies with each
    of its parameter sets worth trying (:func:`direct.options`, ...)."""
    plans = [default_plan(f)]
    for name in STRATEGIES:
        module = _MODULES[name]
        if not module.applies(f):
            continue
        for params in module.options(f):
            plan = _complete(f, Plan.of(name, **params))
            if plan is not None and plan not in plans:
                plans.append(plan)
    return plans


_forced: list[Plan | None] = []


@contextlib.contextmanager
def forced_plan(plan: Plan | None) -> Iterator[None]:
    """Within the block, run every problem ``plan`` can run with it (its missing parameters
    defaulted per problem); the others, and all with ``None``, by :func:`select`'s other rules."""
    _forced.append(plan)
    try:
        yield
    finally:
        _forced.pop()


def _named(name: str) -> Plan:
    """The plan a strategy name (or a ``gemm`` variant's name) forces."""
    if name in STRATEGIES:
        return Plan(name)
    if name in gemm.VARIANTS:
        return Plan.of("gemm", variant=name)
    raise EngineError(None, f"CONVGRAD_STRATEGY={name!r} is not a strategy of the fast engine: expected one of "
                      f"{', '.join(STRATEGIES)} or a gemm variant ({', '.join(gemm.VARIANTS)})")


@contextlib.contextmanager
def forced_strategy(name: str | None) -> Iterator[None]:
    """:func:`forced_plan` of strategy ``name`` with its default parameters, or of the ``gemm``
    variant ``name`` (``frame``, ``output_rows``, ``pointwise``, ``image_gemms``); ``None``: the
    rule. ``CONVGRAD_STRATEGY=name`` (read at every call) does the same for a whole process."""
    with forced_plan(_named(name) if name else None):
        yield


def forced() -> Plan | None:
    """The plan forced by :func:`forced_plan` (innermost) or ``CONVGRAD_STRATEGY``."""
    if _forced:
        return _forced[-1]
    name = env("CONVGRAD_STRATEGY")
    return _named(name) if name else None


def select(f: Features, *, tune: bool = False) -> Plan:
    """The plan that runs the non-empty problem ``f``: forced > cached > :func:`default_plan`.
    With ``tune`` (a call about to run, not a memory estimate) and ``CONVGRAD_AUTOTUNE=1``, a
    problem without a cached plan is tuned first (:func:`.plan_cache.lookup`)."""
    for source in (forced, lambda: plan_cache.lookup(f, tune=tune)):
        plan = source()
        complete = _complete(f, plan) if plan is not None else None
        if complete is not None:
            return complete
    return default_plan(f)


_planned: Memo[tuple[object, ...], tuple[Features, Plan, int]] = Memo(TUNING.planned_entries)


class _Call(threading.local):
    """This thread's :class:`one_call` state: the context it read (None outside a call; a class
    default, not ``getattr``'s: a missing thread-local attribute costs an exception, 1.1 µs)."""

    fixed: tuple[object, ...] | None = None


_call = _Call()


def context() -> tuple[object, ...]:
    """Everything :func:`select` reads now besides the problem: whether PyTorch is loaded, the
    kernel family, the thread count, the plan cache's state and ``CONVGRAD_AUTOTUNE``
    (:func:`.plan_cache.state`), all taken once per :func:`one_call`, and the forced plan."""
    fixed = _call.fixed
    return (fixed or _fixed()) + (forced(),)


def _fixed() -> tuple[object, ...]:
    return "torch" in sys.modules, isa.family(), pool.threads(), plan_cache.state()


class one_call:  # noqa: N801 - used as a function: ``with one_call():``
    """One API call (its memory estimate and its run) on this thread: :func:`context` reads the
    process's state (files, environment, threads) once for all of it (nested: the outer one's);
    ``one_call(now)``: the call has read it, :func:`context`'s ``now``."""

    __slots__ = ("outer", "now")

    def __init__(self, now: tuple[object, ...] | None = None) -> None:
        self.now = now

    def __enter__(self) -> None:
        self.outer = _call.fixed is None
        if self.outer:
            _call.fixed = self.now[:-1] if self.now else _fixed()  # context() = fixed + (forced,)

    def __exit__(self, *exc: object) -> None:
        if self.outer:
            _call.fixed = None


def warm(g: ConvGeometry, task: str, dtype: np.dtype, channels_first: bool) -> tuple[Features, Plan, int] | None:
    """:func:`planned`'s entry for a call about to run (``tune``) under the current context, or
    None before the first such call (which selects, and may tune, in the pool)."""
    return _planned.get((g, task, dtype, channels_first, True, context()))


def planned(g: ConvGeometry, task: str, dtype: np.dtype, channels_first: bool, *, tune: bool = False,
            now: tuple[object, ...] | None = None) -> tuple[Features, Plan, int]:
    """``(f, select(f, tune=tune), workspace bytes)`` for the features ``f`` of ``task`` on ``g``,
    memoised for repeated calls under the same :func:`context` (``now``, when the caller has
    it); at most ``TUNING.planned_entries`` entries."""
    key = (g, task, dtype, channels_first, tune, now or context())
    hit = _planned.get(key)
    if hit is None:
        f = Features.of(g, task, dtype, channels_first)
        plan = select(f, tune=tune)
        hit = _planned.put(key, (f, plan, strategy_module(plan.strategy).workspace_bytes(f, plan)))
    return hit
