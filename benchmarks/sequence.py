"""Sequence = sum of parts (issue 31): ResNet-50's gradient calls run back to back in backward
order against the sum of each call timed alone, in one process, convgrad's default engine.

    python benchmarks/sequence.py [--mb 16] [--dtype f32] [--rounds 5] [--format NXC] [--lib convgrad]
                                  [--suite resnet_50]

Alone: each call in its own block (a warm-up call, then ``--rounds`` timed calls, the median).
In sequence: the whole list (the layers of ``benchmarks/shapes/shapes_<suite>`` from the last
to the first, each layer's data gradient then its weights gradient) run ``--rounds`` times after
a warm-up pass, the median pass. Prints both sums and their ratio (target: at most 1.05). ``--format NCX`` runs channels-first
data (OIX weights; default NXC and XIO); ``--lib torch`` runs PyTorch's ``aten.convolution_backward`` on the same
calls (channels_last for NXC) with the same timing, the ratio a library pays in sequence
whatever its engine (the inputs of a call alone stay in the caches between its runs).
``--suite`` takes another list of ``benchmarks/shapes`` (``--mb 0``: each layer's own batch),
whose plans mix our kernels and NumPy's BLAS (1-D, dilated): what two thread pools cost there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import convgrad as cg
from convgrad.descriptor import ConvDescriptor, parse_descriptor_file

HERE = Path(__file__).parent


def _calls(mb: int, dtype: str, fmt: str, lib: str, suite: str = "resnet_50") -> list[tuple[str, object]]:
    """(name, call) of every layer's data and weights gradient, last layer first (``mb`` 0: the
    layer's own batch)."""
    rng = np.random.default_rng(0)
    out = []
    parsed = parse_descriptor_file((HERE / "shapes" / f"shapes_{suite}").read_text().splitlines())
    for d in reversed([d for _, d in parsed if isinstance(d, ConvDescriptor)]):
        g = d.with_mb(mb) if mb else d
        # NXC data, XIO weights (oneDNN Graph's defaults)
        x, dy, w = (rng.standard_normal(s).astype(np.float32) for s in (g.x_shape, g.y_shape, g.w_shape))
        if lib == "torch":
            out += _torch_calls(d.name, g, x, dy, w, dtype, fmt)
            continue
        attrs = dict(strides=list(g.strides), pads_begin=list(g.pads_begin), pads_end=list(g.pads_end),
                     dilations=list(g.dilations), groups=g.groups, data_format=fmt,
                     weights_format="XIO" if fmt == "NXC" else "OIX")
        if fmt == "NCX":   # channels first; weights (O, I, *K)
            x, dy, w = np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1), np.moveaxis(w, (-1, -2), (0, 1))
        x, dy, w = (np.ascontiguousarray(a).astype(cg.dtypes.DATA_DTYPES[dtype]) for a in (x, dy, w))
        out.append((f"{d.name} bwd_d", lambda dy=dy, w=w, a=attrs, s=x.shape:
                    cg.convolution_backward_data(dy, w, list(s), **a)))
        out.append((f"{d.name} bwd_w", lambda x=x, dy=dy, a=attrs, s=w.shape:
                    cg.convolution_backward_weights(x, dy, list(s), **a)))
    return out


def _torch_calls(name: str, g: ConvDescriptor, x: np.ndarray, dy: np.ndarray, w: np.ndarray, dtype: str,
                 fmt: str) -> list[tuple[str, object]]:
    """PyTorch's two gradient calls of layer ``g`` (NXC/XIO arrays in; channels_last for NXC)."""
    import torch
    memory = torch.channels_last if fmt == "NXC" else torch.contiguous_format
    x, dy, w = np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1), np.moveaxis(w, (-1, -2), (0, 1))
    tx, tdy, tw = (torch.from_numpy(np.ascontiguousarray(a)).to({"f32": torch.float32, "bf16": torch.bfloat16}[dtype])
                   .contiguous(memory_format=memory) for a in (x, dy, w))
    args = (list(g.strides), list(g.pads_begin), list(g.dilations), False, [0] * len(g.strides), g.groups)
    return [(f"{name} {task}", lambda mask=mask: torch.ops.aten.convolution_backward(tdy, tx, tw, None, *args, mask))
            for task, mask in (("bwd_d", [True, False, False]), ("bwd_w", [False, True, False]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--format", default="NXC", choices=["NXC", "NCX"])
    ap.add_argument("--lib", default="convgrad", choices=["convgrad", "torch"])
    ap.add_argument("--suite", default="resnet_50", choices=sorted(p.name.removeprefix("shapes_")
                                                                  for p in (HERE / "shapes").glob("shapes_*")))
    args = ap.parse_args()
    calls = _calls(args.mb, args.dtype, args.format, args.lib, args.suite)
    alone = []
    for _, call in calls:
        call()
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        alone.append(statistics.median(times))
    passes = []
    for round_ in range(args.rounds + 1):
        start = time.perf_counter()
        for _, call in calls:
            call()
        if round_:
            passes.append(time.perf_counter() - start)
    total, seq = sum(alone), statistics.median(passes)
    print(f"{args.suite} mb {args.mb or 'own'} {args.dtype} {args.format} {args.lib}: {len(calls)} gradient calls; "
          f"sum alone {total * 1e3:.0f} ms, "
          f"in sequence {seq * 1e3:.0f} ms, ratio {seq / total:.3f} (target <= 1.05)")


if __name__ == "__main__":
    sys.exit(main())
