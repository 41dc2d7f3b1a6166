"""``convgrad tune``: measure the fast engine's candidate plans for benchdnn descriptors on this
machine and keep the fastest in the plan cache; ``--show`` lists the cache, ``--clear`` empties
this machine's part of it (see :mod:`convgrad.engines.fast.plan_cache` and ``.tune``)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .batch import read_text
from .descriptor import ConvDescriptor, DescriptorError, parse_descriptor, parse_descriptor_file
from .dtypes import DATA_DTYPES, dtype_name
from .problem import ConvGeometry
from .untrusted import MAX_NAME_CHARS, printable, shorten

__all__ = ["DIRECTIONS", "Problem", "collect", "run", "show", "clear", "describe_plan"]

#: benchdnn directions and the canonical problem each one times (FWD_B's bias is not the engine's).
DIRECTIONS = {"FWD_D": "forward", "FWD_B": "forward", "FWD_I": "forward", "BWD_D": "backward_data",
              "BWD_W": "backward_weights", "BWD_WB": "backward_weights"}
TAGS = {"nxc": False, "ncx": True}


@dataclass(frozen=True)
class Problem:
    """One problem to tune: where it came from, its geometry and how it runs."""

    origin: str
    desc: ConvDescriptor
    direction: str
    dt: str
    tag: str


def _list(option: str, text: str, allowed: tuple[str, ...], upper: bool = False) -> list[str]:
    values = [v.strip().upper() if upper else v.strip().lower() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise click.BadParameter(f"{text!r}: expected a comma-separated list of {', '.join(allowed)}",
                                 param_hint=option)
    return list(dict.fromkeys(values))


def collect(shapes: tuple[str, ...], descriptors: tuple[str, ...], directions: list[str], dts: list[str],
            tags: list[str], mb: int) -> tuple[list[Problem], list[str]]:
    """Every (descriptor, direction, dt, tag) to tune, and the errors of unreadable lines/files."""
    found: list[tuple[str, ConvDescriptor]] = []
    errors: list[str] = []
    for text in descriptors:
        try:
            found.append(("command line", parse_descriptor(text)))
        except DescriptorError as exc:
            errors.append(f"command line: {exc}")
    for name in shapes:
        try:
            lines = read_text(Path(name)).removeprefix("\ufeff").splitlines()
        except (OSError, ValueError) as exc:
            why = exc.strerror or exc if isinstance(exc, OSError) else exc
            errors.append(f"{name}: cannot be read ({why})")
            continue
        for number, item in parse_descriptor_file(lines):
            if isinstance(item, DescriptorError):
                text = lines[number - 1].strip()
                hint = " (tune reads descriptor lines; give options on its command line)" if text.startswith("-") else ""
                errors.append(f"{name}:{number}: {item}{hint}")
            else:
                found.append((f"{name}:{number}", item))
    problems = [Problem(origin, desc.with_mb(mb) if mb else desc, d, dt, tag)
                for origin, desc in found for d in directions for dt in dts for tag in tags]
    # a problem listed twice (benchdnn lists repeat layers: "*3") is tuned once
    unique = {(*(getattr(p.desc, f.name) for f in fields(ConvGeometry)), DIRECTIONS[p.direction], p.dt, p.tag): p
              for p in problems}
    return list(unique.values()), errors


def describe_plan(plan) -> str:
    """``strategy`` or ``strategy(name=value, ...)``."""
    params = plan.to_json().get("params") or {}
    return plan.strategy + (f"({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})" if params else "")


_TASK_DIRS = {"forward": "FWD_D", "backward_data": "BWD_D", "backward_weights": "BWD_W"}


def describe_key(key: str) -> str:
    """A cached problem's key (:meth:`Features.key`) in a short benchdnn-like form, e.g.
    ``BWD_D f32 nxc g1mb16ic64ih56iw56oc64oh56ow56kh3kw3sh1sw1ph1pw1`` (the key itself where it
    is not one)."""
    try:
        v = dict(part.split("=", 1) for part in key.split(";"))
        axes = "dhw"[3 - len(v["kernel"].split("x")):]
        def per_axis(prefix: str, text: str, minus: int = 0) -> str:
            return "".join(f"{prefix}{a}{int(x) - minus}" for a, x in zip(axes, text.split("x")))
        groups = int(v["groups"])
        return (f"{_TASK_DIRS[v['task']]} {dtype_name(v['dtype'])} {'ncx' if v['channels_first'] == 'true' else 'nxc'} "
                f"g{groups}mb{v['n']}ic{groups * int(v['icg'])}{per_axis('i', v['in_size'])}oc{groups * int(v['ocg'])}"
                f"{per_axis('o', v['out_size'])}{per_axis('k', v['kernel'])}{per_axis('s', v['strides'])}"
                f"{per_axis('p', v['pads_begin'])}{per_axis('d', v['dilations'], 1)}")
    except (KeyError, ValueError, TypeError):
        return key


def _features(p: Problem):
    from .engines.fast import Features
    return Features.of(p.desc, DIRECTIONS[p.direction], DATA_DTYPES[p.dt], TAGS[p.tag])


def run(problems: list[Problem], errors: list[str], block_ms: float, console: Console) -> int:
    """Tune every problem (the layers beside it in the list as its context), print a line per
    problem as it finishes; then check each changed plan beside its neighbours' own plans
    (:func:`~convgrad.engines.fast.tune.confirm`: kept or reverted, a line each); a table; the
    exit code."""
    from .engines.fast import plan_cache, tune

    for error in errors:
        click.echo(f"FAILED ({printable(shorten(error, 2000))})")
    table = Table(title="convgrad tune: plans measured on this machine")
    for column, justify in (("name", "left"), ("dir", "left"), ("dt", "left"), ("tag", "left"),
                            ("plans", "right"), ("default", "left"), ("ms", "right"), ("chosen", "left"),
                            ("ms", "right"), ("speed-up", "right")):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    start = time.perf_counter()
    failed = len(errors)
    done: dict[int, Any] = {}  # index -> Tuned
    tried: dict[int, int] = {}
    ms = (lambda t: "-" if math.isnan(t.median_ms) else f"{t.median_ms:.3f}")

    def around(index: int) -> list[Any]:
        return [_features(problems[j]) for j in (index - 1, index + 1) if 0 <= j < len(problems)]

    names = [printable(shorten(p.desc.name or p.desc.canonical(), MAX_NAME_CHARS)) for p in problems]
    for index, p in enumerate(problems):
        name = names[index]
        try:
            tuned = done[index] = tune.tune(_features(p), block_seconds=block_ms / 1e3, context=around(index))
            tried[index] = len(tuned.timings)
        except Exception as exc:  # one problem's failure must not stop the others
            failed += 1
            click.echo(f"{index}:FAILED ({printable(p.origin)}: {name} {p.direction} {p.dt} {p.tag}: "
                       f"{type(exc).__name__}: {printable(shorten(str(exc), 2000))})")
            continue
        d, c = tuned.timing(tuned.default), tuned.timing(tuned.chosen)
        click.echo(f"{index}:TUNED {name} --dir={p.direction} --dt={p.dt} --tag={p.tag}: {describe_plan(tuned.chosen)}"
                   f" {ms(c)} ms (default {describe_plan(tuned.default)} {ms(d)} ms, {len(tuned.timings)} plans)")
    for index, tuned in done.items():  # each changed plan again, beside its neighbours' own plans
        if tuned.chosen != tuned.default:
            checked = done[index] = tune.confirm(tuned, block_seconds=block_ms / 1e3, context=around(index))
            verdict = "KEPT" if checked.chosen == tuned.chosen else "REVERTED"
            click.echo(f"{index}:{verdict} {describe_plan(tuned.chosen)} beside its neighbours' plans: "
                       f"{checked.timing(tuned.chosen).score:.2f}x the default's time")
    for index, tuned in done.items():
        p = problems[index]
        d, c = tuned.timing(tuned.default), tuned.timing(tuned.chosen)
        table.add_row(escape(names[index]), p.direction,
                      p.dt, p.tag, str(tried[index]), describe_plan(tuned.default), ms(d),
                      describe_plan(tuned.chosen), ms(c), "-" if math.isnan(d.median_ms) else f"{tuned.speedup:.2f}x")
    console.print(table)
    where = f"plan cache: {plan_cache.cache_file()}" if plan_cache.enabled() else \
        "plans not stored (CONVGRAD_PLANS=off)"
    console.print(f"{where} ({len(problems) - failed + len(errors)} of {len(problems)} problems tuned in "
                  f"{time.perf_counter() - start:.1f} s)", markup=False, highlight=False)
    return 0 if failed == 0 else 1


def show(console: Console) -> int:
    """List the cached plans (this machine's first); exit 0."""
    from .engines.fast import plan_cache

    path = plan_cache.cache_file()
    entries = plan_cache.entries()
    here = plan_cache.machine_key()
    table = Table(title=f"plans cached in {path}")
    for column in ("here", "problem", "plan", "ms", "default ms", "tuned"):
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row("yes" if e.current else "no", escape(describe_key(e.problem)),
                      describe_plan(e.plan) if e.plan else "(not a plan: ignored)",
                      "-" if e.ms is None else f"{e.ms:.3f}", "-" if e.default_ms is None else f"{e.default_ms:.3f}",
                      e.tuned)
    console.print(table)
    mine = sum(e.current for e in entries)
    console.print(f"this machine: {here}\n{mine} plans for it, {len(entries) - mine} for other machines or versions "
                  f"(never used here){'' if plan_cache.enabled() else '; CONVGRAD_PLANS=off: none is used'}",
                  markup=False, highlight=False)
    return 0


def clear(console: Console, all_machines: bool) -> int:
    from .engines.fast import plan_cache

    removed = plan_cache.clear(all_machines)
    console.print(f"removed {removed} plans from {plan_cache.cache_file()}", markup=False, highlight=False)
    return 0


TUNE_HELP = """Measure the fast engine's candidate plans on this machine and cache the fastest.

\b
convgrad tune --shapes=FILE [--dir=BWD_D,BWD_W] [--dt=f32] [--tag=nxc] [--mb=N] [DESCRIPTOR]...
convgrad tune --show | --clear

Each problem (benchdnn descriptor lines from --shapes files, like `convgrad conv --batch`, or
descriptors on the command line) runs every candidate plan of the fast engine (strategy, register
block, blocking...) on random inputs, each plan in its own block: a warm-up call, a pause, then
timed calls for about --block-ms; the fastest median is stored in the plan cache unless it beats
the default plan by less than 3%. Later calls on the same problem (shape, dtype, layout, threads,
CPU) use the cached plan. The cache: plans.json in the user's cache directory ($XDG_CACHE_HOME/
convgrad on Linux), keyed by CPU model and features, kernel family, thread count and convgrad's
version (a copy from another machine is never used).

\b
Environment: CONVGRAD_PLANS=off ignores the cache, CONVGRAD_PLANS=FILE uses that file;
CONVGRAD_AUTOTUNE=1 tunes each new problem at its first call.
"""


def options_to_problems(shapes: tuple[str, ...], descriptors: tuple[str, ...], direction: str, dt: str, tag: str,
                        mb: int) -> tuple[list[Problem], list[str]]:
    """Parse the command line's lists (usage errors raise click.BadParameter)."""
    directions = _list("--dir", direction, tuple(DIRECTIONS), upper=True)
    dts = _list("--dt", dt, tuple(k for k in DATA_DTYPES))
    tags = _list("--tag", tag, tuple(TAGS))
    return collect(shapes, descriptors, directions, dts, tags, mb)


def main(shapes: tuple[str, ...], descriptors: tuple[str, ...], direction: str, dt: str, tag: str, mb: int,
         block_ms: float, show_cache: bool, clear_cache: bool, all_machines: bool) -> None:
    console = Console(width=None if sys.stdout.isatty() else 140)
    if show_cache or clear_cache:
        if shapes or descriptors:
            raise click.UsageError("--show and --clear take no shapes or descriptors")
        sys.exit(show(console) if show_cache else clear(console, all_machines))
    problems, errors = options_to_problems(shapes, descriptors, direction, dt, tag, mb)
    if not problems and not errors:
        raise click.UsageError("nothing to tune: give --shapes=FILE or a descriptor (or --show)")
    sys.exit(run(problems, errors, block_ms, console))
