"""The two benchdnn-style drivers (graph files, conv descriptors) and the loop that runs cases.

A driver knows its options (:class:`~convgrad.batch.Knob`) and how to turn a case into a one- or
multi-op graph; everything after that (planning, random inputs, the check against the reference
engine, timing, reporting) is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .batch import BatchReader, Case, Knob
from .descriptor import parse_descriptor
from .errors import ConvgradError
from .graph import DIRECTIONS, Graph, check, descriptor_graph, load_graph, make_inputs, plan_graph
from .graph import parse_dt, parse_in_shapes, parse_mb, parse_op_attrs, parse_op_kind, rewrite, time_plan
from .graph.rewrite import FLOAT_DTYPES
from .graph.run import OpCheck
from .untrusted import MAX_NAME_CHARS, shell_join, shorten

__all__ = ["Driver", "GRAPH", "CONV", "RunSettings", "Result", "run_case", "new_result", "fail"]


def _choice(option: str, choices: tuple[str, ...], upper: bool = False) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.upper() if upper else text.lower()
        if value not in choices:
            raise ValueError(f"{option}: {text!r}: expected one of {', '.join(choices)}")
        return value
    return parse


@dataclass(frozen=True)
class Driver:
    """One subcommand: its options, what triggers a case, and how a case becomes a graph."""

    name: str
    knobs: dict[str, Knob]
    trigger: str | None
    build: Callable[[Case], tuple[Graph, str]]  # -> (graph, case name)

    def reader(self) -> BatchReader:
        return BatchReader(self.knobs, self.trigger)

    def problem_text(self, case: Case) -> str:
        """benchdnn's %prb%: the options in force and the case, as shell words (a line that could
        not be read: its text, shortened, as one word)."""
        if case.error:
            return shell_join([shorten(case.target)])
        target = f"--{self.trigger}={case.target}" if self.trigger else case.target
        return shell_join([*(f"--{k}={v}" for k, v in case.knobs), target])


def _build_graph(case: Case) -> tuple[Graph, str]:
    graph = load_graph(case.target)
    graph = rewrite(graph, in_shapes=parse_in_shapes(case.knob("in-shapes")) if case.knob("in-shapes") else None,
                    op_attrs=parse_op_attrs(case.knob("op-attrs")) if case.knob("op-attrs") else None,
                    mb=parse_mb(case.knob("mb", "0")), dt=parse_dt(case.knob("dt")) if case.knob("dt") else None,
                    op_kind=parse_op_kind(case.knob("op-kind")) if case.knob("op-kind") else None)
    return graph, Path(case.target).stem


_parse_dir = _choice("--dir", tuple(DIRECTIONS), upper=True)
_parse_conv_dt = _choice("--dt", FLOAT_DTYPES)
_parse_tag = _choice("--tag", ("nxc", "ncx"))


def _build_conv(case: Case) -> tuple[Graph, str]:
    desc = parse_descriptor(case.target)
    mb = parse_mb(case.knob("mb", "0"))
    if mb:
        desc = desc.with_mb(mb)
    graph = descriptor_graph(desc, _parse_dir(case.knob("dir", "FWD_D")), _parse_conv_dt(case.knob("dt", "f32")),
                             _parse_tag(case.knob("tag", "nxc")))  # parsed: --dir=bwd_d, --tag=NCX are fine
    return graph, desc.name or desc.canonical()


_MB = Knob("mb", "Minibatch of every data input (0: as in the case).", parse_mb, "0")

GRAPH = Driver("graph", {
    "dt": Knob("dt", "Data type of every floating-point tensor (f32, bf16, f16), or ID:DT[+ID:DT] per tensor.",
               parse_dt),
    "in-shapes": Knob("in-shapes", "Input shapes and memory order: ID:SHAPE[*TAG][+...], e.g. 0:2x64x56x56*acdb; "
                      "ID:TAG alone changes only the order.", parse_in_shapes),
    "op-attrs": Knob("op-attrs", "Op attributes: OPID:NAME:VALUE[*NAME:VALUE][+OPID:...], lists as 2x2.",
                     parse_op_attrs),
    "op-kind": Knob("op-kind", "Op kinds: OPID:KIND[+OPID:KIND], another element-wise or binary kind of the same "
                    "family, e.g. 1:GELU+2:Multiply (attributes it needs via --op-attrs).", parse_op_kind),
    "mb": _MB,
    "expected-n-partitions": Knob("expected-n-partitions", "oneDNN's partition count check: accepted for benchdnn "
                                  "compatibility and ignored (convgrad does not partition: it runs the ops one by "
                                  "one).", parse_mb, "0"),
}, "case", _build_graph)

CONV = Driver("conv", {
    "dir": Knob("dir", "Direction: FWD_D, FWD_B (with bias), BWD_D or BWD_W.", _parse_dir, "FWD_D"),
    "dt": Knob("dt", "Data type: f32, bf16 or f16.", _parse_conv_dt, "f32"),
    "mb": _MB,
    "tag": Knob("tag", "Layout: nxc (NXC data, XIO weights) or ncx (NCX data, OIX weights).", _parse_tag, "nxc"),
}, None, _build_conv)


@dataclass(frozen=True)
class RunSettings:
    """Options that hold for the whole run (not reset by --reset)."""

    mode: str = "C"
    engine: str = "reference"
    seed: int = 0
    max_ms: float = 1000.0
    times: int = 0


@dataclass
class Result:
    """What happened to one case."""

    index: int
    case: Case
    prb: str
    repro: str
    engine: str = ""
    name: str = ""
    kinds: str = ""
    flops: int = 0
    reason: str = ""
    checks: list[OpCheck] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds per run of the whole graph
    convolution_times: list[float] = field(default_factory=list)  # of which in its convolutions

    @property
    def ok(self) -> bool:
        return not self.reason

    @property
    def max_error(self) -> float | None:
        """The check's largest error relative to its limit (1 = at the limit)."""
        return max((c.error / c.limit for c in self.checks), default=None)


def repro_line(driver: Driver, settings: RunSettings, case: Case, seed: int) -> str:
    """A command line that reruns exactly this case; every word is quoted (:func:`shell_join`)."""
    words = ["convgrad", driver.name, f"--mode={settings.mode}", f"--engine={settings.engine}", f"--seed={seed}"]
    return shell_join(words) + " " + driver.problem_text(case)


def case_seed(settings: RunSettings, index: int) -> int:
    """The seed of case ``index``'s random inputs."""
    return (settings.seed + index) % 2**32


def new_result(driver: Driver, settings: RunSettings, case: Case, index: int) -> Result:
    """The result of case ``index`` before it runs: its problem text and repro line."""
    repro = repro_line(driver, settings, case, case_seed(settings, index))
    return Result(index, case, driver.problem_text(case), repro, settings.engine)


def fail(result: Result, reason: str) -> Result:
    """``result`` failed for ``reason``, which is made to name the case's file or descriptor and
    the batch line it came from."""
    case = result.case
    name = shorten(case.target, MAX_NAME_CHARS)
    if not case.error and name not in reason:
        reason = f"{name}: {reason}"  # name the case file or descriptor
    if case.origin != "command line" and not reason.startswith(case.origin):
        reason = f"{case.origin}: {reason}"
    result.reason = reason
    return result


def run_case(driver: Driver, settings: RunSettings, case: Case, index: int) -> Result:
    """Build, plan and run one case (checked or timed); every error becomes the case's reason."""
    seed = case_seed(settings, index)
    result = new_result(driver, settings, case, index)
    if case.error:
        result.reason = case.error
        return result
    try:
        graph, result.name = driver.build(case)
        plan = plan_graph(graph)
        result.kinds = "+".join(step.source.kind for step in plan.steps)
        result.flops = plan.flops
        inputs = make_inputs(plan, np.random.default_rng(seed))
        if settings.mode == "P":
            timings = time_plan(plan, settings.engine, inputs, settings.max_ms, settings.times)
            result.times = [t.seconds for t in timings]
            result.convolution_times = [t.convolution_seconds for t in timings]
        else:
            result.checks = check(plan, settings.engine, inputs)
            result.reason = "; ".join(c.describe() for c in result.checks if not c.ok)
    except (ConvgradError, ValueError) as exc:  # GraphError, DescriptorError: bad files and lines
        result.reason = str(exc)
    except MemoryError:
        result.reason = "out of memory"
    except Exception as exc:  # a bug must not stop the rest of the batch
        result.reason = f"internal error: {type(exc).__name__}: {exc}"
    return fail(result, result.reason) if result.reason else result
