"""Sequence = sum of parts (issue 31): ResNet-50's gradient calls run back to back in backward
order against the sum of each call timed alone, in one process, convgrad's default engine.

    python benchmarks/sequence.py [--mb 16] [--dtype f32] [--rounds 5]

Alone: each call in its own block (a warm-up call, then ``--rounds`` timed calls, the median).
In sequence: the whole list (the layers of ``benchmarks/shapes/shapes_resnet_50`` from the last
to the first, each layer's data gradient then its weights gradient) run ``--rounds`` times after
a warm-up pass, the median pass. Prints both sums and their ratio (target: at most 1.05).
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


def _calls(mb: int, dtype: np.dtype) -> list[tuple[str, object]]:
    """(name, call) of every layer's data and weights gradient, last layer first."""
    rng = np.random.default_rng(0)
    out = []
    parsed = parse_descriptor_file((HERE / "shapes" / "shapes_resnet_50").read_text().splitlines())
    for d in reversed([d for _, d in parsed if isinstance(d, ConvDescriptor)]):
        g = d.with_mb(mb)
        x, dy = (rng.standard_normal(s).astype(dtype) for s in (g.x_shape, g.y_shape))
        w = rng.standard_normal(g.w_shape).astype(dtype)
        attrs = dict(strides=list(g.strides), pads_begin=list(g.pads_begin), pads_end=list(g.pads_end),
                     dilations=list(g.dilations), groups=g.groups)
        out.append((f"{d.name} bwd_d", lambda dy=dy, w=w, g=g, a=attrs:
                    cg.convolution_backward_data(dy, w, list(g.x_shape), **a)))
        out.append((f"{d.name} bwd_w", lambda x=x, dy=dy, g=g, a=attrs:
                    cg.convolution_backward_weights(x, dy, list(g.w_shape), **a)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    calls = _calls(args.mb, cg.dtypes.DATA_DTYPES[args.dtype])
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
    print(f"ResNet-50 mb {args.mb} {args.dtype}: {len(calls)} gradient calls; sum alone {total * 1e3:.0f} ms, "
          f"in sequence {seq * 1e3:.0f} ms, ratio {seq / total:.3f} (target <= 1.05)")


if __name__ == "__main__":
    sys.exit(main())
