"""The reference check in slabs (convgrad.graph.reference_check): every op and geometry against
PyTorch's float64 results, one row per slab and whole; a wrong value in any slab is found; the
memory the check needs is bounded and computed in constant time."""

from __future__ import annotations

import math
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import convgrad as cg
from convgrad.graph.reference_check import (SLAB_BYTES, _slabs, blocks, check_bytes, convolution_error,
                                            relative_error)
from convgrad.problem import ConvGeometry

from child_env import subprocess_env
from oracle import OPS, Case, Geometry, fresh_rng, random_tensors, torch_results

# (strides, dilations, kernel, pads_begin, pads_end): stride above the kernel (rows no output
# reads), pads above the kernel (windows wholly in the padding), dilation, asymmetric pads.
GEOMETRIES = [
    ((1, 1), (1, 1), (3, 3), (1, 1), (1, 1)),
    ((2, 1), (1, 1), (3, 2), (1, 0), (0, 1)),
    ((3, 2), (1, 1), (1, 2), (0, 1), (0, 0)),
    ((2, 2), (2, 1), (3, 3), (2, 1), (1, 2)),
    ((1, 2), (1, 1), (2, 3), (3, 0), (2, 1)),
]


def _case(kind: str, spec, data_format: str, groups: int, rng: np.random.Generator) -> tuple[Case, dict]:
    strides, dilations, kernel, pb, pe = spec
    in_size = (int(rng.integers(7, 11)), int(rng.integers(5, 8)))
    geom = Geometry(2, groups, 2, 3, in_size, kernel, strides, dilations, pb, pe)
    assert geom.valid, geom
    results = torch_results(geom, random_tensors(geom, rng))
    return Case(kind, geom, data_format, bias=True), results


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("spec", GEOMETRIES)
def test_slabs_give_pytorchs_result_and_find_a_wrong_value(kind, spec):
    rng, seed = fresh_rng()
    case, results = _case(kind, spec, str(rng.choice(["NCX", "NXC"])), int(rng.choice([1, 2])), rng)
    problem, arrays = cg.Op(kind, **case.attrs()).prepare(*case.inputs(results))
    right = case.expected(results)
    for slab_bytes in (1, SLAB_BYTES):  # one row of one image per slab; the whole problem at once
        assert convolution_error(problem, arrays, right, slab_size=slab_bytes) < 1e-13, (seed, slab_bytes)
    if problem.task != "backward_weights":
        assert len(list(_slabs(problem.geometry, problem.task, 1))) > 4, "the test must cut the problem into slabs"
    wrong = right.copy()
    index = tuple(int(rng.integers(size)) for size in wrong.shape)
    wrong[index] += 2 * np.max(np.abs(right))
    assert convolution_error(problem, arrays, wrong, slab_size=1) > 1.0, (seed, index)
    wrong[index] = np.nan
    assert math.isnan(convolution_error(problem, arrays, wrong, slab_size=1)), (seed, index)


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("rank", [1, 3])
def test_slabs_in_one_and_three_dimensions(kind, rank):
    rng, seed = fresh_rng()
    spec = [((2,), (1,), (3,), (1,), (2,)), ((2, 1, 1), (1, 2, 1), (3, 2, 2), (1, 1, 0), (2, 0, 1))][rank == 3]
    in_size = (9,) if rank == 1 else (7, 6, 5)
    geom = Geometry(2, 2, 2, 3, in_size, *spec)
    case = Case(kind, geom, str(rng.choice(["NCX", "NXC"])), bias=True)
    results = torch_results(geom, random_tensors(geom, rng))
    problem, arrays = cg.Op(kind, **case.attrs()).prepare(*case.inputs(results))
    right = case.expected(results)
    assert convolution_error(problem, arrays, right, slab_size=1) < 1e-13, seed
    wrong = right.copy()
    wrong[tuple(int(rng.integers(size)) for size in wrong.shape)] += 2 * np.max(np.abs(right))
    assert convolution_error(problem, arrays, wrong, slab_size=1) > 1.0, seed


def test_rows_no_output_reaches_must_be_zero():
    """Stride 3 with a 1-wide kernel: two input rows in three receive nothing; the backward data
    check wants 0 there (a slab of such rows has no sub-problem)."""
    rng, seed = fresh_rng()
    case, results = _case("ConvolutionBackwardData", GEOMETRIES[2], "NXC", 1, rng)
    problem, arrays = cg.Op(case.kind, **case.attrs()).prepare(*case.inputs(results))
    assert any(s.geometry is None for s in _slabs(problem.geometry, problem.task, 1))
    got = case.expected(results)
    assert convolution_error(problem, arrays, got, slab_size=1) < 1e-13
    got[0, 1, 0, 0] = 0.5 * np.max(np.abs(got))  # NXC: input row 1 is never read with stride 3
    assert convolution_error(problem, arrays, got, slab_size=1) == pytest.approx(0.5), seed


def test_the_check_needs_a_slab_not_the_problem():
    """A 853M-value depthwise layer (oneDNN's dw_offset_overflow): the check's own memory is about
    a slab; the estimate costs the same for 10^12 images (no work proportional to the sizes)."""
    g = ConvGeometry(1, 64, 64, 64, (4480, 2976), (4480, 2976), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    problem = cg.Op("Convolution", strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1],
                    groups=64, data_format="NXC", weights_format="XIO").infer((1, 4480, 2976, 64), (3, 3, 1, 64))
    assert problem.geometry == g
    assert SLAB_BYTES / 2 < check_bytes(problem) < 3 * SLAB_BYTES
    huge = cg.Op("ConvolutionBackwardWeights", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                 dilations=[1, 1], weights_shape=[8, 8, 3, 3], data_format="NCX",
                 weights_format="OIX").infer((10**12, 8, 30, 30), (10**12, 8, 28, 28))
    assert check_bytes(huge) < 3 * SLAB_BYTES


@pytest.mark.parametrize("kind", ["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights"])
def test_slabs_bound_the_checks_memory(kind):
    """Traced allocations of the check: slabs of 64 KiB stay near their size (plus the weights
    gradient's sum), where the whole problem at once takes several times the data."""
    rng, seed = fresh_rng()
    geom = Geometry(2, 1, 16, 16, (64, 48), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))
    case = Case(kind, geom, "NXC")
    results = torch_results(geom, random_tensors(geom, rng))
    problem, arrays = cg.Op(kind, **case.attrs()).prepare(*case.inputs(results, np.float32))
    got = case.expected(results).astype(np.float32)
    data = 4 * math.prod(geom.x_shape)  # 384 KiB

    def peak(slab_size: int) -> int:
        """The least of three traced peaks: tracemalloc counts every thread's allocations, and a
        thread an earlier test left running (a dask cluster's, a pool's) may allocate meanwhile
        (seen once in a fresh clone's `make test`: 1.03 MB where the check alone takes 0.3)."""
        peaks = []
        for _ in range(3):
            tracemalloc.start()
            assert convolution_error(problem, arrays, got, slab_size=slab_size) < 1e-6, seed
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        return min(peaks)

    small = peak(2**16)  # measured once for both bounds (each peak is three traced checks)
    assert small < data
    assert peak(2**30) > 5 * data
    assert 4 * check_bytes(problem, 2**16) > small


def test_error_meter_matches_the_whole_array_formula():
    rng, seed = fresh_rng()
    for _ in range(20):
        want = rng.standard_normal((3, 50, 7))
        got = want + rng.standard_normal(want.shape) * 1e-3
        if rng.random() < 0.5:
            want[tuple(rng.integers(s) for s in want.shape)] = rng.choice([np.nan, np.inf, -np.inf])
            got[tuple(rng.integers(s) for s in want.shape)] = rng.choice([np.nan, np.inf, 0.0])
        finite = np.isfinite(want)
        agree = np.where(finite, np.isfinite(got), (got == want) | (np.isnan(got) & np.isnan(want)))
        expected = (np.max(np.abs(got - want)[finite]) / np.max(np.abs(want[finite])) if agree.all() else math.nan)
        assert relative_error(got, want) == pytest.approx(expected, nan_ok=True), seed


@pytest.mark.parametrize("shape,limit", [((10, 9, 8), 100), ((3, 4), 5), ((7,), 3), ((2, 3, 4, 5), 7), ((0, 4), 2)])
def test_blocks_cover_every_value_once(shape, limit):
    seen = np.zeros(shape, dtype=int)
    for index in blocks(shape, limit):
        block = seen[index]
        assert block.size <= limit or block.ndim <= 1
        seen[index] += 1
    assert (seen == 1).all()


def test_a_case_over_the_old_reference_memory_passes_with_a_small_budget():
    """The whole-problem reference would need the padded input, the result and the taps in float64
    (~7x the f32 data); with a budget of about 4x the data (what the fast engine needs to run it),
    the slabbed check runs and passes."""
    line = "g8mb2ic64ih200iw160oc64oh200ow160kh3kw3ph1pw1"  # 2 x 15.6 MiB of f32 data in and out
    for direction in ("FWD_D", "BWD_D"):
        out = subprocess.run([sys.executable, "-m", "convgrad", "conv", "--engine=fast", f"--dir={direction}", line],
                             capture_output=True, text=True, timeout=300,
                             env=subprocess_env(CONVGRAD_MEMORY_BUDGET="120MiB"))
        assert out.returncode == 0 and "passed:1" in out.stdout, out.stdout + out.stderr
