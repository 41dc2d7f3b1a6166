"""The two benchdnn-style drivers (graph files, conv descriptors) and the loop that runs cases.

A driver knows its options (:class:`~convgrad.batch.Knob`) and how to turn a case into a one- or
multi-op graph; everything after that (planning, random inputs, the check against the reference
engine, timing, reporting) is shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .batch import BatchReader, Case, Knob
from .descriptor import ConvDescriptor, parse_descriptor
from .errors import ConvgradError
from .graph import DIRECTIONS, Graph, check, descriptor_graph, load_graph, make_inputs, plan_graph
from .graph import parse_dt, parse_in_shapes, parse_mb, parse_op_attrs, parse_op_kind, rewrite, time_plan
from .graph.conv import ConvSetup
from .graph.post_ops import parse_post_ops
from .graph.rewrite import FLOAT_DTYPES, parse_fpmath, parse_tensor_property
from .graph.tags import parse_tag, tag_note
from .graph.run import OpCheck
from .untrusted import MAX_NAME_CHARS, shell_join, shorten

__all__ = ["Driver", "GRAPH", "CONV", "RunSettings", "Result", "CaseSkipped", "run_case", "new_result", "fail"]


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
    build: Callable[[Case], tuple[Graph, str]]  # -> (graph, case name); CaseSkipped: not run by design
    notes: Callable[[Case], tuple[str, ...]] = lambda case: ()  # what the run tells about the case's options
    selected: Callable[[Case], bool] = lambda case: True  # whether the case runs (and counts) at all

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
                    op_kind=parse_op_kind(case.knob("op-kind")) if case.knob("op-kind") else None,
                    tensor_property=parse_tensor_property(case.knob("tensor-property"))
                    if case.knob("tensor-property") else None)
    return graph, Path(case.target).stem


_parse_dir = _choice("--dir", tuple(DIRECTIONS), upper=True)
_parse_tag = _choice("--tag", ("nxc", "ncx"))
_parse_alg = _choice("--alg", ("direct", "wino", "auto"))
#: Integer types of benchdnn's conv driver: quantization, which convgrad skips.
_INTEGER_DTYPES = ("u8", "s8", "s32", "s4", "u4")


class CaseSkipped(Exception):
    """A case convgrad does not run by design (integer quantization): why, and the case's name."""

    def __init__(self, reason: str, name: str = "") -> None:
        super().__init__(reason)
        self.name = name


def _parse_conv_dt(text: str) -> tuple[str, str, str]:
    """``--dt``: one type for src, weights and dst, or SRC:WEI:DST."""
    parts = text.lower().split(":")
    if len(parts) not in (1, 3) or any(p not in FLOAT_DTYPES + _INTEGER_DTYPES for p in parts):
        raise ValueError(f"--dt: {text!r}: expected DT or SRC:WEI:DST with each one of "
                         f"{', '.join(FLOAT_DTYPES + _INTEGER_DTYPES)}")
    return (parts[0],) * 3 if len(parts) == 1 else (parts[0], parts[1], parts[2])


def _parse_bias_dt(text: str) -> str:
    value = text.lower()
    if value not in ("undef", *FLOAT_DTYPES, *_INTEGER_DTYPES):
        raise ValueError(f"--bia-dt: {text!r}: expected undef (f32 with FWD_B and BWD_WB) or one of "
                         f"{', '.join(FLOAT_DTYPES + _INTEGER_DTYPES)}")
    return value


def _parse_conv_tag(option: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return parse_tag(text)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    return parse


def _parse_match(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"--match: {text!r}: not a regular expression ({exc})") from None


def _parse_quantization(option: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text and not re.fullmatch(r"[A-Za-z0-9_]+:[^+]+(\+[A-Za-z0-9_]+:[^+]+)*", text):
            raise ValueError(f"{option}: {text!r}: expected ARG:MASK[:VALUE[:DT]][+...]")
        return text
    return parse


def _quantization(case: Case, dts: dict[str, str]) -> str:
    """Why ``case``, with the data types ``dts`` (option -> type), is integer quantization, or ""."""
    integer = next((f"integer data type {dt} (--{option}={case.knob(option)})" for option, dt in dts.items()
                    if dt in _INTEGER_DTYPES), "")
    options = [f"--{option}={case.knob(option)}" for option in ("attr-scales", "attr-zero-points") if case.knob(option)]
    return integer or (options[0] if options else "")


def _conv_setup(case: Case) -> tuple[ConvDescriptor, ConvSetup]:
    """The case's descriptor and setup; CaseSkipped for integer quantization (checked before the
    post-ops are read, so that an integer line is skipped whatever its post-ops)."""
    desc = parse_descriptor(case.target)
    mb = parse_mb(case.knob("mb", "0"))
    if mb:
        desc = desc.with_mb(mb)
    dts = _parse_conv_dt(case.knob("dt", "f32"))
    direction = _parse_dir(case.knob("dir", "FWD_B"))
    bias_dt = _parse_bias_dt(case.knob("bia-dt", "undef"))
    name = desc.name or desc.canonical()
    skip = _quantization(case, {"dt": next((dt for dt in dts if dt in _INTEGER_DTYPES), dts[0]),
                                **({"bia-dt": bias_dt} if direction in ("FWD_B", "BWD_WB") else {})})
    if skip:
        raise CaseSkipped(f"integer quantization is not convgrad's job: {skip}", name)
    post_ops = parse_post_ops(case.knob("attr-post-ops"))
    quantized = next((p for p in post_ops if p.quantization), None)
    if quantized:
        raise CaseSkipped(f"integer quantization is not convgrad's job: post-op {quantized.text!r}: "
                          f"{quantized.quantization}", name)
    if post_ops and not direction.startswith("FWD"):
        raise ValueError(f"--attr-post-ops={case.knob('attr-post-ops')}: post-ops apply to the forward "
                         f"directions (FWD_B, FWD_D, FWD_I), not {direction}")
    tags = {k: _parse_conv_tag(f"--{k}")(case.knob(k, "any")) for k in ("stag", "wtag", "dtag")}
    setup = ConvSetup(direction, *dts, "f32" if bias_dt == "undef" else bias_dt, _parse_tag(case.knob("tag", "nxc")),
                      post_ops=post_ops, **tags)
    return desc, setup


def _build_conv(case: Case) -> tuple[Graph, str]:
    desc, setup = _conv_setup(case)
    return descriptor_graph(desc, setup), desc.name or desc.canonical()


def _conv_notes(case: Case) -> tuple[str, ...]:
    """What the run should tell about options convgrad accepts but computes no differently."""
    notes = []
    alg = case.knob("alg", "direct").lower()
    if alg != "direct":
        notes.append(f"--alg={alg}: convgrad computes the same convolution for every algorithm (direct, wino, "
                     "auto): the values are the convolution's, whatever oneDNN would dispatch")
    for option in ("impl", "skip-impl"):
        if case.knob(option):
            notes.append(f"--{option}={case.knob(option)}: names oneDNN implementations; convgrad has its own "
                         "engines (--engine) and ignores it")
    for option in ("stag", "wtag", "dtag"):
        note = tag_note(case.knob(option, "any"))
        if note:
            notes.append(f"--{option}: {note}")
    return tuple(notes)


def _conv_selected(case: Case) -> bool:
    """--match: the case runs when the regular expression is found in its problem text (options and
    the descriptor in canonical form, as benchdnn's), or in the descriptor as written."""
    pattern = case.knob("match")
    if not pattern or case.error:
        return True
    try:
        canonical = parse_descriptor(case.target).canonical()
    except ValueError:
        return True  # runs, and fails naming the descriptor
    options = [f"--{k}={v}" for k, v in case.knobs if k != "match"]
    return any(_parse_match(pattern).search(text) for text in (" ".join([*options, canonical]), case.target))


_MB = Knob("mb", "Minibatch of every data input (0: as in the case).", parse_mb, "0")

GRAPH = Driver("graph", {
    "dt": Knob("dt", "Data type of every floating-point tensor (f32, bf16, f16; undef: as in the file), or "
               "ID:DT[+ID:DT] per tensor.", parse_dt),
    "in-shapes": Knob("in-shapes", "Input shapes and memory order: ID:SHAPE[*TAG][+...], e.g. 0:2x64x56x56*acdb; "
                      "ID:TAG alone changes only the order.", parse_in_shapes),
    "op-attrs": Knob("op-attrs", "Op attributes: OPID:NAME:VALUE[*NAME:VALUE][+OPID:...], lists as 2x2.",
                     parse_op_attrs),
    "op-kind": Knob("op-kind", "Op kinds: OPID:KIND[+OPID:KIND], another element-wise or binary kind of the same "
                    "family, e.g. 1:GELU+2:Multiply (attributes it needs via --op-attrs); KIND undef removes the op "
                    "(its consumers read its src, src_0 or diff_dst).", parse_op_kind),
    "tensor-property": Knob("tensor-property", "Tensor property types: ID:PROPERTY[+...] (undef, variable, "
                            "constant, host_scalar); recorded, they change nothing convgrad computes.",
                            parse_tensor_property),
    "attr-fpmath": Knob("attr-fpmath", "oneDNN's fpmath modes: MODE[:true|false][,MODE...] (strict, bf16, f16, "
                        "tf32, any). convgrad computes every mode as strict (f32 accumulation), which each allows, "
                        "so the case runs once for all of them.", parse_fpmath),
    "mb": _MB,
    "expected-n-partitions": Knob("expected-n-partitions", "oneDNN's partition count check: accepted for benchdnn "
                                  "compatibility and ignored (convgrad does not partition: it runs the ops one by "
                                  "one).", parse_mb, "0"),
}, "case", _build_graph)

_LIST = " Takes a comma-separated list (every combination runs)."
CONV = Driver("conv", {
    "dir": Knob("dir", "Direction: FWD_B (forward with bias), FWD_D (without), FWD_I (inference: the same "
                "math as FWD_D), BWD_D (data gradient), BWD_W (weights gradient), BWD_WB (weights and bias "
                "gradients; diff_bias = diff_dst summed over all but the channel axis)." + _LIST,
                _parse_dir, "FWD_B", True),
    "dt": Knob("dt", "Data types: DT for every tensor, or SRC:WEI:DST (e.g. bf16:bf16:f32; BWD_D: diff_src:"
               "weights:diff_dst) of f32, bf16, f16. Mixed types accumulate in f32 and round once to each "
               "output's type. Integer types (u8, s8, s32) are quantization: SKIPPED." + _LIST,
               _parse_conv_dt, "f32", True),
    "bia-dt": Knob("bia-dt", "Bias (diff_bias) type with FWD_B and BWD_WB: undef means f32." + _LIST,
                   _parse_bias_dt, "undef", True),
    "mb": Knob("mb", "Minibatch (0: as in the descriptor)." + _LIST, parse_mb, "0", True),
    "tag": Knob("tag", "Layout of the ops: nxc (NXC data, XIO weights) or ncx (NCX data, OIX weights)." + _LIST,
                _parse_tag, "nxc", True),
    "stag": Knob("stag", "Memory order of src (diff_src): any (the ops' layout), a plain tag over n, c and the "
                 "spatial dims (abx, axb, acdb, nhwc...) or a blocked tag (aBx16b, computed in its plain order)."
                 + _LIST, _parse_conv_tag("--stag"), "any", True),
    "wtag": Knob("wtag", "Memory order of the weights: any, or a tag over (g,) o, i and the spatial dims (abx, "
                 "xba, goiw, hwio...); grouped weights need g just outside o." + _LIST,
                 _parse_conv_tag("--wtag"), "any", True),
    "dtag": Knob("dtag", "Memory order of dst (diff_dst), as --stag." + _LIST, _parse_conv_tag("--dtag"), "any",
                 True),
    "alg": Knob("alg", "direct, wino or auto: oneDNN's algorithm choice; convgrad computes the same "
                "convolution for each (the run says so)." + _LIST, _parse_alg, "direct", True),
    "attr-post-ops": Knob("attr-post-ops", "Forward post-ops, '+' between entries: sum[:SCALE], an eltwise "
                          "(relu[:ALPHA], logistic, tanh, elu:ALPHA, gelu_erf, gelu_tanh, clip:LO:HI, sqrt, log, "
                          "exp, abs, square, mish, round, hardsigmoid:A:B, hardswish, soft_relu, pow:1:P), a "
                          "binary (add, sub, mul, div, max, min):DT[:common|per_oc|per_tensor|MASK[:TAG]], "
                          "prelu[:MASK], dw:kKsSpP[:DT] (a depthwise convolution after a 1x1); applied after the "
                          "convolution as the graph ops of the same names. linear, swish and comparisons are "
                          "refused." + _LIST, parse_post_ops, "", True),
    "attr-scales": Knob("attr-scales", "Quantization scales (ARG:MASK[:SCALE]): SKIPPED, integer quantization is "
                        "not convgrad's job." + _LIST, _parse_quantization("--attr-scales"), "", True),
    "attr-zero-points": Knob("attr-zero-points", "Quantization zero points: SKIPPED, as --attr-scales." + _LIST,
                             _parse_quantization("--attr-zero-points"), "", True),
    "match": Knob("match", "Run only the problems in which this regular expression is found (options and "
                  "descriptor); the others are not run and not counted.", _parse_match),
    "impl": Knob("impl", "oneDNN implementation names to use: accepted and ignored (convgrad has its own "
                 "engines, see --engine); the run notes it.", str),
    "skip-impl": Knob("skip-impl", "oneDNN implementation names to skip: accepted and ignored, as --impl.", str),
}, None, _build_conv, _conv_notes, _conv_selected)


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
    skipped: str = ""  # why the case was not run by design (then it neither passed nor failed)
    notes: tuple[str, ...] = ()
    checks: list[OpCheck] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds per run of the whole graph
    convolution_times: list[float] = field(default_factory=list)  # of which in its convolutions

    @property
    def ok(self) -> bool:
        """Passed or skipped: nothing failed."""
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
        result.notes = driver.notes(case)
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
    except CaseSkipped as exc:
        result.skipped, result.name = str(exc), exc.name
    except (ConvgradError, ValueError) as exc:  # GraphError, DescriptorError: bad files and lines
        result.reason = str(exc)
    except MemoryError:
        result.reason = "out of memory"
    except Exception as exc:  # a bug must not stop the rest of the batch
        result.reason = f"internal error: {type(exc).__name__}: {exc}"
    return fail(result, result.reason) if result.reason else result
