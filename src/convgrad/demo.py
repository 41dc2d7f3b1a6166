"""The main job: gradients of a real ResNet-50 training layer, computed and verified.

Takes ResNet-50's res3a_branch2b layer (3x3, 128 -> 128 channels, 28x28, pad 1) at a small
minibatch, runs one training step's convolution family with the default engine (forward,
backward-data, backward-weights, in NXC/XIO as oneDNN does), and verifies it three ways: against
the float64 reference engine, by the adjointness identities
``<conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_weights(x, dy)>``, and by a finite difference
of the loss along a random direction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from . import convolution, convolution_backward_data, convolution_backward_weights
from .dtypes import dtype_name
from .engines import default_engine_name

LAYER = "resnet_50:res3a_branch2b  mb{mb} ic128 ih28 oc128 oh28 kh3 ph1 (NXC data, XIO weights)"


@dataclass
class Check:
    name: str
    value: float
    limit: float

    @property
    def ok(self) -> bool:
        return bool(abs(self.value) <= self.limit)


@dataclass
class Timing:
    """Seconds of warm calls of one op, timed as the benchmark times them."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: how far one call's figure can be off on this machine now."""
        return (max(self.seconds) - min(self.seconds)) / self.median


def _timed(fn, *args, min_runs: int = 5, budget: float = 1.0, **kwargs):
    """Result and :class:`Timing` of ``fn``: one warm-up call (the first call of a process pays
    one-time setup), then at least ``min_runs`` calls and more while they take under ``budget``
    seconds in all (at most 50)."""
    out = fn(*args, **kwargs)
    seconds: list[float] = []
    while len(seconds) < min_runs or (sum(seconds) < budget and len(seconds) < 50):
        start = time.perf_counter()
        fn(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
    return out, Timing(seconds)


def run(mb: int = 4, seed: int | None = None, console: Console | None = None) -> bool:
    """Run the demo; print what was done; return True when every check passed."""
    console = console or Console(width=max(Console().width, 120))
    rng = np.random.default_rng(seed)
    attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
    x = rng.standard_normal((mb, 28, 28, 128)).astype(np.float32)
    w = (rng.standard_normal((3, 3, 128, 128)) / np.sqrt(9 * 128)).astype(np.float32)
    engine = default_engine_name()
    console.print(f"[bold]convgrad demo[/bold]: one training step of {LAYER.format(mb=mb)}")
    console.print(f"engine: [cyan]{engine}[/cyan] (checked against the float64 reference engine)\n")

    y, t_fwd = _timed(convolution, x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, t_bd = _timed(convolution_backward_data, dy, w, x.shape, **attrs)
    dw, t_bw = _timed(convolution_backward_weights, x, dy, w.shape, **attrs)
    flops = 2 * mb * 128 * 128 * 9 * 28 * 28

    table = Table(title="ops run")
    table.add_column("op", no_wrap=True)
    for col in ("output", "median ms", "GFLOP/s", "spread", "runs", "max|err|", "rel. err"):
        table.add_column(col, justify="right", no_wrap=True)
    checks: list[Check] = []
    refs = {
        "Convolution": (y, lambda: convolution(x, w, **attrs, engine="reference"), t_fwd),
        "ConvolutionBackwardData": (dx, lambda: convolution_backward_data(dy, w, x.shape, **attrs,
                                                                          engine="reference"), t_bd),
        "ConvolutionBackwardWeights": (dw, lambda: convolution_backward_weights(x, dy, w.shape, **attrs,
                                                                                engine="reference"), t_bw),
    }
    for name, (got, reference, timing) in refs.items():
        want = reference().astype(np.float64)
        err = float(np.max(np.abs(got - want)))
        rel = err / float(np.max(np.abs(want)))
        checks.append(Check(f"{name} vs reference (relative)", rel, 1e-5))
        table.add_row(name, "x".join(map(str, got.shape)) + f" {dtype_name(got.dtype)}", f"{timing.median * 1e3:.1f}",
                      f"{flops / timing.median / 1e9:.1f}", f"{timing.spread:.0%}", str(len(timing.seconds)),
                      f"{err:.2e}", f"{rel:.1e}")
    console.print(table)
    console.print("median ms: of the warm calls after one warm-up call, as `make bench` times; spread: "
                  "(slowest - fastest) / median of those calls, how much one call's figure varies on this "
                  "machine now (other jobs, frequency, caches).\n", highlight=False)

    # Adjointness, in float64 from the float32 results. The three inner products are one number,
    # bounded by ||y||*||dy|| (Cauchy-Schwarz); it largely cancels, so gaps are measured on that scale.
    x64, w64, dy64, y64 = (a.astype(np.float64) for a in (x, w, dy, y))
    lhs = float(np.vdot(y64, dy64))
    scale = float(np.linalg.norm(y64) * np.linalg.norm(dy64))
    for name, value in (("<x, bwd_data(dy, w)>", float(np.vdot(x64, dx))),
                        ("<w, bwd_weights(x, dy)>", float(np.vdot(w64, dw)))):
        checks.append(Check(f"<conv(x,w), dy> = {name} (gap / ||y||·||dy||)", (value - lhs) / scale, 1e-6))

    # Finite difference of L(w) = <conv(x, w), dy> along a random direction (exact: L is linear in
    # w). <dw, direction> is a sum of terms of either sign that may cancel to near 0 (a relative
    # gap then failed a correct dw, 1 seed in some hundreds), so the gap is measured on the scale
    # of its terms, sum |dw * direction|: f32 rounding of dw gives about 1e-9 there.
    direction = rng.standard_normal(w.shape)
    eps = 1e-3
    step = convolution(x64, w64 + eps * direction, **attrs, engine="reference")
    fd = (float(np.vdot(step, dy64)) - float(np.vdot(convolution(x64, w64, **attrs, engine="reference"), dy64))) / eps
    checks.append(Check("finite difference vs <dw, direction> (gap / sum |dw * direction|)",
                        (fd - float(np.vdot(dw, direction))) / float(np.vdot(np.abs(dw), np.abs(direction))), 1e-7))

    verdict = Table(title="verification")
    verdict.add_column("check")
    for col in ("value", "limit", "result"):
        verdict.add_column(col, no_wrap=True)
    for c in checks:
        verdict.add_row(c.name, f"{c.value:+.2e}", f"{c.limit:.0e}", "[green]ok[/green]" if c.ok else "[red]FAILED[/red]")
    console.print(verdict)
    passed = all(c.ok for c in checks)
    console.print("[bold green]all checks passed[/bold green]" if passed else "[bold red]some checks FAILED[/bold red]")
    return passed
