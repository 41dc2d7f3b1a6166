"""What the drivers print: one line per case, benchdnn perf lines (templates, CSV), the summary
table and line, and the performance plot with the machine's GEMM ceiling."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.table import Table
from rich.text import Text

from .driver import Result

__all__ = ["PERF_TEMPLATES", "check_template", "case_line", "perf_line", "csv_header", "summary_line",
           "summary_table", "gemm_ceiling", "plot", "best_gflops"]

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
    """The perf line of a timed case (``csv``: one quoted CSV row)."""
    fields = _fields(result)
    text = check_template(template)
    if template == "csv":
        row = io.StringIO()
        csv.writer(row, lineterminator="").writerow(["perf", *(fields[f] for f in _FIELD.findall(text))])
        return row.getvalue()
    return _FIELD.sub(lambda m: fields[m.group(1)], text)


def csv_header() -> str:
    return "perf," + ",".join(_HEADERS[f] for f in _FIELD.findall(_DEF))


def case_line(result: Result) -> str:
    """``N:PASSED __REPRO: ...``, ``N:SKIPPED (why) __REPRO: ...`` or ``N:FAILED (why) __REPRO: ...``."""
    status = f"FAILED ({result.reason})" if result.reason else f"SKIPPED ({result.skipped})" if result.skipped \
        else "PASSED"
    return f"{result.index}:{status} __REPRO: {result.repro}"


def summary_line(results: Sequence[Result]) -> str:
    """benchdnn's ``tests:T passed:P skipped:S failed:F`` (a skipped case neither passed nor failed)."""
    skipped = sum(bool(r.skipped) and r.ok for r in results)
    failed = sum(not r.ok for r in results)
    return f"tests:{len(results)} passed:{len(results) - skipped - failed} skipped:{skipped} failed:{failed}"


def summary_table(results: Sequence[Result], mode: str) -> Table:
    """One row per case: name, ops, status and the check's error or the timings."""
    table = Table()
    for column in ("#", "name", "ops", "status"):
        table.add_column(column, overflow="fold")
    numbers = ("Gops", "min ms", "avg ms", "GFLOP/s", "other ops ms") if mode == "P" else ("error / limit",)
    for column in numbers:
        table.add_column(column, justify="right")
    for r in results:
        status = ("[red]FAILED[/red]" if not r.ok else "[yellow]SKIPPED[/yellow]" if r.skipped
                  else "[green]PASSED[/green]")
        if not r.ok or r.skipped or (mode == "C" and not r.checks) or (mode == "P" and not r.times):
            cells = ("",) * len(numbers)
        elif mode == "P":
            f = _fields(r)
            cells = (f"{float(f['Gops']):.4g}", f"{float(f['-time']):.3f}", f"{float(f['0time']):.3f}",
                     f"{float(f['-Gflops']):.2f}", f"{float(f['-other']):.3f}")
        else:
            cells = (f"{r.max_error:.2g}",)
        table.add_row(str(r.index), Text(r.name), r.kinds.replace("+", "\n"), status, *cells)  # no markup
    return table


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


def plot(results: Sequence[Result], path: str | Path, ceiling: float) -> None:
    """Bar chart of GFLOP/s (best run) per timed case, with the GEMM ceiling as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in results if r.ok and r.times]
    labels = [f"{r.index}: {r.name} ({r.kinds if '+' not in r.kinds else str(r.kinds.count('+') + 1) + ' ops'})"
              .replace("$", r"\$") for r in timed]  # a name is not mathtext
    values = [best_gflops(r) for r in timed]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.35 * max(len(timed), 1)))
    ax.barh(labels, values, color="tab:blue", label=f"{timed[0].engine if timed else ''} engine, best run")
    ax.axvline(ceiling, color="tab:red", linestyle="--", label=f"numpy sgemm 2048x2048: {ceiling:.0f} GFLOP/s")
    for y, value in enumerate(values):
        ax.annotate(f" {value:.3g}", (value, y), va="center", fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s")
    ax.set_title("convgrad: GFLOP/s per case")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
