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
  positions of a chunk of output rows (``TUNING.weights_positions``, cache-sized), every tap and
  channel block run per chunk; each thread sums its share of the rows into its own partial dw,
  then the partials are added.

Threads: numba ``prange`` over (image, output row, group, channel block) items (forward, data)
or over equal shares of the output rows (weights). The source copies carry a zeroed tail so that
the rows of a block past the end of an output row read in bounds (their results are dropped).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ...problem import ConvGeometry
from . import isa, microkernel
from .tuning import TUNING
from .direct import spatial3

__all__ = ["applies", "workspace_bytes", "forward", "backward_data", "backward_weights"]

F32 = np.dtype(np.float32)


def applies(g: ConvGeometry, acc: np.dtype) -> bool:
    """Whether the jit kernels can run ``g``: an f32-accumulating problem (f32/bf16/f16 data),
    not depthwise, on a host family with JIT kernels (``isa.family() != "portable"``)."""
    return acc == F32 and isa.family() in isa.WIDTH and not (g.icg == 1 and g.ocg == 1) and g.n > 0


def _width() -> int:
    return isa.WIDTH[isa.family()]


def _spatial(t: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(t)) + tuple(t)


def _tail(block: int, row: int) -> int:
    """Zeroed slack after a flat source: the rows of a last block past its output row."""
    return microkernel.BLOCKS[block][0] * (row + 1) + 64


def _padded(a: np.ndarray, lo: tuple[int, ...], size: tuple[int, ...], slack: int) -> np.ndarray:
    """Canonical (N, *X, C) data as a zeroed f32 (N, P0, P1, P2, C) array (``size`` = P) with
    ``a`` at offsets ``lo``, on a flat buffer with ``slack`` zeroed values after it."""
    a3 = spatial3(a)
    shape = (a3.shape[0], *size, a3.shape[-1])
    flat = np.zeros(math.prod(shape) + slack, F32)
    out = flat[:math.prod(shape)].reshape(shape)
    out[(slice(None), *(slice(b, b + n) for b, n in zip(lo, a3.shape[1:4])), slice(None))] = a3
    return out


def _flat(a: np.ndarray) -> np.ndarray:
    """The flat buffer under an array made by :func:`_padded` (its slack included)."""
    return a.base if a.base is not None and a.base.ndim == 1 else a.reshape(-1)


@numba.njit(parallel=True, cache=True)
def _outputs(width, block, src, steps, taps_a, out, out_base, out_steps, out_grid, wp, per_block, taps_b,
             groups, kred, channels):  # pragma: no cover - compiled
    """``out[out_base + n*os0 + q0*os1 + q1*os2 + q2*os3 + g*channels + j] = sum over taps t
    and i < kred of src[n*s0 + q0*s1 + q1*s2 + q2*s3 + ta[t] + g*kred + i] * wp[g, nb, tb[t] + i*VW + j]``
    for the grid ``out_grid`` = (N, Q0, Q1, Q2) (``wp`` holds ``per_block`` values per group and
    channel block): forward and each backward-data phase."""
    rows, vecs = microkernel.BLOCKS_ARRAY[block, 0], microkernel.BLOCKS_ARRAY[block, 1]
    vw = vecs * width
    nblocks = -(-channels // vw)
    n_, q0_, q1_, q2_ = out_grid[0], out_grid[1], out_grid[2], out_grid[3]
    ntaps = taps_a.shape[0]
    items = n_ * q0_ * q1_ * groups * nblocks
    for item in numba.prange(items):
        nb = item % nblocks
        rest = item // nblocks
        g = rest % groups
        rest //= groups
        q1 = rest % q1_
        rest //= q1_
        q0 = rest % q0_
        n = rest // q0_
        c = np.empty(rows * vw, np.float32)
        lanes = min(vw, channels - nb * vw)
        boff = (g * nblocks + nb) * per_block
        for q2 in range(0, q2_, rows):
            c[:] = 0
            aoff = n * steps[0] + q0 * steps[1] + q1 * steps[2] + q2 * steps[3] + g * kred
            microkernel.run(width, block, c, 0, vw, src, aoff, steps[3], 1, wp, boff, vw, taps_a, taps_b,
                            ntaps, kred)
            base = out_base + n * out_steps[0] + q0 * out_steps[1] + q1 * out_steps[2] + g * channels + nb * vw
            for r in range(min(rows, q2_ - q2)):
                at = base + (q2 + r) * out_steps[3]
                for j in range(lanes):
                    out[at + j] = c[r * vw + j]


def _packed_weights(g: ConvGeometry, w: np.ndarray, vw: int, transpose: bool) -> np.ndarray:
    """Canonical (*K, ICg, OC) weights as f32 ``(G, blocks, T, red, vw)``: red = ICg and blocks
    of OCg (forward), or with ``transpose`` red = OCg and blocks of ICg; zero past the channels."""
    t = math.prod(g.kernel)
    taps = w.reshape(t, g.icg, g.groups, g.ocg).transpose(2, 0, 1, 3)  # (G, T, ICg, OCg)
    if transpose:
        taps = taps.transpose(0, 1, 3, 2)
    red, width = taps.shape[2:]
    blocks = -(-width // vw)
    out = np.zeros((g.groups, t, red, blocks * vw), F32)
    out[..., :width] = taps
    return np.ascontiguousarray(out.reshape(g.groups, t, red, blocks, vw).transpose(0, 3, 1, 2, 4))


def _strides(shape: tuple[int, ...]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape``."""
    return np.array([math.prod(shape[j + 1:]) for j in range(len(shape))], np.int64)


def forward(g: ConvGeometry, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y (N, *O, OC) in f32 (see the module docstring)."""
    width = _width()
    block = microkernel.block_for(g.ocg, width)
    vw = microkernel.BLOCKS[block][1] * width
    s, d, kernel = _spatial(g.strides, 1), _spatial(g.dilations, 1), _spatial(g.kernel, 1)
    size = _spatial(g.padded_size, 1)
    row = s[2] * g.ic
    xp = _padded(x, _spatial(g.pads_begin, 0), size, _tail(block, row))
    xs = _strides(xp.shape)
    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3]
                       for k0 in range(kernel[0]) for k1 in range(kernel[1]) for k2 in range(kernel[2])], np.int64)
    taps_b = np.arange(len(taps_a), dtype=np.int64) * g.icg * vw
    y = np.empty(g.y_shape, F32)
    o = _spatial(g.out_size, 1)
    _outputs(width, block, _flat(xp), np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64), taps_a,
             y.reshape(-1), 0, _strides((g.n, *o, g.oc))[:4], np.array((g.n, *o), np.int64),
             _packed_weights(g, w, vw, False).reshape(-1), len(taps_a) * g.icg * vw, taps_b, g.groups, g.icg, g.ocg)
    return y


def _phase_taps(r: int, k: int, s: int, d: int, pb: int) -> list[tuple[int, int]]:
    """(tap, offset c_k) of the taps of phase ``r`` on one axis: (r + PB - k*D) divisible by S."""
    return [(j, (r + pb - j * d) // s) for j in range(k) if (r + pb - j * d) % s == 0]


def backward_data(g: ConvGeometry, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dx (N, *I, IC) in f32: one stride-1 convolution of padded dy per stride phase."""
    width = _width()
    block = microkernel.block_for(g.icg, width)
    vw = microkernel.BLOCKS[block][1] * width
    s, d, kernel = _spatial(g.strides, 1), _spatial(g.dilations, 1), _spatial(g.kernel, 1)
    pb, i_size, o_size = _spatial(g.pads_begin, 0), _spatial(g.in_size, 1), _spatial(g.out_size, 1)
    phases = [[_phase_taps(r, kernel[a], s[a], d[a], pb[a]) for r in range(min(s[a], i_size[a]))] for a in range(3)]
    offsets = [[c for taps in axis for _, c in taps] or [0] for axis in phases]
    counts = [-(-i_size[a] // s[a]) for a in range(3)]           # the most q of any phase
    lo = [max(0, -min(offsets[a])) for a in range(3)]
    size = tuple(lo[a] + max(o_size[a], counts[a] + max(offsets[a])) for a in range(3))
    dyp = _padded(dy, tuple(lo), size, _tail(block, g.oc))
    ds = _strides(dyp.shape)
    wp = _packed_weights(g, w, vw, True).reshape(-1)
    dx = np.empty(g.x_shape, F32)
    xs = _strides((g.n, *i_size, g.ic))
    steps = np.array(ds[:4], np.int64)
    for r0, t0 in enumerate(phases[0]):
        for r1, t1 in enumerate(phases[1]):
            for r2, t2 in enumerate(phases[2]):
                grid = np.array([g.n] + [-(-(i_size[a] - r) // s[a]) for a, r in enumerate((r0, r1, r2))], np.int64)
                taps = [(a, b, c) for a in t0 for b in t1 for c in t2]
                taps_a = np.array([sum((tap[a][1] + lo[a]) * ds[a + 1] for a in range(3)) for tap in taps], np.int64)
                taps_b = np.array([((a[0] * kernel[1] + b[0]) * kernel[2] + c[0]) * g.ocg * vw for a, b, c in taps],
                                  np.int64)
                base = r0 * xs[1] + r1 * xs[2] + r2 * xs[3]
                out_steps = np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64)
                _outputs(width, block, _flat(dyp), steps, taps_a, dx.reshape(-1), base, out_steps, grid,
                         wp, math.prod(kernel) * g.ocg * vw, taps_b, g.groups, g.ocg, g.icg)
    return dx


@numba.njit(parallel=True, cache=True)
def _weights(width, block, xp, x_steps, taps_a, dyp, dy_row, rows_grid, chunk, parts, shares, groups, icg,
             channels):  # pragma: no cover - compiled
    """Per share p < ``shares`` (one per thread) of the output rows (n, o0, o1) of ``rows_grid`` = (N, O0, O1, O2):
    ``parts[p, t, g, ic, oc] += sum_(n, o) xp[... + ta[t] + g*icg + ic] * dyp[(n, o), g, oc]``,
    the positions taken ``chunk`` rows at a time (all taps and blocks per chunk, in cache)."""
    rows, vecs = microkernel.BLOCKS_ARRAY[block, 0], microkernel.BLOCKS_ARRAY[block, 1]
    vw = vecs * width
    nblocks = -(-channels // vw)
    row_blocks = -(-icg // rows)
    n_, o0_, o1_, o2_ = rows_grid[0], rows_grid[1], rows_grid[2], rows_grid[3]
    total = n_ * o0_ * o1_
    ntaps = taps_a.shape[0]
    ldc = nblocks * vw
    per_tap = groups * row_blocks * rows * ldc
    for p in numba.prange(shares):
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
            for t in range(ntaps):
                for g in range(groups):
                    for ib in range(row_blocks):
                        for nb in range(nblocks):
                            coff = p * ntaps * per_tap + t * per_tap + (g * row_blocks + ib) * rows * ldc + nb * vw
                            microkernel.run(width, block, parts, coff, ldc, xp, taps_a[t] + g * icg + ib * rows, 1,
                                            x_steps[3], dyp, g * ldc + nb * vw, dy_row, ra, rb, count, o2_)


def backward_weights(g: ConvGeometry, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dw (*K, ICg, OC) in f32: per-thread partial sums over shares of the output rows."""
    width = _width()
    block = microkernel.block_for(g.ocg, width)
    rows, vw = microkernel.BLOCKS[block][0], microkernel.BLOCKS[block][1] * width
    s, d, kernel = _spatial(g.strides, 1), _spatial(g.dilations, 1), _spatial(g.kernel, 1)
    size, o = _spatial(g.padded_size, 1), _spatial(g.out_size, 1)
    xp = _padded(x, _spatial(g.pads_begin, 0), size, _tail(block, s[2] * g.ic) + rows)
    xs = _strides(xp.shape)
    taps_a = np.array([k0 * d[0] * xs[1] + k1 * d[1] * xs[2] + k2 * d[2] * xs[3]
                       for k0 in range(kernel[0]) for k1 in range(kernel[1]) for k2 in range(kernel[2])], np.int64)
    nblocks = -(-g.ocg // vw)
    dyp = np.zeros((g.n * math.prod(o), g.groups, nblocks * vw), F32)
    dyp[..., :g.ocg] = dy.reshape(-1, g.groups, g.ocg)
    row_blocks = -(-g.icg // rows)
    shares = numba.get_num_threads()
    parts = np.zeros((shares, len(taps_a), g.groups, row_blocks * rows, nblocks * vw), F32)
    chunk = max(1, TUNING.weights_positions // o[2])
    _weights(width, block, _flat(xp), np.array([xs[0], s[0] * xs[1], s[1] * xs[2], s[2] * xs[3]], np.int64), taps_a,
             dyp.reshape(-1), g.groups * nblocks * vw, np.array((g.n, *o), np.int64), chunk, parts.reshape(-1),
             shares, g.groups, g.icg, g.ocg)
    total = parts.sum(axis=0)[:, :, :g.icg, :g.ocg]                    # (T, G, ICg, OCg)
    return np.ascontiguousarray(total.transpose(0, 2, 1, 3)).reshape(g.w_shape)
