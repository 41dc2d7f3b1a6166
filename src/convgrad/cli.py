"""The ``convgrad`` command line: ``demo``, and the benchdnn-style ``graph`` and ``conv`` drivers."""

from __future__ import annotations

import importlib.util
import io
import math
import os
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .batch import Case
from .driver import CONV, GRAPH, Driver, Result, RunSettings, run_case
from .engines import available_engines, default_engine_name
from .report import MAX_PLOT_BARS, Summary, case_line, check_template, csv_header, gemm_ceiling, perf_line, plot
from .untrusted import printable, shorten
from .tune_command import TUNE_HELP

EXIT_CODES = """\b
Exit codes:
  0  every case passed
  1  some case failed (a bad file or line counts as a failed case)
  2  usage error (bad option on the command line, more cases than --max-cases)"""

#: --max-cases by default: a run of more cases is refused before any runs.
DEFAULT_MAX_CASES = 100_000
#: Upper ends of the timing options (--max-ms-per-prb, --fix-times-per-prb).
MAX_MS_PER_PRB = 60_000.0
MAX_TIMES_PER_PRB = 100_000
_MAX_ERROR_CHARS = 2000


@contextmanager
def _printable_errors() -> Iterator[None]:
    """Usage errors show the text they quote (option names and values) escaped and cut."""
    try:
        yield
    except click.ClickException as exc:
        exc.message = shorten(printable(exc.message), _MAX_ERROR_CHARS)
        raise


class _Commands(click.Group):
    """The ``convgrad`` group: its own and its commands' usage errors pass through :func:`printable`."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _printable_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        for stream in (sys.stdout, sys.stderr):  # a character the terminal cannot show: escaped, not an error
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(errors="backslashreplace")
        with _printable_errors():
            return super().invoke(ctx)

_BATCH_HELP = """\b
Batch files (--batch=FILE) hold such command lines, one case a line:
  # comment
  --reset --dt=bf16 --case=conv.json      (graph)
  --dir=BWD_W --batch=shapes_resnet_50    (conv: descriptors or nested batches)
Options persist from line to line until --reset (back to the defaults);
relative paths are resolved against the batch file's folder."""


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="convgrad")
def main() -> None:
    """convgrad: oneDNN Graph convolution-gradient ops, spec-exact, in NumPy.

    \b
    convgrad demo     compute and verify a real ResNet-50 layer's gradients
    convgrad graph    run oneDNN Graph JSON cases, benchdnn graph-driver style
    convgrad conv     run benchdnn convolution descriptors
    convgrad tune     measure the engine's plans on this machine and cache the fastest
    """


@main.command(epilog=EXIT_CODES)
@click.option("--mb", default=4, show_default=True, help="Minibatch of the layer.")
@click.option("--seed", type=int, default=None, help="Random seed (default: fresh each run).")
def demo(mb: int, seed: int | None) -> None:
    """Compute and verify the gradients of a real ResNet-50 layer."""
    from .demo import run

    sys.exit(0 if run(mb=mb, seed=seed) else 1)


def _knob_options(driver: Driver) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One click option per driver option, validated by the option's own parser."""

    def validate(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                driver.knobs[param.name.replace("_", "-")].check(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for knob in reversed(list(driver.knobs.values())):
            default = f" [default: {knob.default}]" if knob.default else ""
            f = click.option(f"--{knob.name}", metavar="VALUE", callback=validate, help=knob.help + default)(f)
        return f

    return decorate


def _check_scheduler(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    if importlib.util.find_spec("distributed") is None:
        raise click.BadParameter("needs dask.distributed: pip install 'convgrad[dask]'")
    from .dask.cluster import parse_scheduler

    try:
        parse_scheduler(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if math.isnan(value):
        raise click.BadParameter(f"{value}: expected a number from 0 to {MAX_MS_PER_PRB:g}")
    return value


def _results(stack: ExitStack, driver: Driver, settings: RunSettings, cases: Iterable[Case],
             scheduler: str | None) -> Iterator[Result]:
    """The cases' results in order: run here one by one, or as tasks on a dask cluster."""
    if scheduler is None:
        return (run_case(driver, settings, case, index) for index, case in enumerate(cases))
    from .dask.cluster import connect, run_cases

    try:
        client = stack.enter_context(connect(scheduler))
    except (OSError, TimeoutError, ValueError) as exc:  # unreachable, or not an address
        raise click.BadParameter(f"{scheduler!r}: cannot reach the scheduler ({exc})",
                                 param_hint="--scheduler") from None
    return run_cases(client, driver, settings, cases)


def _run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by ``graph`` and ``conv`` that hold for the whole run."""
    options = [
        click.option("--batch", "batches", multiple=True, metavar="FILE",
                     help="Batch file of command lines (repeatable)."),
        click.option("--mode", type=click.Choice(["C", "P"], case_sensitive=False), default="C",
                     show_default=True, help="C: check the engine against the reference engine; P: time it."),
        click.option("--engine", type=click.Choice(available_engines()), default=None,
                     help=f"Engine to check or time [default: {default_engine_name()}]."),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=None,
                     help="Seed of the random inputs (case N uses SEED+N; default: fresh each run)."),
        click.option("--perf-template", default="def", show_default=True, metavar="def|csv|TEXT",
                     help="Perf line format: def (benchdnn's), csv (quoted, with a header row) or a text with "
                          "%engine% %impl% %name% %prb% %Gops% %-time% %-Gflops% %0time% %0Gflops% %-other% %0other% "
                          "(times: the whole graph; GFLOP/s: its convolutions; other: the rest of the graph)."),
        click.option("--max-ms-per-prb", "max_ms", type=click.FloatRange(0, MAX_MS_PER_PRB), default=1000.0,
                     show_default=True, callback=_finite,
                     help="P mode: time each case for about this long (at least 3 runs)."),
        click.option("--fix-times-per-prb", "times", type=click.IntRange(0, MAX_TIMES_PER_PRB), default=0,
                     show_default=True, help="P mode: exactly this many timed runs (0: use --max-ms-per-prb)."),
        click.option("--max-cases", type=click.IntRange(1), default=DEFAULT_MAX_CASES, show_default=True,
                     help="Refuse to start a run of more cases (counted, nested batches included, before any "
                          "case runs)."),
        click.option("--plot", type=click.Path(dir_okay=False, writable=True), default=None, is_flag=False,
                     flag_value="", metavar="[=FILE.png]",
                     help="P mode: save a chart of GFLOP/s per case with the machine's GEMM ceiling: at FILE.png, "
                          "or with a bare --plot next to the file stdout goes to (perf.csv -> perf.png)."),
        click.option("--scheduler", default=None, metavar="local:N|ADDRESS", callback=_check_scheduler,
                     help="Run the cases as tasks on a dask.distributed cluster: local:N starts N worker processes "
                          "here, ADDRESS (tcp://host:8786) uses a running scheduler. Same lines, summary and exit "
                          "code; a case whose worker dies is FAILED. Needs convgrad[dask]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _collect(driver: Driver, targets: tuple[str, ...], batches: tuple[str, ...],
             knobs: dict[str, Any]) -> tuple[int, Iterator[Case]]:
    """How many cases the command line has, and the cases (its own targets, then its batch files, in
    order), read as they are run."""
    reader = driver.reader()
    settings = reader.defaults()
    settings.update({name.replace("_", "-"): v for name, v in knobs.items() if v is not None})
    count = len(targets) * reader.combinations(settings) + sum(reader.count(Path(b), dict(settings)) for b in batches)

    def cases() -> Iterator[Case]:
        for t in targets:
            yield from reader.cases(t, settings, "command line")
        for batch in batches:
            yield from reader.read(Path(batch), dict(settings))

    # --match: the others neither run nor count (the count above is then an upper bound)
    return count, (case for case in cases() if driver.selected(case))


def _next_to_stdout() -> str:
    """Where a bare ``--plot`` goes: next to the regular file stdout is redirected to, with .png."""
    try:
        target = Path(os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}"))
        regular = target.is_file()
    except (OSError, ValueError, AttributeError):  # no /proc, or stdout is not a real file
        regular = False
    if not regular:
        raise click.BadParameter("a bare --plot writes next to the file stdout is redirected to (convgrad conv "
                                 "--mode=P --perf-template=csv --plot ... > perf.csv); give --plot=FILE.png",
                                 param_hint="--plot")
    return str(target.with_suffix(".png"))


def _running(driver: Driver, case: Case, index: int, doing: str) -> str:
    """The progress line's note on the case running: its number, text (shortened) and task."""
    text = printable(driver.problem_text(case))
    return escape(f"{index}: {text if len(text) <= 60 else text[:57] + '...'} ({doing})")


def _drive(driver: Driver, targets: tuple[str, ...], batches: tuple[str, ...], mode: str, engine: str | None,
           seed: int | None, perf_template: str, max_ms: float, times: int, max_cases: int, plot_file: str | None,
           scheduler: str | None, **knobs: Any) -> None:
    """Run every case, print its line, the summary table and line; exit 0, 1 or 2."""
    mode = mode.upper()
    try:
        check_template(perf_template)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perf-template") from None
    if plot_file == "":
        plot_file = _next_to_stdout()
    if plot_file and mode != "P":
        raise click.UsageError("--plot needs --mode=P")
    if plot_file and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError("--plot needs matplotlib: pip install 'convgrad[plot]'")
    try:
        folder = Path(plot_file).resolve().parent if plot_file else None
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.BadParameter(f"{plot_file!r}: {exc}", param_hint="--plot") from None
    if folder and not (folder.is_dir() and os.access(folder, os.W_OK)):
        raise click.BadParameter(f"{plot_file!r}: folder {str(folder)!r} does not exist or is not writable",
                                 param_hint="--plot")
    count, cases = _collect(driver, targets, batches, knobs)
    if not count:
        raise click.UsageError(f"nothing to run: give {'--case' if driver.trigger else 'a descriptor'} or --batch")
    if count > max_cases:
        raise click.UsageError(f"the command line and its batch files hold {count:,} cases: expected at most "
                               f"{max_cases:,} (--max-cases=N runs more)")
    settings = RunSettings(mode, engine or default_engine_name(), secrets.randbits(31) if seed is None else seed,
                           max_ms, times)
    csv_out = mode == "P" and perf_template == "csv"
    info = Console(stderr=csv_out, width=None if sys.stdout.isatty() else 120)
    if csv_out:
        click.echo(csv_header())
    summary = Summary(mode, count)
    notes: dict[str, None] = {}
    timed: list[Result] = []  # the first cases timed, for --plot (every passed case is timed in P mode)
    # On a terminal (stderr), the bar and the elapsed time, and the case running and what it does: a
    # single long case shows that it runs too. Elsewhere rich draws nothing.
    doing = "checking against the reference engine" if mode == "C" else "timing"
    with ExitStack() as stack, Progress(TextColumn(f"convgrad {driver.name}"), BarColumn(), MofNCompleteColumn(),
                                        TimeElapsedColumn(), TextColumn("{task.description}"),
                                        console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("", total=count)

        def announced(cases: Iterator[Case]) -> Iterator[Case]:
            for index, case in enumerate(cases):  # taken just before it runs
                progress.update(task, description=_running(driver, case, index, doing))
                yield case

        for result in _results(stack, driver, settings, announced(cases), scheduler):
            summary.add(result)
            notes.update(dict.fromkeys(result.notes))
            if mode == "P" and result.ok and not result.skipped:
                click.echo(perf_line(result, perf_template))
                if plot_file and len(timed) < MAX_PLOT_BARS:
                    timed.append(result)
            else:
                click.echo(case_line(result), err=csv_out)
            progress.advance(task)
    info.print(summary.table())
    for note in notes:
        info.print(f"note: {printable(note)}", markup=False, highlight=False, soft_wrap=True)
    if plot_file:
        plot(timed, plot_file, gemm_ceiling(), left_out=summary.passed - len(timed))
        info.print(f"plot: {printable(plot_file)}", markup=False, highlight=False)
    click.echo(summary.line(), err=csv_out)
    sys.exit(0 if not summary.failed else 1)


_GRAPH_HELP = """Run oneDNN Graph JSON cases as benchdnn's graph driver does.

\b
convgrad graph --case=FILE.json [--dt=f32|bf16|f16] [--in-shapes=ID:AxBxC[*tag][+ID:...]]
               [--op-attrs=OPID:name:value[*name:value]] [--op-kind=OPID:KIND|undef[+...]] [--mb=N]
               [--attr-fpmath=MODE[,...]] [--tensor-property=ID:PROPERTY] [--mode=C|P] [--engine=...]
convgrad graph --batch=FILE

The graph's ops (the seven convolution ops and the ops around them: element-wise ops such as ReLU,
GELU, Sigmoid and their backward ops, binary ops such as Add and Multiply, BiasAdd,
BiasAddBackward, TypeCast, Reorder, StaticReshape, StaticTranspose; see docs/ops.md) run in
dependency order; graph inputs get random non-zero data laid out with their strides. C mode checks
every op against the reference engine on the same inputs; P mode times the whole graph and
reports the GFLOP/s of its convolutions and the time of the other ops. oneDNN's partitioning
options (--expected-n-partitions) are accepted and ignored.
Rewritten shapes and attributes flow to the outputs by shape inference. A shape given as input 2
(dst_shape, weights_shape, filter_shape) takes its spatial/kernel sizes from the op's attribute,
else from the op's output shape in the file (a diff_src size that no longer fits diff_dst becomes
the smallest that does; S*O per axis with a same_* auto_pad), and its batch and channels from the op's data inputs.

\b
Output: one line per case, "N:PASSED __REPRO: <command>" or "N:FAILED (why) __REPRO: <command>"
(C mode) or a perf line (P mode), a summary table, and "tests:T passed:P skipped:S failed:F".
"""

_CONV_HELP = """Run benchdnn convolution problem descriptors, with benchdnn's conv-driver options.

\b
convgrad conv [--dir=FWD_B|FWD_D|FWD_I|BWD_D|BWD_W|BWD_WB] [--dt=DT|SRC:WEI:DST] [--mb=N]
              [--stag=TAG] [--wtag=TAG] [--dtag=TAG] [--attr-post-ops=...] [--match=REGEX] DESCRIPTOR...
convgrad conv --batch=FILE

A descriptor is benchdnn's "gG mbN icC idD ihH iwW ocK odD ohH owW kdK khK kwK sdS shS swS pdP phP
pwP ddD dhD dwD nNAME" (dilation written minus one; missing sizes derived as benchdnn does), e.g.
mb2ic64ih56oc64oh56kh3ph1n"resnet_50:res2a_branch2b". Every problem option takes a comma-separated
list (--dir=FWD_B,BWD_D --dt=bf16,f32) and runs every combination, as benchdnn does; the default
direction is benchdnn's FWD_B. Mixed --dt (bf16:bf16:f32, f32:bf16:bf16...) widens the inputs to
f32 (TypeCast), accumulates in f32 and rounds each output once to its type; each op is checked
in its own type. Post-ops run after the forward convolution as the graph's element-wise and binary
ops. Integer quantization (u8/s8/s32 data or post-op types, --attr-scales, --attr-zero-points, a
sum zero point) is not convgrad's job: such cases print "N:SKIPPED (why)", count in skipped:S and
do not fail the run. --alg, --impl, --skip-impl and blocked tags are accepted; the run notes that
they change nothing in convgrad. Modes and output as for "convgrad graph"; the summary line is
"tests:T passed:P skipped:S failed:F".
"""


@main.command(help=_GRAPH_HELP + "\n" + _BATCH_HELP, epilog=EXIT_CODES)
@click.option("--case", "cases", multiple=True, metavar="FILE.json", help="oneDNN Graph JSON case (repeatable).")
@_knob_options(GRAPH)
@_run_options
def graph(cases: tuple[str, ...], batches: tuple[str, ...], plot: str | None, **options: Any) -> None:
    """``convgrad graph`` (its help is _GRAPH_HELP)."""
    _drive(GRAPH, cases, batches, plot_file=plot, **options)


@main.command(help=_CONV_HELP + "\n" + _BATCH_HELP, epilog=EXIT_CODES)
@click.argument("descriptors", nargs=-1, metavar="[DESCRIPTOR]...")
@_knob_options(CONV)
@_run_options
def conv(descriptors: tuple[str, ...], batches: tuple[str, ...], plot: str | None, **options: Any) -> None:
    """``convgrad conv`` (its help is _CONV_HELP)."""
    _drive(CONV, descriptors, batches, plot_file=plot, **options)


@main.command(help=TUNE_HELP, epilog=EXIT_CODES)
@click.argument("descriptors", nargs=-1, metavar="[DESCRIPTOR]...")
@click.option("--shapes", multiple=True, metavar="FILE", help="File of benchdnn descriptor lines (repeatable).")
@click.option("--dir", "direction", default="BWD_D,BWD_W", show_default=True, metavar="DIR[,DIR]",
              help="Directions: FWD_D, FWD_B, FWD_I (forward), BWD_D, BWD_W, BWD_WB.")
@click.option("--dt", default="f32", show_default=True, metavar="DT[,DT]", help="Data types: f32, bf16, f16, f64.")
@click.option("--tag", default="nxc", show_default=True, metavar="TAG[,TAG]",
              help="Layouts: nxc (NXC data, XIO weights), ncx (NCX data, OIX weights).")
@click.option("--mb", type=click.IntRange(0, 1 << 20), default=0, show_default=True,
              help="Minibatch (0: each descriptor's own).")
@click.option("--block-ms", type=click.FloatRange(1, 60_000), default=200.0, show_default=True,
              help="Time each plan for about this long (at least 3 calls, after a warm-up call).")
@click.option("--show", "show_cache", is_flag=True, help="List the cached plans and exit.")
@click.option("--clear", "clear_cache", is_flag=True, help="Remove this machine's cached plans and exit.")
@click.option("--all-machines", is_flag=True, help="With --clear: every machine's plans.")
def tune(descriptors: tuple[str, ...], shapes: tuple[str, ...], direction: str, dt: str, tag: str, mb: int,
         block_ms: float, show_cache: bool, clear_cache: bool, all_machines: bool) -> None:
    """``convgrad tune`` (its help is TUNE_HELP)."""
    from .tune_command import main as tune_main

    tune_main(shapes, descriptors, direction, dt, tag, mb, block_ms, show_cache, clear_cache, all_machines)
