"""Our GEMM: ``C[M, N] = A[M, K] @ B[K, N]`` (f32 accumulation) on the micro-kernel, the BLIS way.

The loops around :func:`.microkernel.run` (Van Zee and van de Geijn, "BLIS", ACM TOMS 2015;
block sizes as in Low et al., "Analytical Modeling Is Enough for High-Performance BLIS", 2016),
with the kernel's roles: ``A`` broadcast (``mr`` rows), ``B`` loaded as vectors (``nr`` lanes)::

    pack all of B into kc x nr micro-panels                       (once; shared by the threads)
    parallel over (mc-row block of A, share of the nr-panels):
        for pc over K in steps of kc:
            [pack A[ic:ic+mc, pc:pc+kc] into mr x kc micro-panels]  (only where needed, below)
            for jr over the share's panels: for ir over the mr-panels:
                C[ir, jr] += A[ir] . Bp[pc, jr]                     (the kernel, kc deep)

``kc``: a B micro-panel (``kc x nr``) fills half the L1 data cache; ``mc``: an A block
(``mc x kc``) half the L2; both read from the host's cache sizes (:func:`.isa.cache_sizes`).
The kernel broadcasts A, so it reads any evenly strided A where it lies (oneDNN's brgemm does
not pack A either); only a last partial register block of rows is packed, and bf16 A whose
pairs along K are not adjacent (a transposed A: the weights gradient) is packed block by block.
bf16 operands on the ``avx512_bf16`` family stay bf16, in pairs along K (the dot instruction's
layout, K padded to even; B's pairs interleaved per lane), on the dot product or its stand-in.
C is zeroed, padded to whole blocks (``mr`` rows, ``nr`` columns) and returned as a view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from . import isa, microkernel

__all__ = ["Blocks", "blocks", "gemm", "workspace_bytes"]


@dataclass(frozen=True)
class Blocks:
    """The register block (``rows`` x ``vecs`` vectors of ``width`` lanes) and the cache blocks."""

    width: int
    rows: int
    vecs: int
    kc: int        #: reduction values per packed micro-panel (even: whole bf16 pairs)
    mc: int        #: rows of A per packed block (a multiple of ``rows``)

    @property
    def nr(self) -> int:
        return self.vecs * self.width


def blocks(m: int, k: int, n: int, itemsize: int, block: tuple[int, int] | None = None) -> Blocks:
    """The blocks for an ``m x k x n`` GEMM of ``itemsize``-byte packed operands: the register
    block with the fewest idle lanes over ``n`` (:func:`.microkernel.block_for`, or ``block``),
    ``kc`` from L1, ``mc`` from L2, ``mc`` cut so that every thread gets a block."""
    width = isa.WIDTH[isa.family()]
    rows, vecs = block or microkernel.block_for(n, width, m)
    l1, l2, _ = isa.cache_sizes()
    kc = max(16, min(-(-k // 2) * 2, (l1 // 2) // (vecs * width * itemsize) // 16 * 16))
    mc = max(rows, (l2 // 2) // (kc * itemsize) // rows * rows)
    per_thread = -(-m // numba.get_num_threads())
    mc = min(mc, -(-per_thread // rows) * rows)
    return Blocks(width, rows, vecs, kc, mc)


def workspace_bytes(m: int, k: int, n: int, itemsize: int) -> int:
    """Upper bound of :func:`gemm`'s allocations besides its operands: the packed B, the padded C
    (f32) and one packed A block per thread."""
    b = blocks(m, k, n, itemsize)
    kp, npad, mpad = -(-k // 2) * 2, -(-n // b.nr) * b.nr, -(-m // b.rows) * b.rows
    return kp * npad * itemsize + mpad * npad * 4 + numba.get_num_threads() * b.mc * b.kc * itemsize + 4096


@functools.cache
def _driver(width: int, rows: int, vecs: int, native: bool) -> Callable:
    """The parallel loops of :func:`gemm` for one register block (compiled for it alone)."""
    @microkernel.cached_njit(parallel=True)
    def run(a, lda, astep, m, k, packed, bp, c, kc, mc, depth, n_shares):  # pragma: no cover - compiled
        """``c[:m, :] += A @ B``, A's value (row, kk) at ``a[row*lda + kk*astep]`` (flat), ``bp``
        B packed as (panels, K/depth, nr*depth): items of (mc-block of A's rows, share of the
        nr-panels), kc deep steps; with ``packed`` A's block is packed per step (pairs along K
        for depth 2), else the kernel reads A where it lies (``depth`` 1, or pairs adjacent)."""
        nr = vecs * width
        panels = bp.shape[0]
        kd = bp.shape[1]                       # K steps (pairs for depth 2)
        ldc = c.shape[1]
        ldp = bp.shape[1] * bp.shape[2]
        m_blocks = -(-m // mc)
        steps = kc // depth
        zero = np.zeros(1, np.int64)
        for item in numba.prange(m_blocks * n_shares):
            mb, share = item // n_shares, item % n_shares
            m0 = mb * mc
            rows_here = min(mc, m - m0)
            row_panels = -(-rows_here // rows)
            first, last = panels * share // n_shares, panels * (share + 1) // n_shares
            ap = np.zeros(row_panels * steps * rows * depth if packed else rows * steps * depth, a.dtype)
            for s0 in range(0, kd, steps):
                ks = min(steps, kd - s0)
                if packed:                            # (ks, rows, depth) per micro-panel
                    for rp in range(row_panels):
                        base = rp * steps * rows * depth
                        for r in range(rows):
                            row = m0 + rp * rows + r
                            for i in range(ks):
                                for j in range(depth):
                                    kk = (s0 + i) * depth + j
                                    at = base + (i * rows + r) * depth + j
                                    if row < m and kk < k:
                                        ap[at] = a[row * lda + kk * astep]
                                    else:
                                        ap[at] = 0
                tail = not packed and rows_here % rows != 0   # the last, partial panel: packed
                if tail:
                    rp = row_panels - 1
                    for r in range(rows):
                        row = m0 + rp * rows + r
                        for i in range(ks * depth):
                            kk = s0 * depth + i
                            ap[r * steps * depth + i] = a[row * lda + kk * astep] if row < m and kk < k else 0
                for jp in range(first, last):
                    for rp in range(row_panels):
                        coff = (m0 + rp * rows) * ldc + jp * nr
                        boff = jp * ldp + s0 * nr * depth
                        if tail and rp == row_panels - 1:
                            microkernel.run(width, rows, vecs, native, c, coff, ldc, ap, 0, steps * depth, depth, bp,
                                            boff, nr * depth, zero, zero, 1, ks)
                        elif packed:
                            microkernel.run(width, rows, vecs, native, c, coff, ldc, ap, rp * steps * rows * depth,
                                            depth, rows * depth, bp, boff, nr * depth, zero, zero, 1, ks)
                        else:
                            microkernel.run(width, rows, vecs, native, c, coff, ldc, a,
                                            (m0 + rp * rows) * lda + s0 * depth * astep, lda, astep * depth, bp, boff,
                                            nr * depth, zero, zero, 1, ks)
    return run


def _pack_b(b: np.ndarray, nr: int, depth: int) -> np.ndarray:
    """B (K, N) as (panels, K/depth, nr*depth): each nr-column panel contiguous, K in pairs
    interleaved per lane for ``depth`` 2, zero past K and N."""
    k, n = b.shape
    kp, npad = -(-k // depth) * depth, -(-n // nr) * nr
    out = np.zeros((kp, npad), b.dtype)
    out[:k, :n] = b
    return np.ascontiguousarray(out.reshape(kp // depth, depth, npad // nr, nr).transpose(2, 0, 3, 1)).reshape(
        npad // nr, kp // depth, nr * depth)


def gemm(a: np.ndarray, b: np.ndarray, block: tuple[int, int] | None = None) -> np.ndarray:
    """``a @ b`` in f32 for f32 ``a`` (M, K) and ``b`` (K, N), or bf16 bits (uint16) of both
    (the dot-product kernel on pairs along K): a (M, N) view of a padded f32 array. ``a`` is
    read where it lies when its elements are evenly spaced in memory (any 2-D strided view of
    f32; bf16 with adjacent values along an even K), else packed block by block."""
    bf16 = a.dtype == np.uint16
    m, k = a.shape
    n = b.shape[1]
    depth = 2 if bf16 else 1
    bl = blocks(m, k, n, a.dtype.itemsize, block)
    bp = _pack_b(b, bl.nr, depth)
    mpad = -(-m // bl.rows) * bl.rows
    c = np.zeros((mpad, bp.shape[0] * bl.nr), np.float32)
    m_blocks = -(-m // bl.mc)
    n_shares = min(bp.shape[0], max(1, -(-numba.get_num_threads() // m_blocks)))
    if min(a.strides) < 0 or any(s % a.itemsize for s in a.strides):     # not evenly spaced: copied
        a = np.ascontiguousarray(a)
    lda, astep = (s // a.itemsize for s in a.strides)
    packed = bf16 and not (astep == 1 and k % 2 == 0)                    # pairs not adjacent
    if m and k:
        flat = np.lib.stride_tricks.as_strided(a, ((m - 1) * lda + (k - 1) * astep + 1,), (a.itemsize,))
        _driver(bl.width, bl.rows, bl.vecs, bf16 and isa.bf16_native())(
            flat, lda, astep, m, k, packed, bp, c, bl.kc, bl.mc, depth, n_shares)
    return c[:m, :n]
