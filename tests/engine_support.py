"""Helpers shared by the engine tests (no optional extras)."""

from __future__ import annotations

import os

import numpy as np

from convgrad.problem import ConvGeometry

#: Bytes the allocation-bound tests allow beyond an estimate under mutation testing only: mutmut's
#: trampolines (``make mutate``) allocate a few hundred bytes per call of their own (measured: at
#: most 782 bytes over in its stats run). Zero in every ordinary run.
MUTATION_SLACK = 2048 if "MUTANT_UNDER_TEST" in os.environ else 0


def geometry(n, groups, icg, ocg, in_size, kernel, strides=None, dilations=None, pb=None, pe=None) -> ConvGeometry:
    """The convolution of these sizes per group (strides and dilations 1, pads 0 by default),
    its output size computed."""
    rank = len(in_size)
    strides, dilations = strides or (1,) * rank, dilations or (1,) * rank
    pb, pe = pb or (0,) * rank, pe or (0,) * rank
    if min(strides) < 1 or min(dilations) < 1 or not len(strides) == len(dilations) == len(pb) == len(pe) == rank:
        raise ValueError(f"geometry(..., strides={strides}, dilations={dilations}, pb={pb}, pe={pe}): expected "
                         f"{rank} values each, strides and dilations >= 1 (the order: strides, dilations, pads)")
    out = tuple((i + b + e - (k - 1) * d - 1) // s + 1
                for i, b, e, k, d, s in zip(in_size, pb, pe, kernel, dilations, strides))
    return ConvGeometry(n, groups, groups * icg, groups * ocg, tuple(in_size), out, tuple(kernel), tuple(strides),
                        tuple(dilations), tuple(pb), tuple(pe))


def task_inputs(g: ConvGeometry, rng: np.random.Generator, dtype, channels_first: bool) -> dict[str, tuple]:
    """Fresh random non-zero canonical inputs of each task of ``g`` (magnitudes 0.5-1.5, random
    signs), data in NCX memory order with ``channels_first``."""
    x, w, dy = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in (g.x_shape, g.w_shape, g.y_shape))
    x, w, dy = (a.astype(dtype) for a in (x, w, dy))
    if channels_first:
        x, dy = (np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -1, 1)), 1, -1) for a in (x, dy))
    return {"forward": (x, w), "backward_data": (dy, w), "backward_weights": (x, dy)}
