"""Every op against PyTorch float64 autograd on a generated grid.

Full product over (op, data_format, weights format, rank, groups kind); stride/dilation/kernel
variants, auto_pad modes (same_* always with odd totals), API, bias, shape delivery and ignored
explicit pads are cycled through each (op, rank) block of 12 so that each auto_pad mode meets
every op and rank three times.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

import convgrad as cg
from convgrad.engines import default_engine_name

from oracle import (AUTO_PADS, GROUP_KINDS, OPS, WEIGHTS_FORMATS, Case, check, fresh_rng, make_geometry,
                    random_tensors, same_total, tensor_hash, torch_results)

VARIANTS = (  # (strides, dilations, kernel)
    ((1, 1, 1), (1, 1, 1), (3, 2, 3)),
    ((2, 3, 1), (1, 2, 1), (3, 3, 2)),
    ((3, 1, 2), (2, 1, 3), (2, 3, 2)),
)
PADS = ((1, 0, 2), (0, 2, 1))  # asymmetric


def grid() -> list[Case]:
    cases = []
    for kind, rank in itertools.product(OPS, (1, 2, 3)):
        block = itertools.product(("NCX", "NXC"), WEIGHTS_FORMATS[kind], GROUP_KINDS)
        for i, (data_format, wfmt, group_kind) in enumerate(block):
            auto_pad = AUTO_PADS[i % 4]
            strides, dilations, kernel = VARIANTS[i % 3]
            geom = make_geometry(kind, rank, group_kind, strides, dilations, kernel, PADS, auto_pad)
            given = None
            if auto_pad != "none":  # explicit pads must be ignored, or may be left out
                given = ((5,) * rank, (4,) * rank) if i % 2 else ()
            cases.append(Case(kind, geom, data_format, wfmt, auto_pad, bias=bool((i // 2) % 2),
                              shape_via=("input", "attr")[(i // 2) % 2], api=("op", "functional")[(i // 4) % 2],
                              given_pads=given))
    return cases


GRID = grid()


def case_id(case: Case) -> str:
    return (f"{case.kind}-{case.geom.rank}d-{case.data_format}-{case.wfmt}-g{case.geom.groups}x{case.geom.icg}-"
            f"{case.auto_pad}-{case.api}")


def test_grid_covers_every_auto_pad_with_odd_totals():
    seen = Counter((c.kind, c.geom.rank, c.auto_pad, c.api) for c in GRID)
    for kind, rank, mode in itertools.product(OPS, (1, 2, 3), AUTO_PADS):
        assert seen[kind, rank, mode, "op"] and seen[kind, rank, mode, "functional"], (kind, rank, mode)
    for c in GRID:
        g = c.geom
        if c.auto_pad.startswith("same"):
            totals = [same_total(c.kind, i, s, e) for i, s, e in zip(g.in_size, g.strides, g.eff)]
            assert all(t % 2 for t in totals), c
            assert [b + e for b, e in zip(g.pads_begin, g.pads_end)] == totals
        # N, the channels and the spatial sizes differ, so a transposed axis cannot go unnoticed
        assert len({g.n, g.ic, g.oc, *g.in_size}) == 3 + g.rank, c
    assert len({g.groups for g in (c.geom for c in GRID)}) == 3


@pytest.mark.parametrize("case", GRID, ids=case_id)
def test_op_matches_torch(case: Case):
    rng, seed = fresh_rng()
    results = torch_results(case.geom, random_tensors(case.geom, rng))
    inputs = case.inputs(results)
    before = [tensor_hash(a) for a in inputs]
    for engine in sorted({default_engine_name(), "reference"}):
        check(case, results, seed, engine=engine)
    assert [tensor_hash(a) for a in inputs] == before

    # shape inference alone gives the same output shape and the oracle's resolved pads
    shapes = [a if a.dtype.kind == "i" else tuple(a.shape) for a in inputs]
    problem = cg.Op(case.kind, **case.attrs()).infer(*shapes, dtype="f64")
    assert problem.output_shape == case.expected(results).shape
    assert (problem.pads_begin, problem.pads_end) == (case.geom.pads_begin, case.geom.pads_end), seed
    assert problem.output_dtype == results["x"].dtype
