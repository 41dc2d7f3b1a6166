"""The bf16 weights gradient on AMX tiles: x transposed once, dy paired once, one GEMM per tap
read from both at the tap's offset.

With x zero-padded and dy placed at the padded grid's origin (zeros elsewhere), both flattened
over the positions f = (n, p0, p1, p2) of the padded grid, a tap of stride 1 (offset ``off_t =
((k0 D0) P1 + k1 D1) P2 + k2 D2``) is one deep GEMM:

    dw[t] = sum_f x[f + off_t] dy[f]^T     (ICg x F x OC; a junk position's dy is zero)

Strides S split x into its S0 S1 S2 phases, ``x_a[n, i] = x[n, S i + a]`` on a grid of Q =
ceil(P / S) positions per axis: the tap at ``e = k D`` reads phase ``a = e mod S`` at offset
``e div S`` of that grid, with dy at its origin, a convolution of stride 1 again (the polyphase
form: every tap of one phase shares that phase's A).

A tile's rows hold 32 consecutive values of K (here positions) of one row of A, and B's tiles
hold pairs of consecutive positions per lane: so x (each phase) is transposed once into chunks
of ``kc`` positions (each chunk's rows run ``max(off_t)`` positions past it, the halo every tap
reads), ``xt[c, i, j] = x[c kc + j, i]``, and tap t's A for chunk c is ``xt[c, :, off_t:off_t +
kc]``, read in place (a row-major A at any element offset: a pair is two adjacent values,
whichever their parity); dy is paired once, a chunk at a time (zeros past the grid: every call
whole tile steps). Every tap, row strip and column panel of a chunk then runs one kernel call
of ``kc/2`` pairs (:func:`.microkernel.run` on a tile block), the chunk's A and B in L2 across
the taps. The threads share the chunks (a partial dw per thread, added at the end; each thread
transposes and pairs its chunk itself) where those partial sums stay small next to x and dy,
else the (tap, panel) blocks of dw, each over every chunk (transposed and paired first).

Few input channels (a first layer's 3) would fill few of a tile's 16 rows: there the last
kernel axis is folded into the channels first (:func:`folded`: ``x_f[.., p, k C + c] = x[.., p
S2 + k D2 - P2, c]``, an im2col along that axis alone, then a convolution of ``K2 C`` channels,
kernel 1 and stride 1 along it).

Before this, each tap ran :func:`.blis.gemm` on the tap's shifted view of x, packing x^T and dy's
pairs again for every tap (docs/engine-measurements.md, Xeon 2026-12-07).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from ... import casts
from ...casts import narrowed
from ...problem import ConvGeometry
from . import blis, direct, isa, microkernel, pool, workspace
from .geometry import spatial, spatial3
from .tuning import TUNING, remembered

__all__ = ["phases", "blocks", "workspace_bytes", "conv_workspace_bytes", "run", "gemms", "folded"]

U16 = np.dtype(np.uint16)
#: bf16 bits four to a 64-bit word: exponent fields, their carry, the sign bits (:data:`.direct.EXPONENT_WORDS`).
_FIELD, _CARRY, _SIGN = direct.EXPONENT_WORDS[casts.BFLOAT16]


def phases(g: ConvGeometry) -> tuple[tuple[int, int, int], dict[tuple[int, int, int], list[tuple[int, int]]]]:
    """(the phase grid Q, per phase ``a`` the (tap index, offset in the flattened Q grid) of its
    taps, in the kernel's row-major order): the module docstring's polyphase form (one phase,
    Q = P, for stride 1)."""
    size, s = spatial(g.padded_size, 1), spatial(g.strides, 1)
    d, kernel = spatial(g.dilations, 1), spatial(g.kernel, 1)
    q = tuple(-(-size[a] // s[a]) for a in range(3))
    groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for t, k in enumerate(itertools.product(*(range(n) for n in kernel))):
        e = [k[a] * d[a] for a in range(3)]
        phase = tuple(e[a] % s[a] for a in range(3))
        groups.setdefault(phase, []).append((t, ((e[0] // s[0]) * q[1] + e[1] // s[1]) * q[2] + e[2] // s[2]))
    return q, groups


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
    else:        # as many chunks to each share
        chunks = -(-chunks // shares) * shares
        per = -(-positions // chunks)
        kc = -(-per // 32) * 32
        chunks = -(-positions // kc)
    return _Blocks(rows, vecs, kc, shares, icpad, ocpad, chunks, -(-(kc + halo) // 32) * 32)


def workspace_bytes(positions: int, ic: int, oc: int, taps: int, halo: int, parts: int = 1) -> int:
    """Extra bytes of :func:`gemms` over ``parts`` grids of ``positions``: x's chunks transposed
    (with their halos and padded rows) and dy's pairs, per share or all of them; with shares,
    the f32 sums per share and their total (the blocks of dw's items: one block per thread)."""
    bl = blocks(positions, ic, oc, taps, halo)
    held = bl.shares if bl.shares > 1 else bl.chunks
    copies = held * bl.ocpad * bl.kc + (bl.shares if bl.shares > 1 else parts * bl.chunks) * bl.icpad * bl.span
    sums = (bl.shares + 1) * taps * bl.icpad * bl.ocpad if bl.shares > 1 else pool.threads() * bl.icpad * 16 * bl.vecs
    return 2 * copies + 4 * sums + (64 << 10)


def folded(g: ConvGeometry) -> ConvGeometry | None:
    """The geometry of ``g`` with its last kernel axis folded into the channels (the module
    docstring), where that fills at least ``TUNING.tap_gemm_fold`` times the tile rows the
    unfolded channels do (``ICg K2`` channels padded to 16 against ``K2`` taps of ICg padded to
    16 each); else None."""
    k2 = g.kernel[-1]
    if k2 == 1 or g.groups != 1 or -(-g.ic * k2 // 16) * TUNING.tap_gemm_fold > k2 * -(-g.ic // 16):
        return None
    last = lambda v, one: (*v[:-1], one)  # noqa: E731
    return ConvGeometry(g.n, 1, g.ic * k2, g.oc, last(g.in_size, g.out_size[-1]), g.out_size, last(g.kernel, 1),
                        last(g.strides, 1), last(g.dilations, 1), last(g.pads_begin, 0), last(g.pads_end, 0))


def conv_workspace_bytes(g: ConvGeometry) -> int:
    """:func:`workspace_bytes` of :func:`run` (x and dy as contiguous copies where they are not;
    a folded x, :func:`folded`)."""
    fg = folded(g)
    if fg is not None:
        return 2 * math.prod(fg.x_shape) + conv_workspace_bytes(fg)
    q, groups = phases(g)
    halo = max(off for taps in groups.values() for _, off in taps)
    return 2 * (math.prod(g.x_shape) + math.prod(g.y_shape)) + workspace_bytes(
        g.n * math.prod(q), g.ic, g.oc, math.prod(g.kernel), halo, len(groups))


def run(g: ConvGeometry, x: np.ndarray, dy: np.ndarray, rounded: bool, check: bool = True
        ) -> tuple[np.ndarray, bool]:
    """dw (*K, ICg, OC) of a bf16 weights gradient of one group (the module docstring): f32, or
    bf16 bits rounded once with ``rounded``; and, with ``check``, whether every value of x the
    grids read was finite (where not, a junk position's zero times Inf may have made a NaN: the
    caller runs another path; a 1x1 unpadded problem has no junk positions)."""
    fg = folded(g)
    if fg is not None:       # the last kernel axis as channels (:func:`folded`)
        x3 = spatial3(x.view(U16))
        xf = workspace.empty(math.prod(fg.x_shape), U16).reshape(*x3.shape[:3], g.out_size[-1], fg.ic)
        _fold_last_axis(x3.reshape(-1, *x3.shape[3:]), xf.reshape(-1, *xf.shape[3:]), g.strides[-1],
                        g.dilations[-1], g.pads_begin[-1])
        dw, finite = run(fg, xf.view(x.dtype).reshape(fg.x_shape), dy, rounded, check)
        return dw.reshape(g.w_shape), finite
    x3 = spatial3(blis.channels_last(x).view(U16))
    dw, finite = gemms(x3.reshape(-1), g.ic, _layout(g, pool.threads(), isa.family()),
                       spatial3(blis.channels_last(dy).view(U16)), rounded, check)
    return (dw.view(x.dtype) if rounded else dw).reshape(g.w_shape), finite


class Layout(NamedTuple):
    """What :func:`gemms` runs for a geometry: its blocks, per phase part the grid of x it maps
    (N, Q, strides, phase, pads, size), each offset's part and its slot in dw, and dy's grid."""
    blocks: _Blocks
    grids: np.ndarray
    offsets: np.ndarray
    part_of: np.ndarray
    slots: np.ndarray
    dgrid: np.ndarray


@remembered(lambda: TUNING)
def _layout(g: ConvGeometry, threads: int, family: str) -> Layout:
    """:func:`run`'s :class:`Layout` for ``g`` (under ``threads`` and the kernel ``family``, which
    the blocks depend on); remembered: 40-60 µs of Python an mb-1 call."""
    q, groups = phases(g)
    s, pads, size = spatial(g.strides, 1), spatial(g.pads_begin, 0), spatial(g.in_size, 1)
    grids = np.array([(g.n, *q, *s, *a, *pads, *size) for a in groups], np.int64)
    offsets = [off for taps in groups.values() for _, off in taps]
    part_of = [i for i, taps in enumerate(groups.values()) for _ in taps]
    bl = blocks(g.n * math.prod(q), g.ic, g.oc, len(offsets), max(offsets))
    return Layout(bl, grids, np.array(offsets, np.int64), np.array(part_of, np.int64),
                  np.array([t for taps in groups.values() for t, _ in taps], np.int64),
                  np.array((g.n, *q, *spatial(g.out_size, 1)), np.int64))


@microkernel.cached_njit(parallel=True)
def _fold_last_axis(x, out, stride, dilation, pad):  # pragma: no cover - compiled
    """``out[r, p, k C + c] = x[r, p stride + k dilation - pad, c]`` (zero outside x's ``W``) for
    ``x`` (rows, W, C) and ``out`` (rows, P, K C) of 16-bit bits, rows in parallel."""
    rows, w, c = x.shape
    positions, kc = out.shape[1], out.shape[2]
    for r in numba.prange(rows):
        for p in range(positions):
            for k in range(kc // c):
                col = p * stride + k * dilation - pad
                dst = out[r, p, k * c:(k + 1) * c]
                if 0 <= col < w:
                    src = x[r, col]
                    for i in range(c):
                        dst[i] = src[i]
                else:
                    for i in range(c):
                        dst[i] = 0


def gemms(x: np.ndarray, ic: int, layout: Layout, dy: np.ndarray, rounded: bool, check: bool = True
          ) -> tuple[np.ndarray, bool]:
    """``a[off:off + F]^T @ d`` for each grid of ``layout`` and each of its offsets, ``a`` the
    (F, IC) positions of x (flat canonical bf16 bits, ``ic`` channels) that the grid maps
    (:func:`_transpose_chunk`; rows past F zeros), ``d`` dy (canonical (N, O0, O1, O2, OC) bf16
    bits) at the origin of the grid of F positions, zeros elsewhere: as (taps, IC, OC) f32, or
    bf16 bits rounded once with ``rounded``, the i-th offset's at its slot; and, with ``check``,
    whether every x value transposed (those the grids read) was finite (else True)."""
    oc, bl, taps = dy.shape[-1], layout.blocks, len(layout.offsets)
    nr = 16 * bl.vecs
    panels = -(-oc // nr)
    held = bl.shares if bl.shares > 1 else bl.chunks   # shares make their chunk's copies themselves
    bp = workspace.empty(held * panels * bl.kc * nr, U16).reshape(held, panels, bl.kc // 2, 2 * nr)
    xt = workspace.empty(held * (1 if bl.shares > 1 else len(layout.grids)) * bl.icpad * bl.span, U16).reshape(
        -1, held, bl.icpad, bl.span)
    xfull = np.zeros(bl.shares, np.uint64)             # x's exponent checks, per share
    if bl.shares == 1:                                 # every chunk, before the kernels
        _paired_chunks(dy.reshape(-1), oc, layout.dgrid, bl.kc, bp.reshape(bl.chunks, -1), nr,
                       max(1, -(-2 * pool.threads() // bl.chunks)))
        for i, grid in enumerate(layout.grids):
            _transposed_chunks(x, ic, grid, bl.kc, xt[i], xfull, check)
    shape = (bl.shares, taps, bl.icpad, bl.ocpad) if bl.shares > 1 else (0, 0, 0, 0)
    sums = workspace.empty(math.prod(shape), np.float32).reshape(shape)   # each share's first chunk writes them
    out = workspace.result((taps, ic, oc) if bl.shares == 1 else (0, 0, 0), U16 if rounded else np.float32)
    kind = casts.bits_kind(casts.BFLOAT16) if rounded else casts.F32_VALUES
    _driver(bl.rows, bl.vecs, isa.bf16_kernel())(
        bl.shares if bl.shares > 1 else taps * panels, x, ic, layout.grids, xt.reshape(-1), bl.icpad, bl.span,
        layout.offsets, layout.part_of, dy.reshape(-1), oc, layout.dgrid, bp.reshape(-1), sums, bl.kc, bl.chunks,
        bl.shares, panels, layout.slots, out.view(np.float32) if not rounded else _NO_F32, out if rounded else _NO_U16,
        kind, xfull, check)
    finite = not np.bitwise_or.reduce(xfull) & _SIGN
    if bl.shares == 1:        # the items wrote dw, rounded, in place
        return out, finite
    dw = np.empty((taps, ic, oc), U16 if rounded else np.float32)
    sum_of = np.add.reduce(sums, axis=0)[:, :ic, :oc]
    dw[layout.slots] = casts.from_f32(np.ascontiguousarray(sum_of), casts.BFLOAT16).view(U16) if rounded else sum_of
    return dw, finite


#: The driver's unused result (never written).
_NO_F32, _NO_U16 = np.empty((0, 0, 0), np.float32), np.empty((0, 0, 0), U16)


@numba.njit(inline="always")
def _grid_at(r, q0, q1, q2):  # pragma: no cover - compiled
    """Position ``r`` of an N x Q grid (flattened) as (n, e0, e1, e2)."""
    e2, r = r % q2, r // q2
    e1, r = r % q1, r // q1
    return r // q0, r % q0, e1, e2


@numba.njit(inline="always")
def _grid_next(n, e0, e1, e2, q0, q1, q2):  # pragma: no cover - compiled
    """The grid position after (n, e0, e1, e2)."""
    e2 += 1
    if e2 == q2:
        e2, e1 = 0, e1 + 1
        if e1 == q1:
            e1, e0 = 0, e0 + 1
            if e0 == q0:
                e0, n = 0, n + 1
    return n, e0, e1, e2


@microkernel.cached_njit(parallel=True)
def _paired_chunks(dy, oc, dgrid, kc, out, nr, parts):  # pragma: no cover - compiled
    """:func:`_pair_chunk` of every chunk c into ``out[c]``, each chunk's pairs in ``parts``
    ranges, all in parallel (one chunk, at mb 1: 28 -> 15 µs for 64 channels at 56x56)."""
    panels = out.shape[1] // (kc * nr)
    half = kc // 2
    for item in numba.prange(out.shape[0] * parts):
        c, part = item // parts, item % parts
        _pair_chunk(dy, oc, dgrid, kc, c, out[c], 0, panels, nr, half * part // parts, half * (part + 1) // parts)


@numba.njit(inline="always")
def _pair_chunk(dy, oc, dgrid, kc, c, out, base, panels, nr, i0, i1):  # pragma: no cover - compiled
    """Pairs ``i0 .. i1`` of grid positions ``c kc .. c kc + kc`` of dy, as (panels, kc/2, ``nr``
    lanes, 2) from ``out[base]``: ``dgrid`` = (N, Q0, Q1, Q2, O0, O1, O2), position (n, e) on the
    N x Q grid is dy's (n, e) where e < O (zero elsewhere, past the grid and past ``oc``); 16
    lanes of two rows at a time (:func:`.microkernel.pairs32`)."""
    n, e0, e1, e2 = _grid_at(c * kc + 2 * i0, dgrid[1], dgrid[2], dgrid[3])
    half = kc // 2
    rows = np.empty(2, np.int64)
    for i in range(i0, i1):
        for h in range(2):
            inside = n < dgrid[0] and e0 < dgrid[4] and e1 < dgrid[5] and e2 < dgrid[6]
            rows[h] = ((n * dgrid[4] + e0) * dgrid[5] + e1) * dgrid[6] + e2 if inside else -1
            n, e0, e1, e2 = _grid_next(n, e0, e1, e2, dgrid[1], dgrid[2], dgrid[3])
        ra, rb = rows[0], rows[1]
        for p in range(panels):
            dst = base + (p * half + i) * 2 * nr
            for l in range(0, nr, 16):
                col = p * nr + l
                if col + 16 <= oc and ra >= 0 and rb >= 0:
                    microkernel.pairs32(16, dy, ra * oc + col, rb * oc + col, out, dst + 2 * l)
                    continue
                for j in range(16):
                    inside = col + j < oc
                    out[dst + 2 * (l + j)] = dy[ra * oc + col + j] if ra >= 0 and inside else 0
                    out[dst + 2 * (l + j) + 1] = dy[rb * oc + col + j] if rb >= 0 and inside else 0


@microkernel.cached_njit(parallel=True)
def _transposed_chunks(src, ic, grid, kc, out, full, check):  # pragma: no cover - compiled
    """:func:`_transpose_chunk` of every chunk c into ``out[c]``, items of a chunk and a group
    of 16-channel blocks in parallel; ``full[0]`` ORed with their exponent checks."""
    chunks, icpad, span = out.shape
    blocks = -(-icpad // 16)
    groups = min(blocks, -(-16 // chunks))     # items of several channel blocks: the rows found once
    flat = out.reshape(-1)
    seen = np.zeros(chunks * groups, np.uint64)
    for item in numba.prange(chunks * groups):
        c, group = item // groups, item % groups
        seen[item] = _transpose_chunk(src, ic, grid, kc, c, flat, c * icpad * span, icpad, span,
                                      blocks * group // groups, blocks * (group + 1) // groups, check)
    for item in range(chunks * groups):
        full[0] |= seen[item]


@numba.njit(inline="always")
def _transpose_chunk(src, ic, grid, kc, c, out, base, icpad, span, b0, b1, check):  # pragma: no cover - compiled
    """``out[base + i span + j]`` (i of channel blocks ``b0 .. b1`` of 16, j < ``span``) =
    channel i of the x position that grid position ``f = c kc + j`` maps (zero for padding, past
    the grid and past ``ic``; ``span`` a multiple of 32): ``grid`` = (N, Q0, Q1, Q2, S0, S1, S2,
    a0, a1, a2, pads_begin 0-2, X0, X1, X2): f = (n, e0, e1, e2) on the N x Q grid reads x[n, S e
    + a - pads] of ``src`` (flat canonical (N, X0, X1, X2, ic) 16-bit bits). 16 channels x 32 positions at a time,
    their rows found once for all blocks: each pair of positions joined into 32-bit units
    (:func:`.microkernel.pairs32`), the 16 x 16 units transposed in registers
    (:func:`.microkernel.transpose32`); pairs at padding, and past ``ic``, one value at a time.
    With ``check``, returns the OR of ``(v & 0x7F80) + 0x80`` over the values it wrote, four to
    a 64-bit word: bit 15 of a word's quarter set where one was NaN or Inf
    (:data:`.direct.EXPONENT_WORDS`); else 0 (3-5 % of a 1x1 gradient at mb 16)."""
    units = np.empty(512, np.uint16)
    words = units.view(np.uint64)
    at = np.empty(32, np.int64)
    seen = np.uint64(0)
    for j0 in range(0, span, 32):
        n, e0, e1, e2 = _grid_at(c * kc + j0, grid[1], grid[2], grid[3])
        for j in range(32):       # each position's x row, or -1
            p0, p1, p2 = (grid[4] * e0 + grid[7] - grid[10], grid[5] * e1 + grid[8] - grid[11],
                          grid[6] * e2 + grid[9] - grid[12])
            inside = n < grid[0] and 0 <= p0 < grid[13] and 0 <= p1 < grid[14] and 0 <= p2 < grid[15]
            at[j] = ((n * grid[13] + p0) * grid[14] + p1) * grid[15] + p2 if inside else -1
            n, e0, e1, e2 = _grid_next(n, e0, e1, e2, grid[1], grid[2], grid[3])
        for b in range(b0, b1):
            i0 = b * 16
            row = base + i0 * span
            for p in range(16):
                ra, rb = at[2 * p], at[2 * p + 1]
                if i0 + 16 <= ic and ra >= 0 and rb >= 0:
                    microkernel.pairs32(16, src, ra * ic + i0, rb * ic + i0, units, p * 32)
                    continue
                for i in range(16):
                    inside = i0 + i < ic
                    units[p * 32 + 2 * i] = src[ra * ic + i0 + i] if ra >= 0 and inside else 0
                    units[p * 32 + 2 * i + 1] = src[rb * ic + i0 + i] if rb >= 0 and inside else 0
            if check:
                for q in range(128):
                    seen |= (words[q] & _FIELD) + _CARRY
            microkernel.transpose32(16, units, 0, 32, out, row + j0, span)
    return seen


@functools.cache
def _driver(rows: int, vecs: int, native: int) -> Callable:
    """The kernel calls of :func:`run` for one tile block, run per item in the pool (item: a
    share of the chunks, or one (tap, panel) block of dw over every chunk)."""
    def body(item, x, ic, grids, xt, icpad, lda, taps, part_of, dy, oc, dgrid, bp, sums, kc, chunks, shares,
             panels, slots, out, out16, kind, xfull, check):  # pragma: no cover - compiled
        """``sums[share, t, i, o] = sum_f A_t[c, i, off_t + j] B[f][o]`` over the item's chunks c
        (f = c kc + j; the first chunk's call writes, the others add), taps t and panels, A_t x
        transposed on its part's grid (``grids[part_of[t]]``, rows ``lda`` apart); B per chunk as
        (panels, kc/2 pairs, ``nr`` lanes, 2), zeros past the grid (whole tile steps, no vector
        tail). Items of (tap, panel) over every chunk: ``xt`` (parts, chunks, icpad, lda) and
        ``bp`` (chunks, ...) hold every chunk, made before; each item's sums in a block of its own, written at its end into dw
        (``out`` f32 or ``out16`` bf16 bits of ``kind``, tap t at ``slots[t]``). Shares of the
        chunks: ``xt`` (shares, icpad, lda) and ``bp`` (shares, ...), each share pairing dy's
        chunk and transposing x's for each part there just before their kernels
        (:func:`_pair_chunk`, :func:`_transpose_chunk`: in its L2), into ``sums``; ``xfull[item]``
        ORed with the exponent checks of the x they transposed."""
        nr = vecs * 16
        zero = np.zeros(1, np.int64)
        strips = icpad // rows
        total = taps.shape[0]
        own = shares == 1                       # the item's (tap, panel) block: sums of its own
        flat = workspace.line_empty(icpad * nr, np.float32) if own else sums.reshape(-1)
        ldc = nr if own else sums.shape[3]
        half = kc // 2
        panel_stride = half * nr * 2
        chunk_stride = icpad * lda
        if shares > 1:
            share, c0, c1 = item, chunks * item // shares, chunks * (item + 1) // shares
            t0, t1, p0, p1 = 0, total, 0, panels
        else:
            share, c0, c1 = 0, 0, chunks
            t0, p0 = item // panels, item % panels
            t1, p1 = t0 + 1, p0 + 1
        for c in range(c0, c1):
            bat = c * panels * panel_stride
            if shares > 1:
                bat = share * panels * panel_stride
                _pair_chunk(dy, oc, dgrid, kc, c, bp, bat, panels, nr, 0, half)
            part = -1
            for t in range(t0, t1):
                if part_of[t] != part:
                    part = part_of[t]
                    at = (part * chunks + c) * chunk_stride
                    if shares > 1:
                        at = share * chunk_stride
                        xfull[item] |= _transpose_chunk(x, ic, grids[part], kc, c, xt, at, icpad, lda, 0,
                                                        icpad // 16, check)
                for s in range(strips):
                    for p in range(p0, p1):
                        coff = s * rows * ldc if own else ((share * total + t) * icpad + s * rows) * ldc + p * nr
                        microkernel.run(16, rows, vecs, native, flat, coff, ldc, xt, at + s * rows * lda + taps[t],
                                        lda, 2, bp, bat + p * panel_stride, nr * 2, zero, zero, 1, half, int(c > c0))
        if own:                                  # the block into dw, rounded once for bf16
            lanes = min(nr, oc - p0 * nr)
            for i in range(ic):
                row = flat[i * nr:i * nr + lanes]
                if out16.shape[0] > 0:
                    o16 = out16[slots[t0], i, p0 * nr:p0 * nr + lanes]
                    for j in range(lanes):
                        o16[j] = narrowed(row[j], kind)
                else:
                    o = out[slots[t0], i, p0 * nr:p0 * nr + lanes]
                    for j in range(lanes):
                        o[j] = row[j]
    return microkernel.parallel_items(body)
