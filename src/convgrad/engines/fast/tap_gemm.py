"""The bf16 weights gradient of stride 1 on AMX tiles: x transposed once, dy paired once, one
GEMM per tap read from both at the tap's offset.

With x zero-padded and dy placed at the padded grid's origin (zeros elsewhere), both flattened
over the positions f = (n, p0, p1, p2) of the padded grid, tap t (offset ``off_t = ((k0 D0) P1 +
k1 D1) P2 + k2 D2``) is one deep GEMM:

    dw[t] = sum_f x[f + off_t] dy[f]^T     (ICg x F x OC; a junk position's dy is zero)

A tile's rows hold 32 consecutive values of K (here positions) of one row of A, and B's tiles
hold pairs of consecutive positions per lane: so x is transposed once into chunks of ``kc``
positions (each chunk's rows run ``max(off_t)`` positions past it, the halo every tap reads),
``xt[c, i, j] = x[c kc + j, i]``, and tap t's A for chunk c is ``xt[c, :, off_t:off_t + kc]``,
read in place (a row-major A at any element offset: a pair is two adjacent values, whichever
their parity); dy is packed into pairs once (:func:`.blis._packed`). Every tap, row strip and
column panel of a chunk then runs one kernel call of ``kc/2`` pairs (:func:`.microkernel.run`
on a tile block), the chunk's A and B in L2 across the taps. The threads share the chunks (a
partial dw per thread, added at the end) where those partial sums stay small next to x and dy,
else the (tap, panel) blocks of dw, each over every chunk.

Before this, each tap ran :func:`.blis.gemm` on the tap's shifted view of x, packing x^T and dy's
pairs again for every tap (docs/engine-measurements.md, Xeon 2026-12-07).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from ... import casts
from ...problem import ConvGeometry
from . import blis, isa, microkernel, pool, workspace
from .geometry import padded, spatial
from .tuning import TUNING

__all__ = ["offsets", "blocks", "workspace_bytes", "conv_workspace_bytes", "run", "gemms"]

U16 = np.dtype(np.uint16)


def offsets(g: ConvGeometry) -> list[int]:
    """Each tap's offset in the flattened padded grid, in the kernel's row-major order."""
    size, d, kernel = spatial(g.padded_size, 1), spatial(g.dilations, 1), spatial(g.kernel, 1)
    return [(k0 * d[0] * size[1] + k1 * d[1]) * size[2] + k2 * d[2]
            for k0 in range(kernel[0]) for k1 in range(kernel[1]) for k2 in range(kernel[2])]


class _Blocks(NamedTuple):
    """How :func:`gemms` runs: the tile block (rows over ICg, vectors of 16 over OC), positions
    per chunk ``kc``, threads keeping partial sums (1: they share dw's blocks), and the sizes."""
    rows: int
    vecs: int
    kc: int
    shares: int
    icpad: int
    ocpad: int
    chunks: int
    span: int


def blocks(positions: int, ic: int, oc: int, taps: int, halo: int) -> _Blocks:
    """The tile block for ``oc`` columns and ``ic`` rows (:func:`.microkernel.tile_block_for`);
    ``kc`` a multiple of 32 (whole tile steps) whose A (``ic`` rows with the ``halo``) and B take
    ``TUNING.tap_gemm_l2`` of the L2, at most every position; partial sums per thread (sharing
    the chunks) while they take at most ``TUNING.tap_gemm_partials`` x the bf16 x and dy."""
    rows, vecs = microkernel.tile_block_for(oc, ic)
    icpad, ocpad = -(-ic // rows) * rows, -(-oc // (16 * vecs)) * 16 * vecs
    fit = int(isa.cache_sizes()[1] * TUNING.tap_gemm_l2) // (2 * (icpad + ocpad))
    kc = max(32, min(fit, -(-positions // 32) * 32) // 32 * 32)
    chunks = -(-positions // kc)
    shares = min(pool.threads(), chunks)
    if shares < 2 or 4 * shares * taps * icpad * ocpad > TUNING.tap_gemm_partials * 2 * positions * (ic + oc):
        shares = 1
    return _Blocks(rows, vecs, kc, shares, icpad, ocpad, chunks, -(-(kc + halo) // 32) * 32)


def workspace_bytes(positions: int, ic: int, oc: int, taps: int, halo: int) -> int:
    """Extra bytes of :func:`gemms`: x transposed in chunks (with their halos and padded rows),
    dy's pairs, the f32 sums (per share) and the f32 dw (a caller's padded copies apart)."""
    bl = blocks(positions, ic, oc, taps, halo)
    return 2 * (bl.chunks * bl.icpad * bl.span + (positions + 1) * bl.ocpad) \
        + 4 * (bl.shares + 1) * taps * bl.icpad * bl.ocpad + (64 << 10)


def conv_workspace_bytes(g: ConvGeometry) -> int:
    """:func:`workspace_bytes` of :func:`run` with its padded copies of x and dy."""
    positions = g.n * math.prod(spatial(g.padded_size, 1))
    return 2 * positions * (g.ic + g.oc) + workspace_bytes(positions, g.ic, g.oc, math.prod(g.kernel),
                                                            max(offsets(g)))


def run(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, rounded: bool) -> np.ndarray:
    """dw (*K, ICg, OC) of a bf16 weights gradient of one group and stride 1 (the module
    docstring): f32, or bf16 bits rounded once with ``rounded``. x must be finite where there
    is padding (a junk position's zero times Inf is NaN: the caller checks)."""
    size = spatial(g.padded_size, 1)
    xp = padded(x.view(U16), spatial(g.pads_begin, 0), size, U16)
    dyp = padded(dy.view(U16), (0, 0, 0), size, U16)
    dw = gemms(xp.reshape(-1, g.ic), dyp.reshape(-1, g.oc), offsets(g), rounded)
    return dw.view(x.dtype).reshape(g.w_shape) if rounded else dw.reshape(g.w_shape)


def gemms(x: np.ndarray, dy: np.ndarray, taps: list[int], rounded: bool) -> np.ndarray:
    """``dw[t] = x[off_t:off_t + F]^T @ dy`` for every tap offset ``off_t`` of ``taps`` (x and
    dy: C-contiguous bf16 bits, (F, IC) and (F, OC); x's rows past F read as zeros), as (taps,
    IC, OC) f32, or bf16 bits rounded once with ``rounded``."""
    positions, ic = x.shape
    oc = dy.shape[1]
    bl = blocks(positions, ic, oc, len(taps), max(taps))
    xt = workspace.empty(bl.chunks * bl.icpad * bl.span, U16).reshape(bl.chunks, bl.icpad, bl.span)
    _transposed_chunks(x.reshape(-1), positions, ic, bl.kc, xt)
    bp = blis._packed(dy, 16 * bl.vecs, 2)
    panels = bp.shape[0]
    sums = np.zeros((bl.shares, len(taps), bl.icpad, bl.ocpad), np.float32)
    _driver(bl.rows, bl.vecs, isa.bf16_kernel())(
        bl.shares if bl.shares > 1 else len(taps) * panels, xt.reshape(-1), bl.span, bl.icpad * bl.span,
        np.array(taps, np.int64), bp.reshape(-1), bp.shape[1], bp.shape[1] * bp.shape[2], sums, bl.kc, bl.chunks,
        bl.shares, panels)
    dw = (np.add.reduce(sums, axis=0) if bl.shares > 1 else sums[0])[:, :ic, :oc]
    if rounded:
        return casts.from_f32(np.ascontiguousarray(dw), casts.BFLOAT16).view(U16)
    return np.ascontiguousarray(dw)


@microkernel.cached_njit(parallel=True)
def _transposed_chunks(src, rows, ic, kc, out):  # pragma: no cover - compiled
    """``out[c, i, j] = src[(c kc + j) ic + i]`` (16-bit bits; zero past ``rows`` positions and
    ``ic`` channels): 16 channels x 32 positions at a time, each pair of positions joined into
    32-bit units (:func:`.microkernel.pairs32`) and the 16 x 16 units transposed in registers
    (:func:`.microkernel.transpose32`); the edges one value at a time; (chunk, 16 channels) items
    in parallel."""
    chunks, icpad, span = out.shape
    flat = out.reshape(-1)
    blocks = -(-icpad // 16)
    for item in numba.prange(chunks * blocks):
        c, i0 = item // blocks, item % blocks * 16
        units = np.empty(512, np.uint16)
        base = (c * icpad + i0) * span
        for j0 in range(0, span, 32):
            r0 = c * kc + j0
            if i0 + 16 <= ic and r0 + 32 <= rows and j0 + 32 <= span:
                for p in range(16):
                    microkernel.pairs32(16, src, (r0 + 2 * p) * ic + i0, (r0 + 2 * p + 1) * ic + i0, units, p * 32)
                microkernel.transpose32(16, units, 0, 32, flat, base + j0, span)
                continue
            for i in range(min(16, icpad - i0)):
                for j in range(j0, min(j0 + 32, span)):
                    r = c * kc + j
                    flat[base + i * span + j] = src[r * ic + i0 + i] if r < rows and i0 + i < ic else 0


@functools.cache
def _driver(rows: int, vecs: int, native: int) -> Callable:
    """The kernel calls of :func:`run` for one tile block, run per item in the pool (item: a
    share of the chunks, or one (tap, panel) block of dw over every chunk)."""
    def body(item, xt, lda, chunk_stride, taps, bp, kd, panel_stride, sums, kc, chunks, shares,
             panels):  # pragma: no cover - compiled
        """``sums[share, t, i, o] += sum_f xt[c, i, off_t + j] bp-pairs[f][o]`` over the item's chunks c
        (f = c kc + j), taps and panels; ``sums`` zeroed, ``xt`` (chunks, rows of A, ``lda``), B's
        panel p at ``bp[p panel_stride]`` as (``kd`` pairs, ``nr`` lanes, 2)."""
        nr = vecs * 16
        zero = np.zeros(1, np.int64)
        ntaps, strips, ldc = taps.shape[0], sums.shape[2] // rows, sums.shape[3]
        flat = sums.reshape(-1)
        if shares > 1:
            share, c0, c1 = item, chunks * item // shares, chunks * (item + 1) // shares
            t0, t1, p0, p1 = 0, ntaps, 0, panels
        else:
            share, c0, c1 = 0, 0, chunks
            t0, p0 = item // panels, item % panels
            t1, p1 = t0 + 1, p0 + 1
        for c in range(c0, c1):
            pairs = min(kc // 2, kd - c * (kc // 2))
            for t in range(t0, t1):
                for s in range(strips):
                    for p in range(p0, p1):
                        microkernel.run(16, rows, vecs, native, flat, ((share * ntaps + t) * sums.shape[2] + s * rows)
                                        * ldc + p * nr, ldc, xt, c * chunk_stride + s * rows * lda + taps[t], lda, 2,
                                        bp, p * panel_stride + c * (kc // 2) * nr * 2, nr * 2, zero, zero, 1, pairs, 1)
    return microkernel.parallel_items(body)
