"""What the drivers print: one line per case, benchdnn perf lines (templates, CSV), the summary
table and line, and the performance plot with the machine's GEMM ceiling.

Text from files and command lines (names, kinds, reasons) is printed through
:func:`~convgrad.untrusted.printable`; a reason is cut at :data:`MAX_REASON_CHARS`. Results are
summarized as they stream past (:class:`Summary`): counts, and table rows for at most
:data:`MAX_TABLE_ROWS` cases (every case of a small run, else the failures), so a run of a
million cases takes the memory of a few.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.table import Table
from rich.text import Text

from .driver import Result
from .untrusted import printable, shorten

__all__ = ["PERF_TEMPLATES", "check_template", "case_line", "perf_line", "csv_header", "Summary",
           "gemm_ceiling", "plot", "best_gflops", "MAX_TABLE_ROWS", "MAX_REASON_CHARS", "MAX_PLOT_BARS"]

#: Rows of the summary table: every case of a run of at most this many, else this many failures.
MAX_TABLE_ROWS = 50
#: Longest failure reason printed (characters; a longer one is cut, saying how much was left out).
MAX_REASON_CHARS = 2000
#: Most cases in the --plot chart (the first ones timed).
MAX_PLOT_BARS = 100
_KINDS_SHOWN = 8

_DEF = "perf,%engine%,%impl%,%name%,%prb%,%Gops%,%-time%,%-Gflops%,%0time%,%0Gflops%"
#: Named templates; ``csv`` has the same fields as ``def``, quoted, under a header row.
PERF_TEMPLATES = {"def": _DEF, "csv": _DEF}
_FIELD = re.compile(r"%([-+0]?\w+)%")
_HEADERS = {"engine": "engine", "impl": "impl", "name": "name", "prb": "prb", "Gops": "Gops",
            "-time": "min_ms", "-Gflops": "min_Gflops", "0time": "avg_ms", "0Gflops": "avg_Gflops",
            "-other": "min_other_ms", "0other": "avg_other_ms"}


def check_template(template: str) -> str:
    """The template text of ``def``, ``csv`` or a custom template; unknown fields raise ValueError."""
    text = PERF_TEMPLATES.get(template, template)
    unknown = [f for f in _FIELD.findall(text) if f not in _HEADERS]
    if unknown or not _FIELD.search(text):
        raise ValueError(f"--perf-template: {template!r}: expected def, csv or a text with fields "
                         + ", ".join(f"%{f}%" for f in _HEADERS) + (f" (unknown: %{unknown[0]}%)" if unknown else ""))
    return text


def _gflops(gops: float, seconds: float) -> float:
    return gops / seconds if seconds > 0 else 0.0


def best_gflops(result: Result) -> float:
    """GFLOP/s of the case's convolutions in its fastest run of the whole graph."""
    best = min(range(len(result.times)), key=result.times.__getitem__)
    return _gflops(result.flops / 1e9, result.convolution_times[best])


def _fields(result: Result) -> dict[str, str]:
    """Times are the whole graph's; GFLOP/s are its convolutions' FLOPs over the time spent in them,
    "other" the time of the rest of the graph (element-wise, binary, layout ops)."""
    runs = len(result.times)
    best = min(range(runs), key=result.times.__getitem__)
    mean = sum(result.times) / runs
    mean_conv = sum(result.convolution_times) / runs
    gops = result.flops / 1e9
    return {"engine": "cpu", "impl": result.engine, "name": result.name, "prb": result.prb, "Gops": f"{gops:.6g}",
            "-time": f"{result.times[best] * 1e3:.6g}", "-Gflops": f"{best_gflops(result):.6g}",
            "0time": f"{mean * 1e3:.6g}", "0Gflops": f"{_gflops(gops, mean_conv):.6g}",
            "-other": f"{(result.times[best] - result.convolution_times[best]) * 1e3:.6g}",
            "0other": f"{(mean - mean_conv) * 1e3:.6g}"}


def perf_line(result: Result, template: str) -> str:
    """The perf line of a timed case (``csv``: one quoted CSV row), printable (names and the
    template are untrusted)."""
    fields = _fields(result)
    text = check_template(template)
    if template == "csv":
        row = io.StringIO()
        csv.writer(row, lineterminator="").writerow(["perf", *(fields[f] for f in _FIELD.findall(text))])
        return printable(row.getvalue())
    return printable(_FIELD.sub(lambda m: fields[m.group(1)], text))


def csv_header() -> str:
    return "perf," + ",".join(_HEADERS[f] for f in _FIELD.findall(_DEF))


def case_line(result: Result) -> str:
    """``N:PASSED __REPRO: ...``, ``N:SKIPPED (why) __REPRO: ...`` or ``N:FAILED (why) __REPRO: ...``
    (printable, the reason cut)."""
    status = f"FAILED ({shorten(printable(result.reason), MAX_REASON_CHARS)})" if result.reason \
        else f"SKIPPED ({printable(result.skipped)})" if result.skipped else "PASSED"
    return f"{result.index}:{status} __REPRO: {result.repro}"


def _kinds(kinds: str) -> str:
    """The op kinds of a case, one a line, the first few of a large graph."""
    names = printable(kinds).split("+")
    shown = names[:_KINDS_SHOWN] + ([f"... ({len(names)} ops)"] if len(names) > _KINDS_SHOWN else [])
    return "\n".join(shown)


@dataclass
class Summary:
    """The counts of a run and the rows of its summary table, gathered as the results stream past;
    ``total`` is the number of cases the run will have."""

    mode: str
    total: int
    passed: int = 0
    skipped: int = 0
    failed: int = 0
    rows: list[tuple[str | Text, ...]] = field(default_factory=list)

    @property
    def numbers(self) -> tuple[str, ...]:
        return ("Gops", "min ms", "avg ms", "GFLOP/s", "other ops ms") if self.mode == "P" else ("error / limit",)

    def add(self, r: Result) -> None:
        """Count one result; keep its row if the table shows it."""
        skipped = bool(r.skipped) and r.ok  # a skipped case neither passed nor failed
        self.passed += r.ok and not skipped
        self.skipped += skipped
        self.failed += not r.ok
        if len(self.rows) >= MAX_TABLE_ROWS or (self.total > MAX_TABLE_ROWS and r.ok):
            return
        status = "[red]FAILED[/red]" if not r.ok else "[yellow]SKIPPED[/yellow]" if skipped else "[green]PASSED[/green]"
        if not r.ok or skipped or (self.mode == "C" and not r.checks) or (self.mode == "P" and not r.times):
            cells: tuple[str, ...] = ("",) * len(self.numbers)
        elif self.mode == "P":
            f = _fields(r)
            cells = (f"{float(f['Gops']):.4g}", f"{float(f['-time']):.3f}", f"{float(f['0time']):.3f}",
                     f"{float(f['-Gflops']):.2f}", f"{float(f['-other']):.3f}")
        else:
            cells = (f"{r.max_error:.2g}",)
        self.rows.append((str(r.index), Text(printable(r.name)), _kinds(r.kinds), status, *cells))  # no markup

    def table(self) -> Table:
        """One row per case (a large run: per failed case, the first :data:`MAX_TABLE_ROWS`): name,
        ops, status and the check's error or the timings."""
        caption = None
        if self.total > MAX_TABLE_ROWS:
            caption = (f"{self.passed + self.skipped + self.failed} cases: only failed ones are listed here"
                       + (f", the first {MAX_TABLE_ROWS} of {self.failed}" if self.failed > MAX_TABLE_ROWS else "")
                       + "; every case has its line above")
        table = Table(caption=caption)
        for column in ("#", "name", "ops", "status"):
            table.add_column(column, overflow="fold")
        for column in self.numbers:
            table.add_column(column, justify="right")
        for row in self.rows:
            table.add_row(*row)
        return table

    def line(self) -> str:
        """benchdnn's ``tests:T passed:P skipped:S failed:F``."""
        return (f"tests:{self.passed + self.skipped + self.failed} passed:{self.passed} skipped:{self.skipped} "
                f"failed:{self.failed}")


def gemm_ceiling(n: int = 2048) -> float:
    """GFLOP/s of numpy's float32 matrix product (n x n), the best of three runs."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(_timed_matmul(a) for _ in range(3))
    return 2 * n**3 / best / 1e9


def _timed_matmul(a: np.ndarray) -> float:
    start = time.perf_counter()
    a @ a
    return time.perf_counter() - start


def plot(results: Sequence[Result], path: str | Path, ceiling: float, left_out: int = 0) -> None:
    """Bar chart of GFLOP/s (best run) per timed case, with the GEMM ceiling as a line; the title
    says how many timed cases were ``left_out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in results if r.ok and r.times]
    ops = [r.kinds if "+" not in r.kinds else f"{r.kinds.count('+') + 1} ops" for r in timed]
    labels = [printable(f"{r.index}: {r.name} ({o})").replace("$", r"\$")  # a name is not mathtext
              for r, o in zip(timed, ops)]
    values = [best_gflops(r) for r in timed]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.35 * max(len(timed), 1)))
    ax.barh(labels, values, color="tab:blue", label=f"{timed[0].engine if timed else ''} engine, best run")
    ax.axvline(ceiling, color="tab:red", linestyle="--", label=f"numpy sgemm 2048x2048: {ceiling:.0f} GFLOP/s")
    for y, value in enumerate(values):
        ax.annotate(f" {value:.3g}", (value, y), va="center", fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15 * max([*values, ceiling]))  # room for the values written after the bars
    ax.set_xlabel("GFLOP/s")
    ax.set_title("convgrad: GFLOP/s per case" + (f" (the first {len(timed)}; {left_out} more not shown)"
                                                  if left_out else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6 / fig.get_figheight()), ncol=2, fontsize="small",
              frameon=False)  # below the axes: it covers no bar or label
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
