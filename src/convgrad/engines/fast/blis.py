"""Our GEMM: ``C[M, N] = A[M, K] @ B[K, N]`` (f32 accumulation) on the micro-kernel, the BLIS way.

The loops around :func:`.microkernel.run` (Van Zee and van de Geijn, "BLIS", ACM TOMS 2015;
block sizes as in Low et al., "Analytical Modeling Is Enough for High-Performance BLIS", 2016),
with the kernel's roles: ``A`` broadcast (``mr`` rows), ``B`` loaded as vectors (``nr`` lanes)::

    pack all of B into kc x nr micro-panels                       (once; shared by the threads)
    parallel over (mc-row block of A, share of the nr-panels):
        for pc over K in steps of kc:
            for jr over the share's panels: for ir over the mr-panels:
                C[ir, jr] += A[ir] . Bp[pc, jr]                     (the kernel, kc deep)

Where K is one kc step and a share's B panels of it fit half the L2, the two inner loops swap
(ir outer): each mr-panel's tiles are written across the share's panels in turn, so C is
written row by row as it streams out to memory (the BLIS order wrote it a column panel at a
time, each row's line apart from its neighbour's: a bf16 1x1 forward of 50176 x 64 x 256 on AMX
2.33 -> 1.47 ms; with B past the L2, 784 x 512 x 2048 in f32, twice as slow: B then streamed
from memory for every row panel; docs/engine-measurements.md).

``kc``: a B micro-panel (``kc x nr``) fills ``TUNING.gemm_panel_l1[width, halved]`` L1 data caches (it streams
from L2: longer kernel calls cost fewer C tile loads and restart fewer A streams; a deep
reduction's, ``TUNING.gemm_deep_panel_l1``, leaves room for its packed A's lines); ``mc``: an A
block (``mc x kc``) at most half the L2; both from the host's cache sizes
(:func:`.isa.cache_sizes`); blocks and shares of the panels dealt evenly to the threads.
The kernel broadcasts A, so it reads any evenly strided A where it lies (oneDNN's brgemm does
not pack A either); only a last partial register block of rows is packed per step, and bf16 A
whose pairs along K are not adjacent (a transposed A: the weights gradient) is packed, the BLIS
way, per K step and block of rows into each thread's (kc/2, mc, 2) buffer.
bf16 operands on the ``avx512_bf16`` family stay bf16, in pairs along K (the dot instruction's
layout, K padded to even; B's pairs interleaved per lane), on the dot product or its stand-in.
C is zeroed, padded to whole blocks (``mr`` rows, ``nr`` columns) and returned as a view.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from ... import casts
from . import isa, microkernel, pool, tiles, workspace
from .tuning import TUNING, remembered

__all__ = ["Blocks", "blocks", "channels_last", "deep", "gemm", "register_block", "reversed_weights", "split",
           "transposed_images", "workspace_bytes"]


@dataclass(frozen=True)
class Blocks:
    """The register block (``rows`` x ``vecs`` vectors of ``width`` lanes), the cache blocks and
    the threads' split of the nr-panels."""

    width: int
    rows: int
    vecs: int
    kc: int        #: reduction values per kernel call (even: whole bf16 pairs)
    mc: int        #: rows of A per block of work at most (a multiple of ``rows``)
    m_blocks: int = 1  #: blocks of rows (:func:`block_rows`)
    shares: int = 1  #: shares of the nr-panels per block of rows (one item of work each)
    by_share: bool = False  #: items dealt share-major (else block-major)
    k_chunks: int = 1  #: chunks of K, one per thread, each into a C of its own (then summed)

    @property
    def nr(self) -> int:
        return self.vecs * self.width


def register_block(n: int, width: int, m: int, itemsize: int, k: int = 0) -> tuple[int, int]:
    """The GEMM's register block: ``TUNING.gemm_blocks`` for the family's width, the operand
    size and the host's vector halves where it names one and ``n`` fills its vectors, else the
    fewest idle lanes and rows (:func:`.microkernel.block_for`, loads weighed by
    ``TUNING.gemm_loads_weight``), a block whose columns leave the result padded (copied out
    afterwards) weighed by ``TUNING.gemm_result_copy`` over the reduction's depth ``k`` (if
    given): a short reduction's copy is a large share. bf16 pairs on AMX tiles:
    :func:`.microkernel.tile_block_for`."""
    if itemsize == 2 and isa.bf16_kernel() >= microkernel.TILES_STANDIN:
        return microkernel.tile_block_for(n, m)
    block = TUNING.gemm_blocks.get((width, itemsize, isa.halved_vectors()))
    if block is not None and n >= block[1] * width:
        return block
    return microkernel.block_for(n, width, m, loads_weight=TUNING.gemm_loads_weight,
                                 copy=TUNING.gemm_result_copy / k if k else 0.0)


def deep(m: int, k: int, n: int) -> bool:
    """Whether ``m x k x n`` reduces over K > ``TUNING.gemm_deep`` (M + N): a weights gradient."""
    return k > TUNING.gemm_deep * (m + n)


@numba.njit(inline="always")
def block_rows(m: int, rows: int, m_blocks: int, b: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """(first row, rows) of block ``b`` of ``m_blocks``: the ``ceil(m/rows)`` register blocks of
    rows dealt evenly (block sizes differ by at most one register block)."""
    panels = -(-m // rows)
    first, last = panels * b // m_blocks * rows, panels * (b + 1) // m_blocks * rows
    return first, min(last, m) - first


def _busiest(row_panels: int, m_blocks: int, panels: int, shares: int, threads: int, by_share: bool) -> int:
    """The busiest thread's register blocks x nr-panels when the items (block, share), block-major
    (share-major ``by_share``), are dealt to ``threads`` in contiguous runs as OpenMP's static
    schedule deals them: from the work done before each thread's first item, in closed form."""
    outer, inner = (shares, m_blocks) if by_share else (m_blocks, shares)
    outer_total, inner_total = (panels, row_panels) if by_share else (row_panels, panels)

    def before(i: int) -> int:     # work of the first i items
        o, j = divmod(i, inner)
        lo = outer_total * o // outer
        return lo * inner_total + (outer_total * (o + 1) // outer - lo) * (inner_total * j // inner) if o < outer \
            else outer_total * inner_total

    q, extra = divmod(outer * inner, threads)
    starts = [t * q + min(t, extra) for t in range(threads + 1)]
    return max(before(starts[t + 1]) - before(starts[t]) for t in range(threads))


@functools.lru_cache(maxsize=256)
def split(m: int, rows: int, panels: int, mc_max: int, threads: int) -> tuple[int, int, int, bool]:
    """(mc, m_blocks, shares, by_share): the rows' register blocks dealt evenly into ``m_blocks``
    blocks of at most ``mc`` <= ``mc_max`` rows (:func:`block_rows`), and the ``panels``
    nr-panels into ``shares`` per block, such that the items (block, share), block-major or
    share-major (``by_share``: each thread then takes whole shares of B where the shares divide
    among the threads) and dealt to ``threads`` in contiguous runs as OpenMP's static schedule
    deals them, give the busiest thread at most ``TUNING.gemm_balance`` more work (rows x panels)
    than the least any split into up to 2 blocks a thread more than the fewest gives, in the
    fewest items, then the fewest blocks, block-major first. Few large items: a bf16 GEMM of
    50176 x 64 x 256 ran at 222 GFLOP/s in 6-row items against 300 in 738-row ones; 1024 x 3136
    x 256 f32 (74 register blocks: 37 a thread only in blocks of 2) 97 in 28-row blocks, 160 in
    518-row ones."""
    row_panels = -(-m // rows)
    fewest = -(-row_panels // max(1, mc_max // rows))
    found = [(_busiest(row_panels, nb, panels, shares, threads, by), nb * shares, nb, by, shares)
             for nb in range(fewest, min(row_panels, fewest + 2 * threads) + 1)
             for shares in range(1, min(panels, 4 * threads) + 1) for by in (False, True)]
    least = min(f[0] for f in found)
    _, nb, by_share, _, shares = min((items, nb, by, busiest, shares) for busiest, items, nb, by, shares in found
                                     if busiest <= least * (1 + TUNING.gemm_balance))
    return -(-row_panels // nb) * rows, nb, shares, by_share


def blocks(m: int, k: int, n: int, itemsize: int, block: tuple[int, int] | None = None) -> Blocks:
    """The blocks for an ``m x k x n`` GEMM of ``itemsize``-byte packed operands (2: bf16 pairs):
    the register block (``block``, else :func:`register_block`), ``kc`` from the L1 (a B
    micro-panel in ``TUNING.gemm_panel_l1[width, halved]`` of it), ``mc`` at most an A block in half the L2, and
    the threads' work: a deep reduction (:func:`deep`) splits K, one chunk
    per thread into a C of its own (B read once, every thread as busy); others split M and N
    (:func:`split`). Remembered per shape, family, thread count and tuning table (10 µs of a
    small GEMM's 100)."""
    return _blocks_for(m, k, n, itemsize, block, isa.family(), pool.threads())


@remembered(lambda: TUNING)
def _blocks_for(m: int, k: int, n: int, itemsize: int, block: tuple[int, int] | None, family: str,
                threads: int) -> Blocks:
    """:func:`blocks` on the kernel ``family`` with ``threads`` threads (remembered)."""
    width = isa.WIDTH[family]
    rows, vecs = block or register_block(n, width, m, itemsize)
    l1, l2, _ = isa.cache_sizes()
    nr = vecs * width
    reduction = deep(m, k, n)
    share = TUNING.gemm_deep_panel_l1[isa.family()] if reduction else TUNING.gemm_panel_l1[width, isa.halved_vectors()]
    on_tiles = itemsize == 2 and isa.bf16_kernel() >= microkernel.TILES_STANDIN and (rows, vecs) in tiles.TILE_BLOCKS
    unit = 2 * tiles.PAIRS if on_tiles else 16      # tiles: whole tile steps
    kc = max(unit, min(-(-k // 2) * 2, int(share * l1) // (nr * itemsize) // unit * unit))
    mc_max = max(rows, (l2 // 2) // (kc * itemsize) // rows * rows)
    k_chunks = min(threads, -(-k // kc)) if reduction else 1
    mc, m_blocks, shares, by_share = split(m, rows, -(-n // nr), mc_max, -(-threads // k_chunks))
    return Blocks(width, rows, vecs, kc, mc, m_blocks, shares, by_share, k_chunks)


def workspace_bytes(m: int, k: int, n: int, itemsize: int) -> int:
    """Upper bound of :func:`gemm`'s allocations besides its operands: the packed B (or the
    threads' K steps of it), the padded C
    (f32, one per chunk of K), for bf16 the per-thread blocks of A's pairs (kc/2 x mc, 32 bits
    each) and of a rounded result's tiles (mc x N, f32), and one packed tail panel per item."""
    b = blocks(m, k, n, itemsize)
    kp, npad, mpad = -(-k // 2) * 2, -(-n // b.nr) * b.nr, -(-m // b.rows) * b.rows
    a_blocks = pool.threads() * ((b.kc // 2) + npad) * b.mc * 4 if itemsize == 2 else \
        pool.threads() * (b.kc + 16) * b.mc * 4
    return max(kp, pool.threads() * b.kc) * npad * itemsize + b.k_chunks * mpad * npad * 4 + a_blocks \
        + b.m_blocks * b.shares * b.rows * b.kc * itemsize + 4096


@functools.cache
def _driver(width: int, rows: int, vecs: int, native: int, into: bool) -> Callable:
    """The loops of :func:`gemm` for one register block, run for each item of work in the pool
    (:class:`.microkernel.parallel_items`; compiled for that block alone; ``native``: the bf16
    kernel, :func:`.isa.bf16_kernel`; ``into``: the result into ``out`` (f32, or bf16 bits
    rounded), not into the padded ``c``, a constant, so that a driver without it compiles one
    kernel, not two: each call site inlines a whole one)."""
    on_tiles = native >= microkernel.TILES_STANDIN and (rows, vecs) in tiles.TILE_BLOCKS   # packed A row-major

    def run(item, a, lda, astep, m, k, bp, panels, kd, poff, bstep, c, kc, mc, m_blocks, depth, n_shares, by_share,
            k_chunks, out, scratch, apack, copy_lda, bpack, ldb, n, rows_outer):  # pragma: no cover
        """``c[:m, :] = A @ B``, A's value (row, kk) at ``a[row*lda + kk*astep]`` (flat; for
        ``depth`` 2 the kernel reads pairs ``kk``, ``kk+1`` adjacent and steps ``astep*depth``),
        B's panel ``jp`` at ``bp[jp*poff + kk*bstep]`` for its ``kd`` steps of K (pairs for depth
        2; packed: (panels, K/depth, nr*depth), or f32 B read in place): items of (chunk of K,
        mc-block of A's rows, share of the nr-panels) of kc deep steps, the first writing its tiles of ``c``
        (the kernel's beta = 0), the next adding to them, the kernel reading A where it lies; a
        last partial panel of rows is packed per step as (kc/depth, rows, depth). Chunk ``t`` of
        K writes rows ``t*R .. t*R + R`` of ``c`` (R = ``c``'s rows / ``k_chunks``).
        With ``into``, ``out`` (M, N, C-contiguous; one chunk of K) takes the result instead, f32
        or bf16 bits (each tile rounded once it is complete): one K step, by the kernel's stores
        (rounded for bf16; a tile at out's edges: from a tile in L1); more, from the item's block
        of ``scratch[thread]`` (mc, the share's columns) at its end.
        A non-empty ``apack`` (threads, kc/depth * mc values or pairs, as uint32): A whose values
        (bf16: pairs) along K are not adjacent (a weights gradient's x^T) is packed per K step and
        block of rows into the thread's (kc/depth, mc, depth), the BLIS way (zero past M and K),
        and the kernel reads it there. On tiles, packed A (and the tail panel) is row-major
        instead, (mc, kc/depth, depth): a tile's rows hold consecutive pairs.
        A non-empty ``bpack`` (threads, panels * kc/2 * nr pairs as uint32): ``bp`` is B itself
        (bf16 bits, rows ``ldb`` apart, ``n`` columns), each K step's pairs of rows packed into
        the thread's (panels, kc/2, nr) just before its kernels, a vector of pairs at a time
        (an item per chunk of K: each step packed once), not all of B before the GEMM.
        ``rows_outer``: a K step's row panels outermost, each across the share's panels, where
        the share's packed B of a step fits half the L2 (the module docstring)."""
        nr = vecs * width
        line = 64 // a.itemsize
        pack_a = apack.shape[0] > 0 and copy_lda == 0
        copy_a = copy_lda > 0
        steps = kc // depth
        per_chunk = -(-kd // (k_chunks * steps)) * steps
        chunk_rows = c.shape[0] // k_chunks
        zero = np.zeros(1, np.int64)
        chunk, rest = item // (m_blocks * n_shares), item % (m_blocks * n_shares)
        mb, share = (rest % m_blocks, rest // m_blocks) if by_share else (rest // n_shares, rest % n_shares)
        k_lo, k_hi = chunk * per_chunk, min(kd, (chunk + 1) * per_chunk)
        m0, block = block_rows(m, rows, m_blocks, mb)
        row_panels = -(-block // rows)
        first, last = panels * share // n_shares, panels * (share + 1) // n_shares
        tail = row_panels - 1 if m0 + row_panels * rows > m else -1   # a partial last panel
        one_step = k_hi - k_lo <= steps
        if not into:
            tiles, t0, t_row, t_col = c, chunk * chunk_rows * c.shape[1], 0, 0
        elif one_step:   # one register block's tile, rounded right after the kernel
            tiles, t0, t_row, t_col = workspace.line_empty(rows * nr, np.float32).reshape(rows, nr), 0, 0, 0
        else:            # the item's tiles, rounded at its end
            tiles, t0, t_row, t_col = scratch[numba.get_thread_id()], 0, m0, first * nr
        ldc = tiles.shape[1]
        ap = workspace.line_empty(steps * rows * depth, a.dtype)
        mp = row_panels * rows
        pack_b = bpack.shape[0] > 0
        bsrc = bpack[numba.get_thread_id()].view(bp.dtype) if pack_b else bp
        for s0 in range(k_lo, k_hi, steps):
            ks = min(steps, k_hi - s0)
            if pack_b:                                        # this step's pairs of B's rows, panel-major
                for i2 in range(ks):
                    _pair_row(bp, ldb, 2 * (s0 + i2), k, n, first, last, nr, width, bsrc, i2 * nr * 2, steps * nr * 2)
            if copy_a:                                        # A's rows at stride copy_lda
                cf = apack[numba.get_thread_id()].view(a.dtype)
                valid = block
                cols = min(ks * depth, k - s0 * depth)
                for r in range(mp):
                    dst = cf[r * copy_lda:r * copy_lda + ks * depth]
                    if r < valid:
                        row = a[(m0 + r) * lda + s0 * depth:(m0 + r) * lda + s0 * depth + cols]
                        for i in range(cols):
                            dst[i] = row[i]
                        for i in range(cols, ks * depth):
                            dst[i] = 0
                    else:
                        for i in range(ks * depth):
                            dst[i] = 0
            elif pack_a and depth == 1:                       # A's block as (ks, mp) values
                pf = apack[numba.get_thread_id()].view(a.dtype)
                valid = block
                for i2 in range(ks):
                    kk = s0 + i2
                    dst = pf[i2 * mp:(i2 + 1) * mp]
                    if lda == 1:
                        row = a[kk * astep + m0:kk * astep + m0 + valid]
                        for r in range(valid):
                            dst[r] = row[r]
                    else:
                        for r in range(valid):
                            dst[r] = a[(m0 + r) * lda + kk * astep]
                    for r in range(valid, mp):
                        dst[r] = 0
            elif pack_a:                                      # A's block as (ks, mp, 2) pairs
                pk = apack[numba.get_thread_id()]
                valid = block
                for i2 in range(ks):
                    kk = (s0 + i2) * 2
                    start, step_r = (i2, ks) if on_tiles else (i2 * mp, 1)
                    dst = pk[start:]
                    if lda == 1:
                        lo = a[kk * astep + m0:kk * astep + m0 + valid]
                        if kk + 1 < k:
                            hi = a[(kk + 1) * astep + m0:(kk + 1) * astep + m0 + valid]
                            for r in range(valid):
                                dst[r * step_r] = np.uint32(lo[r]) | (np.uint32(hi[r]) << np.uint32(16))
                        else:
                            for r in range(valid):
                                dst[r * step_r] = np.uint32(lo[r])
                    else:
                        for r in range(valid):
                            at = (m0 + r) * lda + kk * astep
                            dst[r * step_r] = np.uint32(a[at]) | ((np.uint32(a[at + astep]) << np.uint32(16))
                                                                  if kk + 1 < k else np.uint32(0))
                    for r in range(valid, mp):
                        dst[r * step_r] = 0
            elif tail >= 0:                                   # packed as (ks, rows, depth)
                first_row = m0 + tail * rows                  # K outer: a transposed A's rows of
                kept = min(rows, m - first_row)               # one K step lie side by side
                valid = min(ks * depth, k - s0 * depth)
                for i in range(ks * depth):
                    dst, step_r = (ap[i:], ks * depth) if on_tiles else (ap[(i // depth) * rows * depth + i % depth:],
                                                                         depth)
                    src = first_row * lda + (s0 * depth + i) * astep
                    for r in range(rows):
                        dst[r * step_r] = a[src + r * lda] if r < kept and i < valid else 0
            pf_k = (s0 + steps) * depth                        # the next step's rows of a transposed A,
            pf_n = min(steps * depth, k_hi * depth - pf_k, k - pf_k) if pack_a and lda == 1 else 0
            calls, call = (last - first) * row_panels, 0       # prefetched while the kernels run
            n_cols = last - first
            for idx in range(n_cols * row_panels):        # row panels outer: see ``rows_outer``
                jp, rp = (first + idx % n_cols, idx // n_cols) if one_step and rows_outer else \
                    (first + idx // row_panels, idx % row_panels)
                boff = (jp - first) * steps * bstep if pack_b else jp * poff + s0 * bstep
                row0 = m0 + rp * rows
                if pf_n > 0:
                    for kk in range(pf_k + call * pf_n // calls, pf_k + (call + 1) * pf_n // calls):
                        for e in range(0, block, line):
                            microkernel.prefetch(a, kk * astep + m0 + e)
                    call += 1
                if copy_a:                                # A: the thread's copied rows
                    src, aoff, alda, astp = (apack[numba.get_thread_id()].view(a.dtype), rp * rows * copy_lda,
                                             copy_lda, depth)
                elif pack_a and on_tiles:                 # A: the thread's packed block, row-major
                    src, aoff, alda, astp = (apack[numba.get_thread_id()].view(a.dtype), rp * rows * ks * depth,
                                             ks * depth, depth)
                elif pack_a:                              # A: the thread's packed block
                    src, aoff, alda, astp = (apack[numba.get_thread_id()].view(a.dtype), rp * rows * depth,
                                             depth, mp * depth)
                elif rp == tail and on_tiles:             # A: the packed tail panel, row-major
                    src, aoff, alda, astp = ap, 0, ks * depth, depth
                elif rp == tail:                          # A: the packed tail panel
                    src, aoff, alda, astp = ap, 0, depth, rows * depth
                else:                                     # A where it lies
                    src, aoff, alda, astp = a, row0 * lda + s0 * depth * astep, lda, astep * depth
                if into and one_step and row0 + rows <= out.shape[0] and (jp + 1) * nr <= out.shape[1]:
                    microkernel.run(width, rows, vecs, native, out, row0 * out.shape[1] + jp * nr,
                                    out.shape[1], src, aoff, alda, astp, bsrc, boff, bstep, zero, zero, 1, ks,
                                    0)                    # a whole tile (rounded in registers)
                    continue
                coff = 0 if into and one_step else t0 + (row0 - t_row) * ldc + jp * nr - t_col
                microkernel.run(width, rows, vecs, native, tiles, coff, ldc, src, aoff, alda, astp, bsrc, boff,
                                bstep, zero, zero, 1, ks, s0 - k_lo)
                if into and one_step:
                    _store_into(out, tiles, row0, jp * nr, rows, nr)
        if into and not one_step:
            _store_into(out, tiles, m0, first * nr, block, (last - first) * nr)
    return microkernel.parallel_items(run)


@numba.njit(inline="always")
def _store_into(out, tiles, row0, col0, rows, cols):  # pragma: no cover - compiled
    """``out[row0 + i, col0 + j]`` = ``tiles[i, j]`` (bf16 bits of it, rounded, for a 16-bit
    ``out``) for the ``rows`` x ``cols`` block, cut at ``out``'s edges (row by row: the loop over
    a row's values vectorises)."""
    if out.itemsize == 4:
        for i in range(min(rows, out.shape[0] - row0)):
            o = out[row0 + i, col0:col0 + cols]
            t = tiles[i, :o.shape[0]]
            for j in range(o.shape[0]):
                o[j] = t[j]
        return
    bits = tiles.view(np.uint32)
    for i in range(min(rows, out.shape[0] - row0)):
        o = out[row0 + i, col0:col0 + cols]
        b = bits[i, :o.shape[0]]
        for j in range(o.shape[0]):
            o[j] = casts.bf16_bits(b[j])


@microkernel.cached_njit(parallel=True)
def _pack(src, ld, step, k, n, depth, out):  # pragma: no cover - compiled
    """``out[p, i, l*depth + j] = B[i*depth + j, p*nr + l]`` (zero past K and N), B's value
    (kk, col) at ``src[kk*ld + col*step]``; ``out`` is (panels, K/depth, nr*depth). Rows of
    adjacent f32 values are copied as slices (one value at a time, a deep GEMM's B of 50176 x 64
    took 6 ms to pack, half the GEMM; as slices 0.9)."""
    panels, kd, width = out.shape
    nr = width // depth
    for i in numba.prange(kd):
        for p in range(panels):
            cols = min(nr, n - p * nr)
            o = out[p, i]
            if depth == 1 and step == 1:
                row = src[i * ld + p * nr:i * ld + p * nr + cols] if i < k else src[:0]
                for l in range(row.shape[0]):
                    o[l] = row[l]
                for l in range(row.shape[0], nr):
                    o[l] = 0
                continue
            for j in range(depth):
                kk = i * depth + j
                valid = cols if kk < k else 0
                base = kk * ld + p * nr * step
                for l in range(valid):
                    o[l * depth + j] = src[base + l * step]
                for l in range(valid, nr):
                    o[l * depth + j] = 0


@microkernel.cached_njit(parallel=True)
def _pack_across(src, ld, step, k, n, depth, out, width):  # pragma: no cover - compiled
    """:func:`_pack` of a B stored along K (``ld`` < ``step``, the transposed weights of a data
    gradient), ``width`` x ``width`` tiles of 32-bit units at a time (a unit: ``depth`` values
    along K), transposed in registers (:func:`.microkernel.transpose32`) where K is contiguous
    (``ld`` 1), the edges (and other strides) one value at a time (read along the lanes, every
    value was a cache line of its own: the res5 1x1 data gradient's packing took 1.5 of its 2.4
    ms at mb 1; then through a tile in L1, 0.66 ms for its 512 x 2048 weights)."""
    panels, kd, lanes = out.shape
    nr = lanes // depth
    span = width * depth                         # values of K per tile
    kblocks = -(-kd * depth // span)
    item_o = out.itemsize
    od = out.strides[1] // item_o
    for item in numba.prange(panels * kblocks):
        p = item % panels
        k0 = item // panels * span
        cols = min(nr, n - p * nr)
        whole = cols - cols % width if ld == 1 and k0 + span <= k else 0
        obase = p * (out.strides[0] // item_o) + (k0 // depth) * od
        for l0 in range(0, whole, width):
            microkernel.transpose_tile(width, src, (p * nr + l0) * step + k0, step, out, obase + l0 * depth, od)
        for kk in range(k0, min(k0 + span, kd * depth)):
            o = out[p, kk // depth]
            j = kk % depth
            for l in range(whole, nr):
                o[l * depth + j] = src[(p * nr + l) * step + kk * ld] if kk < k and l < cols else 0


@numba.njit(inline="always")
def _pair_row(src, ld, r, k, n, p0, p1, nr, width, dst, at, pstride):  # pragma: no cover - compiled
    """Rows ``r`` and ``r + 1`` of B (``src``: 16-bit bits, rows ``ld`` apart, ``n`` columns) as
    pairs into panels ``p0 .. p1`` of ``dst`` (16-bit): panel p's ``nr`` pairs from ``at + (p -
    p0)*pstride``, value l of row r then of row r + 1 (zero past n, and past K = ``k`` rows);
    whole vectors of ``width`` pairs by :func:`.microkernel.pairs32`, the rest one value at a time."""
    for p in range(p0, p1):
        base, col = at + (p - p0) * pstride, p * nr
        cols = min(nr, n - col)
        whole = cols // width * width if r + 1 < k else 0
        for l in range(0, whole, width):
            microkernel.pair_units(width, src, r * ld + col + l, (r + 1) * ld + col + l, dst, base + 2 * l)
        for l in range(whole, nr):
            dst[base + 2 * l] = src[r * ld + col + l] if l < cols else 0
            dst[base + 2 * l + 1] = src[(r + 1) * ld + col + l] if l < cols and r + 1 < k else 0


@microkernel.cached_njit(parallel=True)
def _pack_pairs(src, ld, k, n, out, width):  # pragma: no cover - compiled
    """:func:`_pack` of depth 2 from rows of adjacent values (``step`` 1): ``out`` (panels, K/2,
    nr*2) of 16-bit values, ``out[p, i, 2l + j] = B[2i + j, p*nr + l]`` (zero past K and N),
    :func:`_pair_row` per pair of rows, in parallel."""
    panels, kd, lanes = out.shape
    flat = out.reshape(-1)
    for i in numba.prange(kd):
        _pair_row(src, ld, 2 * i, k, n, 0, panels, lanes // 2, width, flat, i * lanes, kd * lanes)


def _copy_lda(bl: Blocks, lda: int, itemsize: int, panels: int) -> int:
    """The stride (elements) at which the driver copies A's rows per K step, or 0 (read in
    place): rows of A ``TUNING.gemm_copy_rows`` bytes or more apart, reused by at least two
    nr-panels. Rows 2 KB apart put a K step's values of a register block in two L1 sets (a Zen 4,
    784 x 512 x 2048: 92-99 GFLOP/s in place, 126-128 at a stride of 2 KB + 64 B)."""
    if lda * itemsize < TUNING.gemm_copy_rows or panels < 2:
        return 0
    return bl.kc + 64 // itemsize


def _transposed(c: np.ndarray) -> np.ndarray:
    """``c.T`` as a C-contiguous array: f32 (a view of a padded result) transposed in parallel
    ``W`` x ``W`` tiles in registers (NumPy's copy of a transposed view is one thread, strided:
    0.1 ms of a 0.45 ms data gradient of ResNet-50's res4 at mb 1); C-contiguous bf16 bits two
    rows at a time (:func:`transposed_images`), others by NumPy."""
    if c.dtype == np.uint16 and c.flags.c_contiguous:
        return transposed_images(c[None])[0]
    if c.dtype != np.float32 or c.strides[1] != 4 or c.strides[0] % 4 or not c.size:
        return np.ascontiguousarray(c.T)
    out = workspace.result((c.shape[1], c.shape[0]), np.float32)
    _transpose_into(c[None], c.strides[0] // 4, out[None], isa.WIDTH.get(isa.family(), 8))
    return out


def transposed_images(c: np.ndarray) -> np.ndarray:
    """``c`` (B, M, N) C-contiguous 32- or 16-bit values as its images' transpositions, a
    C-contiguous (B, N, M) array of the engine's cache, by :func:`_transposed`'s tiles, 16-bit
    ones two rows at a time (:func:`_transpose_pairs_into`) (an NXC result into NCX memory:
    NumPy's copy took 5 ms of a 3x3 data gradient's 20 at 56x56x64, mb 16)."""
    out = workspace.result((c.shape[0], c.shape[2], c.shape[1]), c.dtype)
    width = isa.WIDTH.get(isa.family(), 8)
    if c.size and c.dtype.itemsize == 4:
        _transpose_into(c.view(np.float32), c.shape[2], out.view(np.float32), width)
    elif c.size:
        _transpose_pairs_into(c.view(np.uint16), out.view(np.uint16), width)
    return out


def reversed_weights(w: np.ndarray) -> np.ndarray | None:
    """Canonical weights ``w`` (*K, ICg, OC) of 2-, 4- or 8-byte values whose memory is (K, ICg,
    OC) with adjacent output channels (C-contiguous, or a view of padded sums) as a C-contiguous
    (OC, ICg, *K) array of the engine's cache (OIX memory), or None for any other ``w``: one
    kernel tap by :func:`_transpose_into`'s register tiles (32-bit; 16-bit C-contiguous by
    :func:`_transpose_pairs_into`), several by :func:`_reverse_taps`, in parallel (the API's
    serial copy took 3.4 ms for a 3x3 512-channel weights gradient of 15-20, here 1.2; 1.4 ms for
    a 1x1 of 2048 x 512, here 0.4)."""
    taps, (icg, oc) = math.prod(w.shape[:-2]), w.shape[-2:]
    try:
        src = np.reshape(w, (taps, icg, oc), copy=False)
    except ValueError:
        return None
    if w.dtype.itemsize not in (2, 4, 8) or src.strides[-1] != w.dtype.itemsize:
        return None
    bits = np.dtype(f"u{w.dtype.itemsize}")   # any dtype (ml_dtypes' bf16 too) as its bits
    out = workspace.result((oc, icg, taps), w.dtype)
    src, flat = src.view(bits), out.view(bits)
    width = isa.WIDTH.get(isa.family(), 8)
    if taps == 1 and w.dtype.itemsize == 4 and src.strides[1] % 4 == 0:
        _transpose_into(src, src.strides[1] // 4, flat.reshape(1, oc, icg), width)
    elif taps == 1 and w.dtype.itemsize == 2 and src.flags.c_contiguous:
        _transpose_pairs_into(src, flat.reshape(1, oc, icg), width)
    else:
        _reverse_taps(src, flat)
    return out.reshape(oc, icg, *w.shape[:-2])


@microkernel.cached_njit(parallel=True)
def _reverse_taps(src, out):  # pragma: no cover - compiled
    """``out[o, i, k] = src[k, i, o]``, blocks of 16 output channels in parallel: each reads 16
    adjacent values of ``src`` per (k, i) and writes its rows of ``out`` along (i, k)."""
    k_, i_, o_ = src.shape
    for block in numba.prange(-(-o_ // 16)):
        o0 = block * 16
        for i in range(i_):
            for o in range(o0, min(o_, o0 + 16)):
                for k in range(k_):
                    out[o, i, k] = src[k, i, o]


@microkernel.cached_njit(parallel=True)
def _transpose_into(src, sld, out, width):  # pragma: no cover - compiled
    """``out[b, j, i] = src[b, i, j]`` (``src`` B x m x n, rows ``sld`` elements apart, columns
    adjacent; ``out`` B x n x m, C-contiguous): whole ``width`` x ``width`` tiles by
    :func:`.microkernel.transpose_tile`, the edges one value at a time, tiles in parallel."""
    batch, m, n = src.shape
    bm, bn = -(-m // width), -(-n // width)
    image = src.strides[0] // src.itemsize
    for item in numba.prange(batch * bm * bn):
        b, tile = item // (bm * bn), item % (bm * bn)
        i0, j0 = tile // bn * width, tile % bn * width
        if i0 + width <= m and j0 + width <= n:
            microkernel.transpose_tile(width, src, b * image + i0 * sld + j0, sld, out, (b * n + j0) * m + i0, m)
        else:
            for i in range(i0, min(i0 + width, m)):
                for j in range(j0, min(j0 + width, n)):
                    out[b, j, i] = src[b, i, j]


def channels_last(v: np.ndarray) -> np.ndarray:
    """Canonical data ``v`` (N, *X, C) as a C-contiguous array: ``v`` itself if it is one; a view
    of NCX memory (C-contiguous as (N, C, *X)) transposed image by image in register tiles
    (:func:`transposed_images`; NumPy's one-thread copy of the view took 12 ms of a bf16 training
    step's 3x3 weights gradients); any other layout copied by NumPy."""
    images = np.moveaxis(v, -1, 1)
    if v.flags.c_contiguous or not images.flags.c_contiguous or v.dtype.itemsize not in (2, 4) or v.ndim < 3:
        return np.ascontiguousarray(v)
    return transposed_images(images.reshape(v.shape[0], v.shape[-1], -1)).reshape(v.shape)


@microkernel.cached_njit(parallel=True)
def _transpose_pairs_into(src, out, width):  # pragma: no cover - compiled
    """``out[b, j, i] = src[b, i, j]`` of 16-bit values (``src`` B x m x n, ``out`` B x n x m,
    both C-contiguous): rows 2r and 2r + 1 of a ``2*width`` x ``width`` tile interleaved into
    pairs (:func:`.microkernel.pairs32`), whose ``width`` x ``width`` transposition as 32-bit
    units (:func:`.microkernel.transpose_tile`) is the tile's transposition, each pair two
    adjacent values of a row of ``out``; the edges (and odd m) one value at a time, rows of
    tiles in parallel."""
    batch, m, n = src.shape
    flat_src, flat_out = src.reshape(-1), out.reshape(-1)
    rows = 2 * width
    bm, bn = -(-m // rows), -(-n // width)
    for item in numba.prange(batch * bm):
        b, i0 = item // bm, item % bm * rows
        pairs = np.empty(width * rows, np.uint16)
        for j0 in range(0, n, width):
            if i0 + rows <= m and j0 + width <= n and m % 2 == 0:
                at = (b * m + i0) * n + j0
                for r in range(width):
                    microkernel.pair_units(width, flat_src, at + 2 * r * n, at + (2 * r + 1) * n, pairs, r * rows)
                microkernel.transpose_tile(width, pairs, 0, rows, flat_out, (b * n + j0) * m + i0, m)
            else:
                for i in range(i0, min(i0 + rows, m)):
                    for j in range(j0, min(j0 + width, n)):
                        out[b, j, i] = src[b, i, j]


def _flat(a: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(a 1-D view from ``a``'s first element over all of it, row stride, column stride) in
    elements; ``a`` copied first where its strides are negative or not whole elements."""
    if a.flags.c_contiguous:                     # a view without as_strided's 5-8 µs
        return a.reshape(-1), a.shape[1], 1
    if a.flags.f_contiguous:
        return a.T.reshape(-1), 1, a.shape[0]
    if min(a.strides) < 0 or any(s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    rows, cols = (s // a.itemsize for s in a.strides)
    span = (a.shape[0] - 1) * rows + (a.shape[1] - 1) * cols + 1 if a.size else 1
    return np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,)), rows, cols


def _packed(b: np.ndarray, nr: int, depth: int) -> np.ndarray:
    """B (K, N) as (panels, K/depth, nr*depth): each nr-column panel contiguous, K in pairs
    interleaved per lane for ``depth`` 2, zero past K and N (a block of the engine's cache)."""
    flat, ld, step = _flat(b)
    k, n = b.shape
    shape = (-(-n // nr), -(-k // depth), nr * depth)
    out = workspace.empty(math.prod(shape), b.dtype).reshape(shape)
    if depth == 2 and step == 1:
        _pack_pairs(flat, ld, k, n, out, isa.WIDTH[isa.family()])
    elif ld < step:      # stored along K (a transposed view): read along K
        _pack_across(flat, ld, step, k, n, depth, out, isa.WIDTH[isa.family()])
    else:
        _pack(flat, ld, step, k, n, depth, out)
    return out


def gemm(a: np.ndarray, b: np.ndarray, block: tuple[int, int] | None = None, rounded: bool = False,
         into: np.ndarray | None = None) -> np.ndarray:
    """:func:`_gemm`, its temporaries (packed panels, tiles) back in the engine's cache when it
    returns (:func:`.workspace.part`: a caller's next GEMM takes them)."""
    with workspace.part():
        return _gemm(a, b, block, rounded, into)


def _gemm(a: np.ndarray, b: np.ndarray, block: tuple[int, int] | None = None, rounded: bool = False,
          into: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` in f32 for f32 ``a`` (M, K) and ``b`` (K, N), or bf16 bits (uint16) of both
    (the dot-product kernel on pairs along K): a (M, N) view of a padded f32 array; with
    ``rounded`` (bf16 operands) a (M, N) array of bf16 bits instead, each value rounded once (to
    nearest even) as its tile is done, no f32 result in memory. ``a`` is
    read where it lies when its elements are evenly spaced in memory (any 2-D strided view of
    f32; bf16 with adjacent values along an even K), else copied once (bf16: into pairs); B is
    packed, but for an f32 deep reduction (:func:`deep`) whose B has whole nr-panels of adjacent
    columns (read in place: packing it was a pass over the larger operand). A deep reduction
    with N > M (a weights gradient) runs as ``(b^T a^T)^T``, packing the smaller operand, on the
    block :func:`blocks` picks for it (not ``block``, which is for the untransposed product);
    so does a B stored along K (the transposed weights of a data gradient) with at least
    ``TUNING.gemm_swap_ratio`` times A's rows as columns (few positions: mb 1). Measured on a
    Zen 4, dW of 64 x 256 over 50176 positions f32 66 -> 113 GFLOP/s, bf16 209 -> 239; 128 x 512
    over 12544 f32 78 -> 140, bf16 298 -> 333 (docs/engine-measurements.md).
    ``into``: a C-contiguous (M, N) array of the result's type (f32; with ``rounded``, bf16 bits)
    that takes the result and is returned, the kernels storing their tiles there (those at its
    edges from a tile in L1) where the items do not split K, else copied from the result (an
    image of NCX data: the padded result and its copy took half of a 1x1 data gradient's time)."""
    want = np.uint16 if rounded and a.dtype == np.uint16 else np.float32
    if into is not None and (into.dtype != want or not into.flags.c_contiguous
                             or into.shape != (a.shape[0], b.shape[1])):
        raise ValueError(f"gemm into: expected a C-contiguous {np.dtype(want)} {(a.shape[0], b.shape[1])} array "
                         f"(rounded={rounded}), got {into.dtype} {into.shape}")
    bf16 = a.dtype == np.uint16
    m, k = a.shape
    n = b.shape[1]
    swap = m and n >= TUNING.gemm_swap_ratio * m and b.strides[0] < b.strides[1] and \
        (not bf16 or k >= TUNING.gemm_swap_ratio * m)     # bf16: measured so with NumPy transposing the result
    if n > m and deep(m, k, n) or swap:
        # a deep reduction (a weights gradient): pack the smaller operand; or B stored along K,
        # far larger than A: read B in place. Either way (b^T a^T)^T, transposed in tiles.
        return _into(into, _transposed(gemm(b.T, a.T, rounded=rounded)))
    depth = 2 if bf16 else 1
    bl = blocks(m, k, n, a.dtype.itemsize, block)
    rounding = rounded and bf16 and bl.k_chunks == 1
    direct = rounding or into is not None and bl.k_chunks == 1             # the kernels store into ``out``
    mpad = -(-m // bl.rows) * bl.rows
    out = into if direct and into is not None else workspace.result((m, n) if rounding else (0, 0), np.uint16)
    several = direct and -(-k // depth) > bl.kc // depth                   # tiles kept over several K steps
    panels = -(-n // bl.nr)
    shape = (pool.threads(), bl.mc, -(-panels // bl.shares) * bl.nr) if several else (0, 0, 0)
    scratch = workspace.empty(math.prod(shape), np.float32).reshape(shape)
    c = workspace.result((bl.k_chunks * mpad, -(-n // bl.nr) * bl.nr) if not direct else (0, 0), np.float32)
    if not (m and k and n):
        return _into(into, np.zeros((m, n), np.uint16 if rounded and bf16 else np.float32))
    bflat, ldb, bcol = _flat(b)
    # a deep bf16 reduction whose items each own a chunk of K: B's pairs packed per K step
    steps_b = bf16 and bcol == 1 and bl.k_chunks > 1 and bl.m_blocks == 1 and bl.shares == 1
    bpack = workspace.empty(pool.threads() * (bl.kc // 2) * panels * bl.nr if steps_b else 0, np.uint32)
    if steps_b:
        bp, kd, poff, bstep = bflat, -(-k // 2), 0, bl.nr * 2
    elif not bf16 and bcol == 1 and n % bl.nr == 0 and bl.k_chunks > 1 and TUNING.gemm_deep_b_in_place[bl.width]:
        bp, kd, poff, bstep = bflat, k, bl.nr, ldb                     # a deep reduction's B, in place
    else:                                                                  # packed: (panels, K/depth, nr*depth)
        bp = _packed(b, bl.nr, depth)
        kd, poff, bstep = bp.shape[1], bp.shape[1] * bp.shape[2], bl.nr * depth
        bp = bp.reshape(-1)
    flat, lda, astep = _flat(a)
    # bf16 pairs not adjacent, or an f32 deep reduction's A far apart along K (x^T of many channels): packed per block
    pack_a = not (astep == 1 and k % 2 == 0) if bf16 else \
        astep >= TUNING.gemm_pack_stride[isa.family()] and lda == 1
    copy_lda = _copy_lda(bl, lda, a.dtype.itemsize, panels) if not pack_a and astep == 1 else 0
    per_thread = -(-bl.mc * copy_lda * a.dtype.itemsize // 4) if copy_lda else (bl.kc // depth) * bl.mc
    apack = workspace.empty(pool.threads() * per_thread if pack_a or copy_lda else 0, np.uint32)
    _driver(bl.width, bl.rows, bl.vecs, isa.bf16_kernel() if bf16 else 0, direct)(
        bl.k_chunks * bl.m_blocks * bl.shares, flat, lda, astep, m, k, bp, panels, kd, poff, bstep, c, bl.kc, bl.mc,
        bl.m_blocks, depth, bl.shares, bl.by_share, bl.k_chunks, out, scratch,
        apack.reshape(-1, per_thread) if pack_a or copy_lda else apack.reshape(0, 0), copy_lda,
        bpack.reshape(pool.threads(), -1) if steps_b else bpack.reshape(0, 0), ldb, n,
        -(-panels // bl.shares) * min(bl.kc, k) * bl.nr * a.dtype.itemsize <= isa.cache_sizes()[1] // 2)
    if direct:
        return out
    if bl.k_chunks > 1:
        c = np.add.reduce(c.reshape(bl.k_chunks, mpad, -1), axis=0)
    if rounded and bf16:
        return _into(into, casts.from_f32(np.ascontiguousarray(c[:m, :n]), casts.BFLOAT16).view(np.uint16))
    return _into(into, c[:m, :n])


def _into(into: np.ndarray | None, result: np.ndarray) -> np.ndarray:
    """``result``, or ``into`` holding a copy of it."""
    if into is None:
        return result
    np.copyto(into, result)
    return into
