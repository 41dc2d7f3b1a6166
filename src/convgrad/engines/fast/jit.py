"""The ``jit`` strategy: implicit-GEMM convolutions on our own micro-kernels (:mod:`.microkernel`).

The oneDNN way, on channels-last (NXC) data seen as 3-D spatial (missing axes of size 1), f32
accumulation (bf16/f16 data widened to f32 in the copies below), ``W`` = the family's vector
width, per group ``g``:

- forward: ``y[n, o, oc] = sum_{k, ic} xp[n, o*S + k*D, ic] * w[k, ic, oc]`` with ``xp`` the
  zero-padded copy of x. A register block is ``R`` consecutive outputs along the last spatial
  axis x ``V`` vectors of ``W`` output channels (weights packed as ``(G, OC blocks, K, ICg, V*W)``,
  zero past OCg); its reduction loops over the taps ``k`` (outer) and the input channels ``ic``
  (inner), reading ``xp`` where it lies (never an im2col buffer).
- backward data: split dx into the ``prod(S)`` stride phases ``i = q*S + r``; phase ``r`` is a
  stride-1 convolution of the padded dy with the taps whose ``(r + PB - k*D)`` is a multiple of
  ``S`` (offsets ``c_k = (r + PB - k*D) / S``) and the transposed weights ``w[k]^T`` (oneDNN's
  skipping of non-dividing taps, per phase); a phase without taps is written as zeros.
- backward weights: ``dw[k, ic, oc] = sum_{n, o} xp[n, o*S + k*D, ic] * dy[n, o, oc]``: blocks of
  ``R`` input channels (broadcast) x ``V`` vectors of output channels, the reduction over the
  positions of a chunk of output rows (about the plan's ``cache_bytes`` of x and dy), every tap and
  channel block run per chunk; each thread sums its share of the rows into its own partial dw,
  then the partials are added (or, with the plan's ``split`` "blocks", each thread owns a share of
  dw's blocks over all positions).

Threads: numba ``prange`` over (image, output row, group, channel block) items (forward, data)
or over shares of the output rows or of dw's blocks (weights). The source copies carry a zeroed tail so that
the rows of a block past the end of an output row read in bounds (their results are dropped).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numba
import numpy as np

from ...problem import ConvGeometry
from . import geometry, isa, microkernel
from .features import Features
from .geometry import padded, phase_taps, spatial, tap_weights
from .tuning import TUNING

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["applies", "complete", "options", "run", "workspace_bytes", "forward", "backward_data",
           "backward_weights"]

F32 = np.dtype(np.float32)
#: Plan parameters: ``block`` the register block "RxV" (:data:`.microkernel.BLOCKS`),
#: ``cache_bytes`` (see :class:`.tuning.Tuning`), and for the weights gradient ``split``: the
#: threads share the output positions ("rows") or dw's blocks ("blocks").
SPLITS = ("rows", "blocks")


def applies(f: Features, plan: Plan | None = None) -> bool:
    """Whether the jit kernels can run ``f`` (with ``plan``): an f32-accumulating problem
    (f32/bf16/f16 data), not depthwise, on a host family with JIT kernels (not ``portable``)."""
    if not (f.acc == F32 and isa.family() in isa.WIDTH and not f.depthwise and f.n > 0):
        return False
    return plan is None or (_block_index(plan.param("block")) is not None and plan.param("split") in SPLITS
                            and isinstance(plan.param("cache_bytes"), int) and plan.param("cache_bytes") > 0)


def _block_index(name: object) -> int | None:
    names = [f"{r}x{v}" for r, v in microkernel.BLOCKS]
    return names.index(name) if name in names else None


def complete(f: Features, params: dict) -> dict:
    """``params`` with the missing ones defaulted for ``f``: the block with the fewest idle lanes
    over the vectorised channels (:func:`.microkernel.block_for`), ``TUNING.cache_bytes``, and the
    weights gradient's split by dw's size next to x and dy (``TUNING.weights_split``)."""
    g = f.geometry
    rows, vecs = microkernel.BLOCKS[microkernel.block_for(g.icg if f.task == "backward_data" else g.ocg, _width())]
    by_blocks = math.prod(g.w_shape) > TUNING.weights_split * (math.prod(g.x_shape) + math.prod(g.y_shape))
    return {"block": f"{rows}x{vecs}", "cache_bytes": TUNING.cache_bytes,
            "split": "blocks" if f.task == "backward_weights" and by_blocks else "rows", **params}


def options(f: Features) -> list[dict]:
    """Parameter sets worth timing: each register block (and for the weights gradient, each split)."""
    splits = SPLITS if f.task == "backward_weights" else ("rows",)
    return [{"block": f"{r}x{v}", "split": s} for r, v in microkernel.BLOCKS for s in splits]


def _plan(g: ConvGeometry, task: str, plan: Plan | None) -> Plan:
    """``plan``, or the default plan of f32 NXC data for ``task`` on ``g``."""
    from .plan import Plan
    if plan is not None:
        return plan
    f = Features.of(g, task, F32, False)
    return Plan.of("jit", **complete(f, {}))


def run(plan: Plan, g: ConvGeometry, a: np.ndarray, b: np.ndarray, task: str) -> np.ndarray:
    """``task`` on its two canonical inputs, f32 result."""
    return {"forward": forward, "backward_data": backward_data, "backward_weights": backward_weights}[task](
        g, a, b, plan)


def _block(g: ConvGeometry, plan: Plan) -> tuple[int, int, int]:
    """(block index, rows R, lanes V*W) of ``plan``'s register block."""
    block = _block_index(plan.param("block"))
    rows, vecs = microkernel.BLOCKS[block]
    return block, rows, vecs * _width()


def workspace_bytes(f: Features, plan: Plan) -> int:
    """Upper estimate of the extra bytes ``task`` allocates (f32 values; for bf16/f16 ``dtype``
    the f32 result the API rounds included): the padded copy of x (forward, weights) or dy (data)
    with its slack, the packed weights (forward, data), or for the weights gradient the packed dy,
    the partial sums of every share (at most the threads) and their total; plus 64 KiB of tables and
    per-thread accumulator blocks."""
    g, task = f.geometry, f.task
    _, rows, vw = _block(g, plan)
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    taps, o = math.prod(g.kernel), spatial(g.out_size, 1)
    if task == "backward_data":
        sizes = [max(o[a], -(-spatial(g.in_size, 1)[a] // s[a])) + 2 * ((kernel[a] - 1) * d[a] // s[a] + 1)
                 + spatial(g.pads_begin, 0)[a] + 1 for a in range(3)]
        source = g.n * math.prod(sizes) * g.oc + rows * (g.oc + 1) + 64
        other = g.groups * taps * g.ocg * -(-g.icg // vw) * vw
    else:
        source = g.n * math.prod(g.padded_size) * g.ic + rows * (s[2] * g.ic + 2) + 64
        other = g.groups * taps * g.icg * -(-g.ocg // vw) * vw
        if task == "backward_weights":
            block = g.groups * taps * -(-g.icg // rows) * rows * -(-g.ocg // vw) * vw
            shares = 1 if plan.param("split") == "blocks" else numba.get_num_threads()
            other = g.n * math.prod(o) * g.groups * -(-g.ocg // vw) * vw + (shares + 1) * block
    result = 0 if f.data_dtype == F32 else math.prod({"forward": g.y_shape, "backward_data": g.x_shape,
                                               "backward_weights": g.w_shape}[task])
    return 4 * (source + other + result) + (64 << 10)


def _width() -> int:
    return isa.WIDTH[isa.family()]


def _tail(block: int, row: int) -> int:
    """Zeroed slack after a flat source: the rows of a last block past its output row."""
    return microkernel.BLOCKS[block][0] * (row + 1) + 64


@numba.njit(parallel=True, cache=True)
def _outputs(width, block, src, steps, taps_a, out, out_base, out_steps, out_grid, pitch, valid, wp, per_block,
             taps_b, groups, kred, channels, blocks_outer):  # pragma: no cover - compiled
    """``out[out_base + n*os0 + q0*os1 + (m // pitch)*os2 + (m % pitch)*os3 + g*channels + j] =
    sum over taps t and i < kred of src[n*s0 + q0*s1 + q1*s2 + m*s3 + ta[t] + g*kred + i] *
    wp[(g*NB + nb)*per_block + tb[t] + i*VW + j]`` over the grid ``out_grid`` = (N, Q0, Q1, M),
    for ``m % pitch < valid`` (``pitch`` > ``valid``: rows of a source flattened with their padding
    columns, computed and dropped). Items (n, q0, q1, g, nb) run in parallel, channel blocks
    innermost, or outermost with ``blocks_outer`` (each block's weights then stay in cache while
    the rows stream by). Forward and each backward-data phase."""
    rows, vecs = microkernel.BLOCKS_ARRAY[block, 0], microkernel.BLOCKS_ARRAY[block, 1]
    vw = vecs * width
    nblocks = -(-channels // vw)
    n_, q0_, q1_, m_ = out_grid[0], out_grid[1], out_grid[2], out_grid[3]
    ntaps = taps_a.shape[0]
    places = n_ * q0_ * q1_
    for item in numba.prange(places * groups * nblocks):
        if blocks_outer:
            place = item % places
            nb = item // places % nblocks
            g = item // (places * nblocks)
        else:
            nb = item % nblocks
            g = item // nblocks % groups
            place = item // (nblocks * groups)
        q1 = place % q1_
        q0 = place // q1_ % q0_
        n = place // (q1_ * q0_)
        c = np.empty(rows * vw, np.float32)
        lanes = min(vw, channels - nb * vw)
        boff = (g * nblocks + nb) * per_block
        src_row = n * steps[0] + q0 * steps[1] + q1 * steps[2] + g * kred
        base = out_base + n * out_steps[0] + q0 * out_steps[1] + q1 * out_steps[2] + g * channels + nb * vw
        for m in range(0, m_, rows):
            c[:] = 0
            microkernel.run(width, block, c, 0, vw, src, src_row + m * steps[3], steps[3], 1, wp, boff, vw,
                            taps_a, taps_b, ntaps, kred)
            for r in range(min(rows, m_ - m)):
                a1 = (m + r) // pitch
                a2 = m + r - a1 * pitch
                if a2 < valid:
                    at = base + a1 * out_steps[2] + a2 * out_steps[3]
                    for j in range(lanes):
                        out[at + j] = c[r * vw + j]


def _run_outputs(block: int, src: np.ndarray, steps: np.ndarray, taps_a: np.ndarray, out: np.ndarray,
                 out_base: int, out_steps: np.ndarray, grid: tuple[int, ...], wp: np.ndarray, taps: int,
                 taps_b: np.ndarray, groups: int, kred: int, channels: int, cache_bytes: int) -> None:
    """:func:`_outputs` on ``src`` (a padded array of :func:`.geometry.padded`) for the output ``grid``
    (N, Q0, Q1, Q2): the last two axes flattened into rows of the source's width where the source
    steps by one position along both and that computes fewer junk positions than blocks cut at
    every output row; the channel blocks outermost where the packed weights exceed
    ``cache_bytes``."""
    rows, vw = microkernel.BLOCKS[block][0], microkernel.BLOCKS[block][1] * _width()
    n, q0, q1, q2 = grid
    pitch = src.shape[3]
    cut = q1 * -(-q2 // rows) * rows
    flat = (q1 - 1) * pitch + q2
    if steps[2] == pitch * steps[3] and steps[3] == src.shape[4] and -(-flat // rows) * rows < cut:
        shape, pitch = (n, q0, 1, flat), pitch
    else:
        shape, pitch = (n, q0, q1, q2), q2
    _outputs(_width(), block, geometry.flat(src), steps, taps_a, out.reshape(-1), out_base, out_steps,
             np.array(shape, np.int64), pitch, q2, wp, taps * kred * vw, taps_b, groups, kred, channels,
             wp.nbytes > cache_bytes)


def _packed_weights(g: ConvGeometry, w: np.ndarray, vw: int, transpose: bool) -> np.ndarray:
    """Canonical (*K, ICg, OC) weights as f32 ``(G, blocks, T, red, vw)``: red = ICg and blocks
    of OCg (forward), or with ``transpose`` red = OCg and blocks of ICg; zero past the channels."""
    t = math.prod(g.kernel)
    taps = tap_weights(g, w, transpose).transpose(1, 0, 2, 3)  # (G, T, red, width)
    red, width = taps.shape[2:]
    blocks = -(-width // vw)
    out = np.zeros((g.groups, t, red, blocks * vw), F32)
    out[..., :width] = taps
    return np.ascontiguousarray(out.reshape(g.groups, t, red, blocks, vw).transpose(0, 3, 1, 2, 4))


def _strides(shape: tuple[int, ...]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape``."""
    return np.array([math.prod(shape[j + 1:]) for j in range(len(shape))], np.int64)


def forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray, plan: Plan | None = None) -> np.ndarray:
    """y (N, *O, OC) in f32 (see the module docstring), by ``plan`` (default: :func:`complete`'s)."""
    plan = _plan(g, "forward", plan)
    block, _, vw = _block(g, plan)
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    size = spatial(g.padded_size, 1)
    row = s[2] * g.ic
    xp = padded(x, spatial(g.pads_begin, 0), size, F32, _tail(block, row))
    xs = _strides(xp.shape)
    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3]
                       for k0 in range(kernel[0]) for k1 in range(kernel[1]) for k2 in range(kernel[2])], np.int64)
    taps_b = np.arange(len(taps_a), dtype=np.int64) * g.icg * vw
    y = np.empty(g.y_shape, F32)
    o = spatial(g.out_size, 1)
    _run_outputs(block, xp, np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64), taps_a,
                 y, 0, _strides((g.n, *o, g.oc))[:4], (g.n, *o), _packed_weights(g, w, vw, False).reshape(-1),
                 len(taps_a), taps_b, g.groups, g.icg, g.ocg, plan.param("cache_bytes"))
    return y


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray, plan: Plan | None = None) -> np.ndarray:
    """dx (N, *I, IC) in f32: one stride-1 convolution of padded dy per stride phase."""
    plan = _plan(g, "backward_data", plan)
    block, _, vw = _block(g, plan)
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    pb, i_size, o_size = spatial(g.pads_begin, 0), spatial(g.in_size, 1), spatial(g.out_size, 1)
    phases = [[phase_taps(r, kernel[a], s[a], d[a], pb[a]) for r in range(min(s[a], i_size[a]))] for a in range(3)]
    offsets = [[c for taps in axis for _, c in taps] or [0] for axis in phases]
    counts = [-(-i_size[a] // s[a]) for a in range(3)]           # the most q of any phase
    lo = [max(0, -min(offsets[a])) for a in range(3)]
    size = tuple(lo[a] + max(o_size[a], counts[a] + max(offsets[a])) for a in range(3))
    dyp = padded(dy, tuple(lo), size, F32, _tail(block, g.oc))
    ds = _strides(dyp.shape)
    wp = _packed_weights(g, w, vw, True).reshape(-1)
    dx = np.empty(g.x_shape, F32)
    xs = _strides((g.n, *i_size, g.ic))
    steps = np.array(ds[:4], np.int64)
    for r0, t0 in enumerate(phases[0]):
        for r1, t1 in enumerate(phases[1]):
            for r2, t2 in enumerate(phases[2]):
                grid = (g.n, *(-(-(i_size[a] - r) // s[a]) for a, r in enumerate((r0, r1, r2))))
                taps = [(a, b, c) for a in t0 for b in t1 for c in t2]
                taps_a = np.array([sum((tap[a][1] + lo[a]) * ds[a + 1] for a in range(3)) for tap in taps], np.int64)
                taps_b = np.array([((a[0] * kernel[1] + b[0]) * kernel[2] + c[0]) * g.ocg * vw for a, b, c in taps],
                                  np.int64)
                base = r0 * xs[1] + r1 * xs[2] + r2 * xs[3]
                out_steps = np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64)
                _run_outputs(block, dyp, steps, taps_a, dx, base, out_steps, grid, wp, math.prod(kernel), taps_b,
                             g.groups, g.ocg, g.icg, plan.param("cache_bytes"))
    return dx


@numba.njit(parallel=True, cache=True)
def _weights(width, block, xp, x_steps, taps_a, dyp, dy_row, rows_grid, chunk, parts, shares, split,
             groups, icg, channels):  # pragma: no cover - compiled
    """``parts[p, t, g, ic, oc] += sum_(n, o) xp[n, o*S + tap t, g*icg + ic] * dyp[(n, o), g, oc]``
    over the output rows (n, o0, o1) of ``rows_grid`` = (N, O0, O1, O2), in parallel items
    (p, u): ``shares`` equal shares p of the rows (each with its own partial sums ``parts[p]``),
    each share's (tap, group, channel-row block) triples cut into ``split`` parts u. The rows are
    taken ``chunk`` at a time, every triple and output-channel block of the item run per chunk."""
    rows, vecs = microkernel.BLOCKS_ARRAY[block, 0], microkernel.BLOCKS_ARRAY[block, 1]
    vw = vecs * width
    nblocks = -(-channels // vw)
    row_blocks = -(-icg // rows)
    n_, o0_, o1_, o2_ = rows_grid[0], rows_grid[1], rows_grid[2], rows_grid[3]
    total = n_ * o0_ * o1_
    triples = taps_a.shape[0] * groups * row_blocks
    ldc = nblocks * vw
    for item in numba.prange(shares * split):
        p, u = item // split, item % split
        first, last = total * p // shares, total * (p + 1) // shares
        ra = np.empty(chunk, np.int64)
        rb = np.empty(chunk, np.int64)
        for start in range(first, last, chunk):
            count = min(chunk, last - start)
            for j in range(count):
                row = start + j
                o1 = row % o1_
                o0 = (row // o1_) % o0_
                n = row // (o1_ * o0_)
                ra[j] = n * x_steps[0] + o0 * x_steps[1] + o1 * x_steps[2]
                rb[j] = row * o2_ * dy_row
            for triple in range(triples * u // split, triples * (u + 1) // split):
                ib = triple % row_blocks
                g = triple // row_blocks % groups
                t = triple // (row_blocks * groups)
                coff = (p * triples + triple) * rows * ldc
                for nb in range(nblocks):
                    microkernel.run(width, block, parts, coff + nb * vw, ldc, xp, taps_a[t] + g * icg + ib * rows,
                                    1, x_steps[3], dyp, g * ldc + nb * vw, dy_row, ra, rb, count, o2_)


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, plan: Plan | None = None) -> np.ndarray:
    """dw (*K, ICg, OC) in f32: the reduction over output positions split among the threads
    (partial sums per thread, then added; ``split`` "rows") or the dw blocks split among them
    (every thread over all positions; "blocks")."""
    plan = _plan(g, "backward_weights", plan)
    width = _width()
    block, rows, vw = _block(g, plan)
    s, d, kernel = spatial(g.strides, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    size, o = spatial(g.padded_size, 1), spatial(g.out_size, 1)
    xp = padded(x, spatial(g.pads_begin, 0), size, F32, _tail(block, s[2] * g.ic) + rows)
    xs = _strides(xp.shape)
    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3]
                       for k0 in range(kernel[0]) for k1 in range(kernel[1]) for k2 in range(kernel[2])], np.int64)
    nblocks = -(-g.ocg // vw)
    dyp = np.zeros((*dy.shape[:-1], g.groups, nblocks * vw), F32)
    dyp[..., :g.ocg] = dy.reshape(*dy.shape[:-1], g.groups, g.ocg)  # a view, whatever dy's memory order
    row_blocks = -(-g.icg // rows)
    threads, rows_total = numba.get_num_threads(), g.n * o[0] * o[1]
    shares, split = (1, threads) if plan.param("split") == "blocks" else (min(threads, rows_total), 1)
    chunk = max(1, plan.param("cache_bytes") // (4 * o[2] * (g.ic + g.oc)))
    parts = np.zeros((shares, len(taps_a), g.groups, row_blocks * rows, nblocks * vw), F32)
    _weights(width, block, geometry.flat(xp), np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64), taps_a,
             dyp.reshape(-1), g.groups * nblocks * vw, np.array((g.n, *o), np.int64), min(chunk, rows_total),
             parts.reshape(-1), shares, split, g.groups, g.icg, g.ocg)
    total = parts.sum(axis=0) if shares > 1 else parts[0]
    return np.ascontiguousarray(total[:, :, :g.icg, :g.ocg].transpose(0, 2, 1, 3)).reshape(g.w_shape)
