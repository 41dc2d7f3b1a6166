"""Benchmark convgrad's default engine against PyTorch CPU on real topologies.

    make bench                                   # every suite, writes RESULTS.md and results.png
                                                 # (--output X.md: X.md and x.png beside it)
    python benchmarks/run.py --quick             # a short check (a few layers per suite)
    python benchmarks/run.py --suite resnet_50 --dtype f32 bf16 --mb 16 --no-write
    python benchmarks/run.py --threads 1         # both sides on one thread (see below)

For each layer of a benchdnn shape list (``benchmarks/shapes``) and each gradient (backward data,
backward weights) it times convgrad through its public API (NXC/XIO, and NCX/OIX on the ResNet
suite) and PyTorch's ``aten.convolution_backward`` asking for that one gradient, in NCHW and in
channels_last; the better of the two is the "best peer". GFLOP/s = 2*N*OC*IC/G*prod(K)*prod(O) /
time (the best of as many runs as fit in ~0.4 s each, 2 to 50; our own variants of a row, NXC,
NCX and for bf16/f16 rows our f32 for "vs own f32", run in turns so that load from other jobs hits
them alike; each library runs in its own block, after a pause and warm-up calls, since another
library's spinning threads slow the first runs after a switch: PyTorch channels_last measured
80 instead of 218 GFLOP/s timed call by call in turns with us).
"extra mem" is the peak of convgrad's allocations (tracemalloc, after a
warm-up call, on an empty cache of temporaries: what a first call takes, the engine's blocks
rounded to 2 MiB included) less its result, as a multiple of inputs + output. The GEMM ceiling (numpy sgemm
4096^2) is measured in the same run, and per f32 layer its "GEMM bound": the layer's gradient as
one GEMM on operands already laid out (:func:`gemm_bound`), the most a GEMM-based engine on this
BLAS can reach there ("ours / bound" shows what the gathers, scatters and blocking cost).
PyTorch pads symmetrically: a benchdnn layer whose right pad differs from its left is given to
it with the smaller pad on both sides and the input longer by the difference (same output, same
FLOPs).

``--threads N`` limits every library (OpenBLAS, numba, PyTorch/OpenMP) to N threads; it is set
before NumPy loads. On a machine that other jobs share, multi-threaded OpenBLAS can collapse (its
threads wait on a descheduled partner at every GEMM), so the load average is recorded with the
results: compare runs taken on an otherwise idle machine, or on one thread each. The header also
records the kernel family of the engine's JIT micro-kernels (``CONVGRAD_ISA`` forces a lower one)
and their measured FMA peak: the 6x2-vector f32 micro-kernel with its panels in L1, on one thread
and on all ``--threads``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
if "--threads" in sys.argv[:-1]:  # must precede the first import of NumPy
    for _var in THREAD_VARS:
        os.environ[_var] = sys.argv[sys.argv.index("--threads") + 1]

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import convgrad as cg  # noqa: E402
from convgrad.descriptor import ConvDescriptor, parse_descriptor_file  # noqa: E402
from convgrad.dtypes import DATA_DTYPES  # noqa: E402
from convgrad.report import gemm_ceiling  # noqa: E402
from convgrad.engines.fast import workspace  # noqa: E402

SUITES = {"resnet_50": "shapes_resnet_50", "mobilenet_dw": "shapes_mobilenet_dw",
          "dilated": "shapes_dilated", "3d_unet": "shapes_3d_unet"}
TASKS = {"bwd_d": "ConvolutionBackwardData", "bwd_w": "ConvolutionBackwardWeights"}
#: Default minibatch per suite (3D U-Net layers are single large volumes).
DEFAULT_MB = {"resnet_50": 16, "mobilenet_dw": 16, "dilated": 16, "3d_unet": 1}


def best_times(fns: list, budget: float, max_reps: int) -> list[float]:
    """Best wall time of each of ``fns``, run in turns (one run of each per round, so that a
    spell of load from other jobs hits them alike) for up to ``max_reps`` rounds within about
    ``budget`` seconds per callable (the first round doubles as the warm-up: fast layers get
    several runs, slow ones need none)."""
    best, spent, reps = [math.inf] * len(fns), 0.0, 0
    while reps < max_reps and (reps == 0 or spent < budget * len(fns)):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            best[i], spent = min(best[i], elapsed), spent + elapsed
        reps += 1
    return best


#: Seconds of pause before each library's block (lets the previous library's threads go idle).
PAUSE = 0.3
#: Untimed calls of each callable at the start of its block.
WARMUP = 1


def block_times(fns: list, budget: float, max_reps: int) -> list[float]:
    """:func:`best_times` of one library's callables as a block of their own: after a pause of
    ``PAUSE`` s and ``WARMUP`` untimed calls of each (in turns)."""
    time.sleep(PAUSE)
    for _ in range(WARMUP):
        for fn in fns:
            fn()
    return best_times(fns, budget, max_reps)


# -- problems ---------------------------------------------------------------------------------------
def load_suite(suite: str, mb: int, quick: bool) -> list[ConvDescriptor]:
    lines = (HERE / "shapes" / SUITES[suite]).read_text().splitlines()
    descs = [d.with_mb(mb) for _, d in parse_descriptor_file(lines) if isinstance(d, ConvDescriptor)]
    return descs[:3] if quick else descs


def shapes(d: ConvDescriptor) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """NCX x, NCX y and OIX w shapes."""
    return ((d.n, d.ic, *d.in_size), (d.n, d.oc, *d.out_size), (d.oc, d.ic // d.groups, *d.kernel))


def ours(d: ConvDescriptor, task: str, dtype: np.dtype, data_format: str, rng: np.random.Generator):
    """(callable, inputs + output bytes) running convgrad's default engine through the API."""
    xs, ys, ws = shapes(d)
    if data_format == "NXC":
        xs, ys, ws = (xs[0], *xs[2:], xs[1]), (ys[0], *ys[2:], ys[1]), (*ws[2:], ws[1], ws[0])
    x, y, w = (rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in (xs, ys, ws))
    op = cg.Op(TASKS[task], strides=list(d.strides), dilations=list(d.dilations), pads_begin=list(d.pads_begin),
               pads_end=list(d.pads_end), groups=d.groups, data_format=data_format,
               weights_format="XIO" if data_format == "NXC" else "OIX")
    if task == "bwd_d":
        inputs, out = (y, w, np.array(xs, np.int32)), x
    else:
        inputs, out = (x, y, np.array(ws, np.int32)), w
    return (lambda: op(*inputs)), sum(a.nbytes for a in (*inputs[:2], out))


def torch_peer(d: ConvDescriptor, task: str, dtype: str, channels_last: bool):
    """A callable running PyTorch's convolution_backward for one gradient, or None if n/a."""
    import torch
    if channels_last and d.rank == 1:
        return None
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    pads = [min(b, e) for b, e in zip(d.pads_begin, d.pads_end)]
    in_size = tuple(i + abs(e - b) for i, b, e in zip(d.in_size, d.pads_begin, d.pads_end))
    xs, ys, ws = shapes(d)
    xs = (xs[0], xs[1], *in_size)
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(d.rank) if channels_last else None
    make = (lambda s: torch.randn(s, dtype=tdtype).contiguous(memory_format=fmt)) if fmt else \
        (lambda s: torch.randn(s, dtype=tdtype))
    x, dy, w = make(xs), make(ys), make(ws)
    mask = [task == "bwd_d", task == "bwd_w", False]
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, list(d.strides), pads,
                                                       list(d.dilations), False, [0] * d.rank, d.groups, mask)


#: Operands of the GEMM bound are cut to this many bytes along their long side (the rate of a
#: tall GEMM is flat in its length by then; 3-D U-Net's im2col would need gigabytes).
GEMM_BOUND_BYTES = 64 << 20


def gemm_bound(d: ConvDescriptor, task: str, rng: np.random.Generator) -> tuple[Callable[[], object], float] | None:
    """(callable, GFLOP) of the gradient as one f32 GEMM on operands already laid out: what an
    engine built on this BLAS reaches at best, with its gathers and scatters free. With L =
    N*prod(O) output positions and T = prod(K) taps, the fastest (by two runs each) of two shapes
    with the layer's FLOPs, each computed as it is or transposed (``C^T = B^T A^T``: BLAS speed
    depends on the orientation): backward data ``(L, OC) @ (OC, T*IC)`` (products, then a col2im)
    or ``(L, T*OC) @ (T*OC, IC)`` (im2col of dy); backward weights ``(T*IC, L) @ (L, OC)`` or
    ``(OC, L) @ (L, T*IC)``. L is cut to keep each operand within ``GEMM_BOUND_BYTES``. None for
    grouped layers (per-group GEMMs; the depthwise ones degenerate)."""
    if d.groups != 1:
        return None
    taps = math.prod(d.kernel)
    long = min(d.n * math.prod(d.out_size), GEMM_BOUND_BYTES // (4 * taps * max(d.ic, d.oc)))
    forms = ([(long, d.oc, taps * d.ic), (long, taps * d.oc, d.ic)] if task == "bwd_d" else
             [(taps * d.ic, long, d.oc), (d.oc, long, taps * d.ic)])
    candidates = []
    for m, k, n in (*forms, *((n, k, m) for m, k, n in forms)):
        a, b = (rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n)))
        c = np.empty((m, n), np.float32)
        candidates.append(((lambda a=a, b=b, c=c: np.matmul(a, b, out=c)), 2e-9 * m * k * n))
    return max(candidates, key=lambda fg: fg[1] / best_times([fg[0]], 0.0, 2)[0])


# -- measurement --------------------------------------------------------------------------------------
@dataclass
class Row:
    suite: str
    layer: str
    task: str
    dtype: str
    gflop: float
    ours: float                        #: GFLOP/s, NXC
    ours_ncx: float | None = None      #: GFLOP/s, NCX
    ours_f32: float | None = None      #: GFLOP/s of our f32 on the same layer, timed in turns (bf16/f16 rows)
    peers: dict[str, float] = field(default_factory=dict)
    extra_mem: float = 0.0             #: peak extra memory / (inputs + output)
    extra_mib: float = 0.0
    gemm: float | None = None          #: GFLOP/s of the layer's own GEMM on laid-out data (f32, one group)

    @property
    def best_peer(self) -> float | None:
        return max(self.peers.values()) if self.peers else None

    @property
    def ratio(self) -> float | None:
        return self.ours / self.best_peer if self.best_peer else None


def measure(d: ConvDescriptor, suite: str, task: str, dtype: str, with_ncx: bool, budget: float,
            reps: int, rng: np.random.Generator) -> Row:
    """One row: ours (NXC; NCX with ``with_ncx``; for bf16/f16 also our f32; for f32 the GEMM
    bound), then each peer, every callable in a block of its own (:func:`block_times`: after a
    call of another library, the first runs of the next are slowed by the first one's still
    spinning threads, 1.3-1.7x measured; and calls of our other variants in turns would evict
    the timed call's data from the caches, which no peer's block suffers), and our peak extra
    memory."""
    gflop = d.flops / 1e9
    fn, io_bytes = ours(d, task, DATA_DTYPES[dtype], "NXC", rng)
    fn()  # loads (or compiles) numba's code outside the memory measurement
    workspace.clear()  # a cold call: its temporaries and result on fresh blocks, all counted
    tracemalloc.start()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - result.nbytes
    tracemalloc.stop()
    del result
    timed = {"ours": fn}
    if with_ncx:
        timed["ours NCX"] = ours(d, task, DATA_DTYPES[dtype], "NCX", rng)[0]
    if dtype != "f32":
        timed["ours f32"] = ours(d, task, DATA_DTYPES["f32"], "NXC", rng)[0]
    work = dict.fromkeys(timed, gflop)
    bound = gemm_bound(d, task, rng) if dtype == "f32" else None
    if bound is not None:
        timed["gemm"], work["gemm"] = bound
    gemm_fn = timed.pop("gemm", None)  # NumPy's BLAS: a library of its own
    speed = {name: work[name] / block_times([fn], budget, reps)[0] for name, fn in timed.items()}
    if gemm_fn is not None:
        speed["gemm"] = work["gemm"] / block_times([gemm_fn], budget, reps)[0]
    peers = {}
    for name, cl in (("torch NCX", False), ("torch NXC", True)):
        peer = torch_peer(d, task, dtype, cl)
        if peer is not None:
            peers[name] = gflop / block_times([peer], budget, reps)[0]
    return Row(suite, d.name or d.canonical(), task, dtype, gflop, speed["ours"], speed.get("ours NCX"),
               speed.get("ours f32"), peers=peers, extra_mem=peak / io_bytes, extra_mib=peak / 2 ** 20,
               gemm=speed.get("gemm"))


# -- report ---------------------------------------------------------------------------------------------
def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[Row], ceiling: float) -> list[str]:
    out = ["| suite | layer | grad | dtype | GFLOP | ours GFLOP/s | % ceiling | ours NCX | torch NCX | "
           "torch NXC | ratio vs best | vs own f32 | GEMM bound | ours / bound | extra mem (x in+out, MiB) |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r.suite} | {r.layer} | {r.task} | {r.dtype} | {r.gflop:.2f} | {r.ours:.1f} | "
                   f"{100 * r.ours / ceiling:.0f} | {fmt(r.ours_ncx)} | {fmt(r.peers.get('torch NCX'))} | "
                   f"{fmt(r.peers.get('torch NXC'))} | {fmt(r.ratio, '.2f')} | "
                   f"{fmt(r.ours_f32 / r.ours if r.ours_f32 else None, '.2f')} | {fmt(r.gemm)} | "
                   f"{fmt(r.ours / r.gemm if r.gemm else None, '.2f')} | {r.extra_mem:.2f} ({r.extra_mib:.0f}) |")
    return out


def summary(rows: list[Row], ceiling: float) -> list[str]:
    """Per suite, gradient and dtype: the numbers the targets are stated in."""
    out = ["| suite | grad | dtype | layers | geomean ratio vs best peer | min ratio | geomean vs torch NCX | "
           "NCX / NXC time (max) | >=1 GFLOP layers >= 75% ceiling (GEMM bound >= 75%) | geomean ours / GEMM bound | "
           "low precision: time vs own f32 (max) | max extra mem |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r.suite, r.task, r.dtype) for r in rows}, key=lambda k: (list(SUITES).index(k[0]), k[1], k[2]))
    for suite, task, dtype in keys:
        rs = [r for r in rows if (r.suite, r.task, r.dtype) == (suite, task, dtype)]
        ratios = [r.ratio for r in rs if r.ratio]
        ncx = [r.ours / r.peers["torch NCX"] for r in rs if "torch NCX" in r.peers]
        slow = [r.ours / r.ours_ncx for r in rs if r.ours_ncx]
        big = [r for r in rs if r.gflop >= 1]
        at_ceiling = "-"
        if big and dtype == "f32":
            at_ceiling = (f"{sum(r.ours >= 0.75 * ceiling for r in big)}/{len(big)} "
                          f"({sum((r.gemm or 0) >= 0.75 * ceiling for r in big)}/{len(big)})")
        bound = [r.ours / r.gemm for r in rs if r.gemm]
        lowp = [r.ours_f32 / r.ours for r in rs if r.ours_f32]
        out.append(f"| {suite} | {task} | {dtype} | {len(rs)} | {geomean(ratios):.2f} | {fmt(min(ratios, default=None), '.2f')} | "
                   f"{geomean(ncx):.2f} | {fmt(max(slow, default=None), '.2f')} | {at_ceiling} | "
                   f"{fmt(geomean(bound) if bound else None, '.2f')} | "
                   f"{fmt(max(lowp, default=None), '.2f')} | {max(r.extra_mem for r in rs):.2f} |")
    return out


def fma_peaks(threads: int) -> str:
    """The JIT kernel family in use, the register-only FMA peak (independent FMA chains, no
    loads: the ceiling) and its micro-kernel's peak in L1, at 1 and ``threads`` threads."""
    from convgrad.engines.fast import isa, microkernel
    family = isa.family()
    if family not in isa.WIDTH:
        return f"{family} (no JIT micro-kernels)"
    width = isa.WIDTH[family]
    rows, vecs = microkernel.BLOCKS[width][1]
    reg = microkernel.register_peak(width, 1), microkernel.register_peak(width, threads)
    kernel = microkernel.fma_peak(width, 1), microkernel.fma_peak(width, threads)
    return (f"{family} ({width}-wide f32 vectors; host features: {', '.join(sorted(isa.FAMILIES[family]))}); "
            f"register-only FMA peak (independent FMA chains, no loads): {reg[0]:.0f} GFLOP/s on 1 thread, "
            f"{reg[1]:.0f} on {threads}; the {rows}x{vecs} micro-kernel in L1: {kernel[0]:.0f} / {kernel[1]:.0f}")


def environment(ceiling: float, threads: int, load: tuple[float, float], peaks: str) -> list[str]:
    import torch
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    from llvmlite import binding
    return [f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- machine: {cpu} (LLVM: {binding.get_host_cpu_name()}), {os.cpu_count()} cores, {platform.system()} "
            f"{platform.machine()}; other CPUs' runs: the RESULTS-*.md files beside this one, each naming its CPU",
            f"- python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), convgrad {cg.__version__ if hasattr(cg, '__version__') else ''}"
            f" engine '{cg.engines.default_engine_name()}'",
            f"- threads: {threads} for every library; load average (1 min) at start / end: "
            f"{load[0]:.1f} / {load[1]:.1f} (above 0.5 means other jobs shared the cores)",
            f"- GEMM ceiling (numpy sgemm 4096^2, this run, {threads} threads): {ceiling:.0f} GFLOP/s",
            f"- kernel family (ISA): {peaks}"]


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r.suite, r.task, r.dtype) for r in rows}, key=lambda k: (list(SUITES).index(k[0]), k[1], k[2]))
    fig, axes = plt.subplots(len(groups), 1, figsize=(12, 2.6 * len(groups)), squeeze=False)
    for ax, key in zip(axes[:, 0], groups):
        rs = [r for r in rows if (r.suite, r.task, r.dtype) == key]
        idx = np.arange(len(rs))
        ax.bar(idx - 0.2, [r.ours for r in rs], 0.4, label="convgrad (NXC)")
        ax.bar(idx + 0.2, [r.best_peer or 0 for r in rs], 0.4, label="best PyTorch")
        ax.set_xticks(idx, [r.layer.split(":")[-1][:18] for r in rs], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("GFLOP/s")
        ax.set_title(" / ".join(key), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", nargs="+", choices=list(SUITES), default=list(SUITES))
    parser.add_argument("--task", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--dtype", nargs="+", choices=["f32", "bf16", "f16"],
                        help="data types of every suite (default: f32, bf16 and f16 on ResNet-50, f32 elsewhere)")
    parser.add_argument("--mb", type=int, help="minibatch (default: 16; 1 for 3D U-Net)")
    parser.add_argument("--quick", action="store_true", help="3 layers per suite, one timed run each")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md and the plot")
    parser.add_argument("--output", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads per library")
    args = parser.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    budget, reps = (0.0, 1) if args.quick else (0.4, 50)  # fast layers: many runs, slow ones a few
    rng = np.random.default_rng(0)
    ceiling = gemm_ceiling(4096)
    peaks = fma_peaks(args.threads)
    print(f"GEMM ceiling {ceiling:.0f} GFLOP/s; kernel family {peaks}", flush=True)
    rows: list[Row] = []
    for suite in args.suite:
        for d in load_suite(suite, args.mb or DEFAULT_MB[suite], args.quick):
            for task in args.task:
                for dtype in args.dtype or (["f32", "bf16", "f16"] if suite == "resnet_50" else ["f32"]):
                    row = measure(d, suite, task, dtype, suite == "resnet_50" and dtype == "f32", budget, reps, rng)
                    rows.append(row)
                    print(table([row], ceiling)[-1], flush=True)
    load = (load_start, os.getloadavg()[0])
    lines = ["# convgrad benchmark results", "", *environment(ceiling, args.threads, load, peaks), "",
             f"Command: `python benchmarks/run.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip(),
             "", "## Summary", "", *summary(rows, ceiling), "", "## Layers", "", *table(rows, ceiling), ""]
    print("\n".join(lines))
    if not args.no_write:
        args.output.write_text("\n".join(lines))
        figure = args.output.with_name(args.output.stem.lower() + ".png")   # RESULTS.md: results.png
        plot(rows, figure)
        print(f"wrote {args.output} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
