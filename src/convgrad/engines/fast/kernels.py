"""Row-blocked kernels over "taps": shifted row slices of flat (rows, channels) buffers.

A tap ``t = (s, off)`` names the rows ``src[s][m + off]`` that feed row m. With grouped channels
(``G`` groups of ``Ci`` input and ``Co`` output channels per row) and tap weights ``W[t]`` of
shape ``(G, Ci, Co)``:

- :func:`accumulate`:  ``out[m] = sum_t src[s_t][m + off_t] @ W[t]``        (forward, backward data)
- :func:`reduce`:      ``dW[t]  = sum_m src[s_t][m + off_t]^T @ dy[m]``     (backward weights)
- :func:`reduce_gathered`: the same sum for narrow inputs, over the output rows: blocks of dy
  as it lies, each with its taps gathered from channel-major phase buffers

Rows are processed in blocks of about ``block_bytes`` (a plan parameter) so that every temporary stays in cache and
the extra memory is independent of the problem size (a single tap has no temporaries: one
block). Within a block the taps are taken ``per_gemm`` at a time: with one tap per GEMM the
operands are views (no copy); with several the taps' rows are gathered side by side into one
``(B, per_gemm*Ci)`` operand (``(per_gemm*Ci, B)`` for :func:`reduce_gathered`), so that narrow
channel counts still give BLAS a deep reduction (a blocked im2col). The GEMMs of a block sum
into one output tile inside BLAS (``beta = 1``, :mod:`.blas`), with no scratch product to add.
When instead the *outputs* are the narrow side (``Co < min(Ci, TUNING.gemm_depth)``, e.g. the data
gradient of a 3-channel first layer), :func:`accumulate` spreads: one GEMM
``src @ [W_t1 | W_t2 | ...]`` per cluster of nearby taps, then the narrow per-tap results are
summed at their shifts (:func:`spread_scattered` computes a first layer's backward data that
way over blocks of dy's own rows, adding into the phase buffers). Depthwise problems (``Ci = Co = 1``) are no GEMM at all: see :mod:`.depthwise`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from ... import casts
from . import blas, columns
from .tuning import TUNING

__all__ = ["taps_per_gemm", "block_rows", "spreads", "product", "accumulate", "reduce", "reduce_gathered",
           "spread_scattered"]

Taps = Sequence[tuple[int, int]]


def taps_per_gemm(taps: int, channels: int, reduces: bool = False) -> int:
    """How many taps one GEMM of :func:`accumulate` (or with ``reduces``, :func:`reduce`) takes:
    one if ``channels`` reach ``TUNING.gemm_depth`` (``reduce_views``), else enough for
    ``gemm_depth`` (``reduce_depth``) values, split evenly."""
    views, depth = (TUNING.reduce_views, TUNING.reduce_depth) if reduces else (TUNING.gemm_depth, TUNING.gemm_depth)
    want = 1 if channels >= views else min(taps, math.ceil(depth / channels))
    gemms = math.ceil(taps / want)
    return math.ceil(taps / gemms)


def block_rows(row_bytes: int, rows: int, block_bytes: int, taps: int = 2) -> int:
    """Rows per block so that one block operand holds about ``block_bytes`` (at least
    ``TUNING.min_block_rows``); all rows
    for a single tap (its GEMM runs on views, with no temporaries to keep in cache)."""
    return max(1, rows if taps == 1 else min(rows, max(TUNING.min_block_rows, block_bytes // max(1, row_bytes))))


def spreads(taps: int, ci: int, co: int) -> bool:
    """Whether :func:`accumulate` takes its narrow-output path (``_spread``)."""
    return taps > 1 and co < min(ci, TUNING.gemm_depth)


def _grouped(rows: np.ndarray, groups: int) -> np.ndarray:
    """View (B, G*C) rows as (G, B, C)."""
    return rows.reshape(rows.shape[0], groups, -1).transpose(1, 0, 2)


def channel_major(rows: np.ndarray) -> bool:
    """Whether a (rows, C) matrix is stored channel by channel (as NCX data is)."""
    return rows.ndim == 2 and rows.strides[0] < rows.strides[1]


def _carve(flat: np.ndarray, groups: int, rows: int, inner: tuple[int, ...], by_channel: bool) -> np.ndarray:
    """A (G, rows, *inner) array on the front of ``flat``, rows innermost if ``by_channel`` (so
    that copies from and to channel-major buffers run along contiguous memory)."""
    size = groups * rows * int(np.prod(inner))
    if by_channel:
        return flat[:size].reshape(groups, *inner, rows).transpose(0, len(inner) + 1, *range(1, len(inner) + 1))
    return flat[:size].reshape(groups, rows, *inner)


def _operand(srcs: Sequence[np.ndarray], taps: Taps, a: int, b: int, groups: int,
             col: np.ndarray | None) -> np.ndarray:
    """(G, B, len(taps)*Ci) operand of rows a..b: a view for one tap, else gathered into the flat
    buffer ``col``."""
    if len(taps) == 1:
        s, off = taps[0]
        return _grouped(srcs[s][a + off:b + off], groups)
    first = srcs[taps[0][0]]
    block = _carve(col, groups, b - a, (len(taps), first.shape[1] // groups), channel_major(first))
    for j, (s, off) in enumerate(taps):
        block[:, :, j] = _grouped(srcs[s][a + off:b + off], groups)
    return block.reshape(groups, b - a, -1)


def product(target: np.ndarray, lhs: np.ndarray, mat: np.ndarray, accumulate: bool,
            scratch: np.ndarray | None = None) -> None:
    """``target = lhs @ mat``, or with ``accumulate`` ``target += lhs @ mat``, for (G, B, K) @ (G, K, N),
    accumulating in BLAS where it takes the operands as they are, else through ``scratch`` (or a
    temporary)."""
    if len(target) <= TUNING.blas_groups:
        for t, a, m, g in zip(target, lhs, mat, range(len(target))):
            if not blas.addmm(t, a, m, beta=1.0 if accumulate else 0.0):
                _numpy_product(t, a, m, accumulate, None if scratch is None else scratch[g])
    else:
        _numpy_product(target, lhs, mat, accumulate, scratch)


def _numpy_product(target: np.ndarray, lhs: np.ndarray, mat: np.ndarray, accumulate: bool,
                   scratch: np.ndarray | None) -> None:
    if accumulate:
        target += np.matmul(lhs, mat, out=scratch)
    else:
        np.matmul(lhs, mat, out=target)


def _chunks(taps: Taps, per_gemm: int) -> list[Taps]:
    return [taps[i:i + per_gemm] for i in range(0, len(taps), per_gemm)]


def _stack(weights: np.ndarray, per_gemm: int, dtype: np.dtype, first: int) -> np.ndarray:
    """The (G, per_gemm*Ci, Co) matrix in ``dtype`` of the GEMM of taps ``first``, ... of the tap
    weights (T, G, Ci, Co): a view where BLAS takes it as it is (one tap, one group, row- or
    column-major), else a copy."""
    taps = casts.astype(weights[first:first + per_gemm], dtype)
    if len(taps) == 1 and taps.shape[1] == 1 and (taps[0, 0].flags.c_contiguous or taps[0, 0].flags.f_contiguous):
        return taps[0]
    return np.ascontiguousarray(taps.transpose(1, 0, 2, 3)).reshape(taps.shape[1], -1, taps.shape[3])


def _clusters(taps: Taps, window: int) -> list[list[int]]:
    """Tap indices grouped by source, each group spanning at most ``window`` rows of offsets."""
    clusters: list[list[int]] = []
    for t in sorted(range(len(taps)), key=lambda t: taps[t]):
        first = taps[clusters[-1][0]] if clusters else None
        if first is not None and first[0] == taps[t][0] and taps[t][1] - first[1] <= window:
            clusters[-1].append(t)
        else:
            clusters.append([t])
    return clusters


def spread_bytes(block_bytes: int, data_bytes: int) -> int:
    """Bytes of a row block of the narrow-output sums (:func:`_spread`, :func:`spread_scattered`):
    ``TUNING.spread_blocks`` blocks, but no more than the ``data_bytes`` they read (and at least
    one block): on one small image the wide block alone took 5.9x the call's inputs and output
    (mb 1, the first layer's data gradient), at the same speed as a block of the image's size."""
    return min(TUNING.spread_blocks * block_bytes, max(block_bytes, data_bytes))


def _spread(out: np.ndarray, srcs: Sequence[np.ndarray], taps: Taps, weights: np.ndarray, block_bytes: int) -> None:
    """:func:`accumulate` for narrow outputs: per cluster of taps one wide GEMM, then shifted sums."""
    rows, (_, groups, ci, co) = out.shape[0], weights.shape
    step = block_rows(groups * max(ci, len(taps) * co) * out.itemsize, rows,
                      spread_bytes(block_bytes, sum(s.nbytes for s in srcs)))
    clusters = _clusters(taps, step // 4)
    mats = [np.ascontiguousarray(casts.astype(weights[idx], out.dtype).transpose(1, 2, 0, 3)).reshape(groups, ci, -1)
            for idx in clusters]
    span = max(taps[c[-1]][1] - taps[c[0]][1] for c in clusters)
    buf = np.empty(groups * (step + span) * len(taps) * co, out.dtype)
    for a in range(0, rows, step):
        b = min(rows, a + step)
        target = _grouped(out[a:b], groups)
        for i, (idx, mat) in enumerate(zip(clusters, mats)):
            s, lo = taps[idx[0]]
            hi = taps[idx[-1]][1]
            z = _carve(buf, groups, b - a + hi - lo, (mat.shape[2],), channel_major(out))
            np.matmul(_grouped(srcs[s][a + lo:b + hi], groups), mat, out=z)
            for j, t in enumerate(idx):
                piece = z[:, taps[t][1] - lo:taps[t][1] - lo + b - a, j * co:(j + 1) * co]
                if i == 0 and j == 0:
                    target[...] = piece
                else:
                    target += piece


def _rows_read(taps: Taps, live: tuple[int, int] | None, a: int, b: int) -> tuple[int, int]:
    """The rows of a..b at which some of ``taps`` reads a source row inside ``live`` (all of a..b
    without ``live``): outside it every source row read is zero."""
    if live is None:
        return a, b
    return max(a, min(live[0] - off for _, off in taps)), min(b, max(live[1] - off for _, off in taps))


def accumulate(out: np.ndarray, srcs: Sequence[np.ndarray], taps: Taps, weights: np.ndarray,
               per_gemm: int, block_bytes: int, live: tuple[int, int] | None = None) -> None:
    """``out[m] = sum_t srcs[s_t][m + off_t] @ weights[t]`` for every row m of ``out``.

    ``out`` (R, G*Co); ``srcs[s]`` (rows, G*Ci); ``weights`` (T, G, Ci, Co). ``live``: the only
    source rows that may be non-zero; each GEMM then runs over just the rows whose taps read
    some of them (backward data: the first axis's border rows of dx that a kernel offset cannot
    reach, 7-25% of the work on 7x7 and 3-D layers)."""
    rows, groups, ci = out.shape[0], weights.shape[1], weights.shape[2]
    if spreads(len(taps), ci, weights.shape[3]):
        _spread(out, srcs, taps, weights, block_bytes)
        return
    chunks = _chunks(taps, per_gemm)
    step = block_rows(groups * max(per_gemm * ci, weights.shape[3]) * out.itemsize, rows, block_bytes, len(taps))
    starts = range(0, rows, step)
    # one row block: each GEMM's weights are cast just before it (no whole cast copy of them)
    mats = [_stack(weights, per_gemm, out.dtype, i * per_gemm) for i in range(len(chunks))] if len(starts) > 1 else None
    col = np.empty(groups * step * per_gemm * ci, out.dtype) if per_gemm > 1 else None
    tmp = np.empty(groups * step * weights.shape[3], out.dtype) if len(chunks) > 1 else None
    for a in starts:
        b = min(rows, a + step)
        written = False
        for i, chunk in enumerate(chunks):
            lo, hi = _rows_read(chunk, live, a, b)
            if lo >= hi:
                continue
            if not written:  # rows the first GEMM leaves out get nothing but zeros
                out[a:lo] = 0
                out[hi:b] = 0
            mat = mats[i] if mats is not None else _stack(weights, per_gemm, out.dtype, i * per_gemm)
            scratch = _carve(tmp, groups, hi - lo, (weights.shape[3],), channel_major(out)) if written else None
            product(_grouped(out[lo:hi], groups), _operand(srcs, chunk, lo, hi, groups, col), mat, written, scratch)
            written = True
        if not written:
            out[a:b] = 0


def reduce(out: np.ndarray, srcs: Sequence[np.ndarray], taps: Taps, dy: np.ndarray, block_bytes: int) -> None:
    """``out[t] += sum_m srcs[s_t][m + off_t]^T @ dy[m]`` over the rows of ``dy`` (R, G*Co), with
    ``out`` (T, Ci, G, Co), the canonical weights layout (so no weight-sized temporaries): one
    GEMM per tap on views of the sources, over row blocks."""
    rows, (_, ci, groups, co) = dy.shape[0], out.shape
    step = block_rows(groups * max(ci, co) * dy.itemsize, rows, block_bytes, len(taps))
    scratch = np.empty((groups, ci, co), out.dtype)  # for products BLAS cannot sum in place
    for a in range(0, rows, step):
        b = min(rows, a + step)
        rhs = _grouped(dy[a:b], groups)
        for t, (s, off) in enumerate(taps):
            product(out[t].transpose(1, 0, 2), _grouped(srcs[s][a + off:b + off], groups).transpose(0, 2, 1), rhs,
                    True, scratch)


def _dy_blocks(dy: np.ndarray, dtype: np.dtype, step: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(a, b, rows a..b) of ``dy`` (n, *O, C) as (B, C) matrices in ``dtype``, read as it lies:
    a view of NXC rows (16-bit ones widened block by block into one buffer), a view of one
    image's NCX rows, or NCX rows of several images copied channel-major along memory (16-bit
    NCX data is widened first, its blocks being strided)."""
    matrix = dy.reshape(-1, dy.shape[-1]) if dy.flags.c_contiguous else None  # NXC: one (rows, C) matrix
    if matrix is None:
        dy = casts.astype(dy, dtype)
    positions = math.prod(dy.shape[1:-1])
    per_image = dy.reshape(dy.shape[0], positions, dy.shape[-1])  # a view for NXC and NCX memory
    across = None if matrix is not None else np.empty((dy.shape[-1], step), dtype)
    wide = np.empty((step, dy.shape[-1]), dtype) if matrix is not None and dy.dtype != dtype else None
    for a in range(0, dy.shape[0] * positions, step):
        b = min(dy.shape[0] * positions, a + step)
        if wide is not None:  # one buffer for every block: no fresh pages to fault in
            rows = wide[:b - a]
            casts.copy_into(rows, matrix[a:b])
        elif matrix is not None:
            rows = matrix[a:b]
        elif a // positions == (b - 1) // positions:
            rows = per_image[a // positions, a % positions:a % positions + b - a]
        else:
            r = a
            while r < b:
                image, first = divmod(r, positions)
                length = min(positions - first, b - r)
                across[:, r - a:r - a + length] = per_image[image, first:first + length].T
                r += length
            rows = across[:, :b - a].T
        yield a, b, rows


def reduce_gathered(out: np.ndarray, phases: np.ndarray, taps: Taps, grid: columns.Grid, dy: np.ndarray,
                    per_gemm: int, block_bytes: int) -> None:
    """:func:`reduce` for narrow inputs, over the output rows: per block of rows of ``dy``
    (n, *O, G*Co, read as it lies: :func:`_dy_blocks`), its ``per_gemm`` taps at a time gathered
    from the channel-major ``phases`` (:func:`.columns.gather_phases`; ``grid`` places the outputs
    in the frame) into one ``(G, per_gemm*Ci, B)`` operand, so that each GEMM has
    ``per_gemm*Ci`` rows. No frame copy of dy, no GEMM work on junk rows."""
    (_, ci, groups, co), total = out.shape, math.prod(dy.shape[:-1])
    step = block_rows(groups * max(per_gemm * ci, co) * out.itemsize, total, block_bytes)
    col = np.empty(groups * per_gemm * ci * step, out.dtype)
    scratch = np.empty((groups, per_gemm * ci, co), out.dtype)
    for a, b, rows in _dy_blocks(dy, out.dtype, step):
        rhs = _grouped(rows, groups)
        for t in range(0, len(taps), per_gemm):
            chunk = taps[t:t + per_gemm]
            block = col[:groups * len(chunk) * ci * (b - a)].reshape(groups, len(chunk) * ci, b - a)
            columns.gather_phases(phases, block, a, grid, chunk)
            # a view: the taps' rows of dW are (tap, Ci) rows Co apart within a group
            target = out[t:t + len(chunk)].transpose(2, 0, 1, 3).reshape(groups, len(chunk) * ci, co)
            product(target, block, rhs, True, scratch[:, :len(chunk) * ci])


def spread_scattered(phases: np.ndarray, weights: np.ndarray, taps: Taps, grid: columns.Grid, dy: np.ndarray,
                     block_bytes: int) -> None:
    """Backward data into few channels (a first layer's), over the output rows: per block of
    rows of ``dy`` (n, *O, G*Ci, read as it lies: :func:`_dy_blocks`) one GEMM for every tap,
    ``Z = [W_1 | W_2 | ...]^T @ dy^T`` of shape (G, T*Co, B), whose per-tap rows are added into
    the zeroed channel-major ``phases`` at their taps' frame rows (:func:`.columns.scatter_phases`).
    ``weights`` (T, G, Ci, Co). No frame copy of dy, no GEMM work on junk rows, one wide GEMM for
    all phases."""
    (_, groups, ci, co), total = weights.shape, math.prod(dy.shape[:-1])
    mat = np.ascontiguousarray(casts.astype(weights, phases.dtype).transpose(1, 0, 3, 2)).reshape(groups, -1, ci)
    step = block_rows(groups * max(ci, len(taps) * co) * phases.itemsize, total, spread_bytes(block_bytes, dy.nbytes))
    col = np.empty(groups * len(taps) * co * step, phases.dtype)
    for a, b, rows in _dy_blocks(dy, phases.dtype, step):
        z = col[:groups * len(taps) * co * (b - a)].reshape(groups, len(taps) * co, b - a)
        product(z, mat, _grouped(rows, groups).transpose(0, 2, 1), False)
        columns.scatter_phases(z, phases, a, grid, taps)
