"""MobileNet's depthwise layers (benchmarks/shapes/shapes_mobilenet_dw), NXC f32: convgrad's data
and weights gradients against PyTorch's ``aten.convolution_backward`` on channels_last tensors
(only that gradient asked for), both in one process, and NCHW, each callable in a block of
its own (a pause, two untimed calls, then ``--repeats`` timed calls back to back; the median);
GFLOP/s and the ratio to PyTorch's better layout.

    python benchmarks/depthwise.py [--mb 16] [--threads 2] [--repeats 15] [--tasks bwd_d,bwd_w] [--layers 0,3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import convgrad as cg
from convgrad.descriptor import ConvDescriptor, parse_descriptor_file

HERE = Path(__file__).parent
#: Seconds of pause before each library's turn.
PAUSE = 0.05
TASKS = {"bwd_d": "ConvolutionBackwardData", "bwd_w": "ConvolutionBackwardWeights"}


def _median_seconds(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds per call of each of ``fns``, each in a block of its own: a pause (the other
    library's threads stop spinning), two untimed calls (after an idle spell the first calls of
    either library wait for a sleeping core: 4-8 ms on this shared virtual machine, whoever
    calls), then ``repeats`` timed calls back to back, as a training step makes them."""
    times = []
    for fn in fns:
        time.sleep(PAUSE)
        fn()
        fn()
        spent = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
        times.append(statistics.median(spent))
    return times


def _calls(d: ConvDescriptor, task: str, rng: np.random.Generator) -> list[Callable[[], object]]:
    """Callables of one gradient of ``d``: convgrad (NXC f32), PyTorch channels_last, PyTorch NCHW.
    PyTorch pads symmetrically: the smaller pad on both sides, the input longer by the difference."""
    import torch
    n, c, (kh, kw) = d.n, d.ic, d.kernel
    x, dy, w = (rng.standard_normal(s, dtype=np.float32) for s in ((n, *d.in_size, c), (n, *d.out_size, c),
                                                                    (kh, kw, 1, c)))
    op = cg.Op(TASKS[task], strides=list(d.strides), dilations=list(d.dilations), pads_begin=list(d.pads_begin),
               pads_end=list(d.pads_end), groups=d.groups, data_format="NXC", weights_format="XIO")
    fns = [(lambda: op(dy, w, np.array(x.shape, np.int32))) if task == "bwd_d" else
           (lambda: op(x, dy, np.array(w.shape, np.int32)))]
    in_size = [i + abs(e - b) for i, b, e in zip(d.in_size, d.pads_begin, d.pads_end)]
    pads = [min(b, e) for b, e in zip(d.pads_begin, d.pads_end)]
    mask = [task == "bwd_d", task == "bwd_w", False]
    for fmt in (torch.channels_last, torch.contiguous_format):
        tx, tdy, tw = (torch.randn(s).contiguous(memory_format=fmt)
                       for s in ((n, c, *in_size), (n, c, *d.out_size), (c, 1, kh, kw)))
        fns.append(lambda tx=tx, tdy=tdy, tw=tw: torch.ops.aten.convolution_backward(
            tdy, tx, tw, None, list(d.strides), pads, list(d.dilations), False, [0, 0], d.groups, mask))
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tasks", default="bwd_d,bwd_w")
    ap.add_argument("--layers", default="", help="comma-separated layer indices (default: all)")
    args = ap.parse_args()

    import numba
    import torch
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    lines = (HERE / "shapes" / "shapes_mobilenet_dw").read_text().splitlines()
    layers = [d.with_mb(args.mb) for _, d in parse_descriptor_file(lines) if isinstance(d, ConvDescriptor)]
    if args.layers:
        layers = [layers[int(i)] for i in args.layers.split(",")]
    rng = np.random.default_rng(0)
    print("| layer | task | convgrad GFLOP/s | PyTorch channels_last | PyTorch NCHW | ratio to the best |\n"
          "|---|---|---:|---:|---:|---:|")
    for d in layers:
        flop = 2 * d.n * d.oc * int(np.prod(d.out_size)) * int(np.prod(d.kernel))
        for task in args.tasks.split(","):
            ours, last, first = (flop / t / 1e9 for t in _median_seconds(_calls(d, task, rng), args.repeats))
            print(f"| {d.name.split(':')[-1]} | {task} | {ours:.1f} | {last:.1f} | {first:.1f} | "
                  f"{ours / max(last, first):.2f} |", flush=True)

if __name__ == "__main__":
    main()
