"""Register-blocked micro-kernels (f32 accumulation), emitted as LLVM IR from a numba ``@intrinsic``.

One kernel of block ``R x V`` and vector width ``W`` holds ``R*V`` accumulators of ``W`` f32
lanes in vector registers and computes, for rows ``r < R``, vectors ``v < V``, lanes ``l < W``
(a batch-reduce GEMM: ``ta``/``tb`` are offset tables, e.g. the taps of a convolution)::

    c[coff + r*ldc + v*W + l] = beta * c[...] + sum_{t < ntaps} sum_{i < k}
                                 a[aoff + ta[t] + r*lda + i*astep] * b[boff + tb[t] + i*bstep + v*W + l]

in the order ``t`` then ``i`` (ascending; :data:`UNROLL` steps an iteration, and where the rows
are adjacent, ``lda`` 1 or a bf16 pair's 2, loops of their own with ``lda`` a constant; the bf16
stand-in one loop, a step an iteration: the same sums, a sixth of its IR to compile), one
fused multiply-add (``llvm.fma.v<W>f32``) per product; ``a`` is broadcast, ``b`` read as ``V``
vectors; the accumulators are loaded from ``c`` once (``accumulate`` != 0: beta = 1) or start
at zero without reading ``c`` (beta = 0: a GEMM's first reduction step needs no zeroing pass),
and are stored once per call.

**bf16** (``a`` and ``b`` uint16 arrays holding bf16 bits): each step ``i`` consumes a *pair* of
reduction values, ``a[p]`` and ``a[p+1]`` (``p = aoff + ta[t] + r*lda + i*astep``) against ``b``'s
interleaved pairs ``b[q + 2*(v*W + l)]``, ``b[q + 2*(v*W + l) + 1]`` (``q = boff + tb[t] +
i*bstep``), into f32 accumulators, as ``VDPBF16PS`` does (Intel SDM: the odd pair's product is
added first, then the even pair's, each rounded once to f32). Where the host has AVX512_BF16 the
kernel is that instruction (``llvm.x86.avx512bf16.dpbf16ps.512``, ``W`` = 16); elsewhere (and
in :data:`run_standin` everywhere) a plain-IR stand-in computes it bit for bit: as measured on a
Zen 4's ``vdpbf16ps`` (docs/engine-measurements.md), denormal inputs (``a``, ``b`` and the accumulator) count
as zeros of their sign, each pair's two products are added one at a time (odd first) with one
rounding each (RNE), and a sum that is tiny after rounding to 24 bits with an unbounded exponent
(below 2^-126) becomes a zero of its sign. Offsets and strides count uint16 elements.

**Rounded stores** (``c`` a uint16 array): the accumulators start at zero (``accumulate`` is
ignored) and are stored as bf16 bits, each rounded once to nearest even in the registers
(``(u + 0x7FFF + odd) >> 16`` on the f32 bits, a NaN made quiet), as
:func:`convgrad.casts.bf16_bits` rounds: no f32 tile passes through memory. ``coff``/``ldc``
count uint16 elements then.

Blocks (:data:`BLOCKS`) fit the register file: ``R*V`` accumulators + ``V`` operands + one
broadcast <= 16 ymm registers (``W`` = 8, AVX2) or 31 of the 32 zmm (``W`` = 16, AVX-512). A 16-wide kernel
on an AVX2 host is legalised by LLVM into pairs of 8-wide instructions (correct, not fast).

Each caller compiles only the kernels it uses: ``width``, ``rows`` and ``vecs`` must be
compile-time constants at the call (closure variables of a driver made per variant, see
:func:`kernel_call`). Callers outside this module are compiled with :func:`cached_njit`, whose
disk cache is keyed on this module's source too (numba checks only the caller's own file).
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path
from typing import Any, Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic

from ... import addresses, casts, kernel_cache
from . import isa, tiles
from .tuning import TUNING

__all__ = ["BLOCKS", "WIDTHS", "block_for", "tile_block_for", "idle", "run", "kernel_call", "cached_njit", "parallel_items",
           "kernel_ir", "fma_peak",
           "register_peak", "SOURCE_DIGEST", "prefetch", "stream_line", "store_fence", "transpose32", "transpose_tile"]

#: Register blocks (rows R, vectors V) per vector width, R*V + V + 1 <= the vector registers.
BLOCKS: dict[int, tuple[tuple[int, int], ...]] = {8: ((8, 1), (6, 2), (4, 3)),
                                                  16: ((16, 1), (14, 2), (8, 3), (7, 3), (6, 4), (3, 4))}
WIDTHS = tuple(BLOCKS)
#: Independent FMA chains of :func:`register_peak` (enough to cover the FMA latency on two pipes).
_CHAINS = {8: 12, 16: 24}
#: sha256 of this module's source, of :mod:`convgrad.casts` (whose rounding callers inline as
#: they store) and of :mod:`convgrad.addresses`: part of the disk-cache key of :func:`cached_njit` callers.
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes() + (Path(__file__).parent / "tiles.py").read_bytes()
                               + Path(casts.__file__).read_bytes() + Path(addresses.__file__).read_bytes()).hexdigest()


def block_for(channels: int, width: int, rows: int | None = None,
              computed: Callable[[int], float] | None = None, loads_weight: float | None = None,
              copy: float = 0.0) -> tuple[int, int]:
    """The block (R, V) for ``channels`` output channels in vectors of ``width`` (and, if given,
    ``rows`` rows to cut into blocks of R): one vector only where that is all there is; else the
    least time per result kept, to the percent: the FMAs computed per one kept (idle lanes and
    rows; ``computed(R)``, the positions a driver computes with blocks of R rows per position it
    keeps, padding columns included, 1 if not given) x (1 + ``loads_weight`` x loads per FMA;
    default ``TUNING.block_loads_weight[width]``) x (1 + ``copy`` where the block's vectors do not
    divide the channels: a GEMM's padded result copied out, per FMA computed); then the most
    accumulators. Measured on a Zen 4
    (docs/engine-measurements.md, "Fifth round", "Seventh round"): 6x4 over 14x2 on 56-wide 3x3 layers (3.6 % padding columns
    against none), 14x2 4-13 % faster on 28- and 14-wide ones (7 % and 13 % padding columns), 6x4
    on the bf16 1x1 GEMMs over thousands of positions, 7x3 on 7-wide rows of 512 channels (one
    idle vector in 33, no padding columns) 20 % faster than 6x4 (12 positions for 7 kept)."""
    vectors = -(-channels // width)
    weight = TUNING.block_loads_weight[width] if loads_weight is None else loads_weight

    def cost(block: tuple[int, int]) -> tuple[float, int]:
        r, v = block
        time = idle(block, channels, width, rows) * (computed(r) if computed else 1.0) \
            * (1 + weight * (r + v) / (r * v)) * (1 + copy if channels % (v * width) else 1.0)
        return round(time, 2), -r * v

    return min((b for b in BLOCKS[width] if b[1] <= vectors and (b[1] > 1 or vectors == 1)), key=cost)


def tile_block_for(channels: int, rows: int | None = None) -> tuple[int, int]:
    """The AMX tile block (:data:`.tiles.TILE_BLOCKS`) for ``channels`` output channels (and
    ``rows`` rows, if given): :func:`block_for`'s rule counted in tiles, the fewest products per
    one kept (:func:`idle`) x (1 + ``TUNING.tile_loads_weight`` x operand tiles per tile product),
    then the most accumulators."""
    vectors = -(-channels // 16)

    def cost(block: tuple[int, int]) -> tuple[float, int]:
        r, v = block
        strips = r // tiles.ROWS
        return round(idle(block, channels, 16, rows) * (1 + TUNING.tile_loads_weight * (strips + v) / (strips * v)),
                     2), -r * v

    return min((b for b in tiles.TILE_BLOCKS if b[1] <= vectors or b == (16, 1)), key=cost)


def idle(block: tuple[int, int], channels: int, width: int, rows: int | None = None) -> float:
    """FMAs block ``(R, V)`` computes per one kept over ``channels`` in vectors of ``width`` (and
    ``rows`` rows cut into blocks of R): its idle lanes and rows."""
    r, v = block
    vectors = -(-channels // width)
    return -(-vectors // v) * v / vectors * ((-(-rows // r) * r / rows) if rows else 1.0)


class _Ops:
    """IR of one reduction step for f32 or bf16 operands (see the module docstring)."""

    def __init__(self, builder: ir.IRBuilder, width: int, bf16: bool, native: bool):
        self.builder, self.width, self.bf16 = builder, width, bf16
        f32, i32 = ir.FloatType(), ir.IntType(32)
        self.acc = ir.VectorType(f32, width)
        self.bits = ir.VectorType(i32, width)
        fma_t = ir.FunctionType(self.acc, [self.acc] * 3)
        self.fma = cgutils.get_or_insert_function(builder.module, fma_t, f"llvm.fma.v{width}f32")
        self.native = bf16 and native
        if not bf16:
            self.a_elem, self.b_vec = f32, self.acc
        else:
            self.a_elem, self.b_vec = i32, ir.VectorType(ir.IntType(16), 2 * width)
        if self.native:
            if width != 16:
                raise ValueError("the AVX512_BF16 dot product is 16 lanes wide")
            dot_t = ir.FunctionType(self.acc, [self.acc, self.b_vec, self.b_vec])
            self.dot = cgutils.get_or_insert_function(builder.module, dot_t, "llvm.x86.avx512bf16.dpbf16ps.512")

    def splat(self, value: ir.Value, vec: ir.VectorType) -> ir.Value:
        b, i32 = self.builder, ir.IntType(32)
        one = b.insert_element(ir.Constant(vec, None), value, ir.Constant(i32, 0))
        return b.shuffle_vector(one, one, ir.Constant(ir.VectorType(i32, vec.count), [0] * vec.count))

    def _to_f32(self, bits32: ir.Value) -> ir.Value:
        return self.builder.bitcast(bits32, self.acc if isinstance(bits32.type, ir.VectorType) else ir.FloatType())

    def operand_b(self, vector: ir.Value):
        """A loaded ``b`` vector, ready for :meth:`step` (bf16 stand-in: its odd and even lanes as f32)."""
        if not self.bf16 or self.native:
            return vector
        b, i32v = self.builder, self.bits
        halves = []
        for first in (1, 0):   # odd lanes, then even ones
            lanes = b.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), self.width),
                                                                 list(range(first, 2 * self.width, 2))))
            halves.append(self._daz(b.shl(b.zext(lanes, i32v), self._bits(16))))
        return tuple(halves)

    def _bits(self, value: int, scalar: bool = False) -> ir.Value:
        one = ir.Constant(ir.IntType(32), value)
        return one if scalar else self.splat(one, self.bits)

    def _daz(self, bits32: ir.Value) -> ir.Value:
        """The f32 of ``bits32`` (a scalar or a vector of i32), a denormal as a zero of its sign."""
        b, scalar = self.builder, not isinstance(bits32.type, ir.VectorType)
        tiny = b.icmp_unsigned("==", b.and_(bits32, self._bits(0x7F800000, scalar)), self._bits(0, scalar))
        return self._to_f32(b.select(tiny, b.and_(bits32, self._bits(0x80000000, scalar)), bits32))

    def operand_a(self, value: ir.Value):
        """A loaded ``a`` value broadcast, ready for :meth:`step` (bf16 stand-in: its odd and even halves)."""
        b = self.builder
        if not self.bf16:
            return self.splat(value, self.acc)
        if self.native:
            return b.bitcast(self.splat(value, ir.VectorType(ir.IntType(32), self.width)), self.b_vec)
        odd = self._daz(b.and_(value, self._bits(0xFFFF0000, True)))
        even = self._daz(b.shl(value, self._bits(16, True)))
        return self.splat(odd, self.acc), self.splat(even, self.acc)

    def step(self, acc: ir.Value, a, b) -> ir.Value:
        """``acc`` plus the product(s) of one reduction step."""
        if not self.bf16:
            return self.builder.call(self.fma, [a, b, acc])
        if self.native:
            return self.builder.call(self.dot, [acc, a, b])
        for x, y in zip(a, b):                                      # odd pair first (SDM order)
            acc = self._flushed_fma(x, y, acc)
        return acc

    def _flushed_fma(self, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
        """``acc + x*y`` as one step of the instruction: the accumulator's denormals as zeros, one
        rounding, a result tiny after rounding to 24 bits (unbounded exponent) as a zero of its
        sign. The fma's gradual result differs from that rounding only where it is 2^-126 while
        the exact sum (exact in f64: bf16 products have 16 bits) is below 2^-126 - 2^-151."""
        b, f64v = self.builder, ir.VectorType(ir.DoubleType(), self.width)
        acc = self._daz(b.bitcast(acc, self.bits))
        r = b.call(self.fma, [x, y, acc])
        rbits = b.bitcast(r, self.bits)
        magnitude = b.and_(rbits, self._bits(0x7FFFFFFF))
        exact = b.fadd(b.fpext(acc, f64v), b.fmul(b.fpext(x, f64v), b.fpext(y, f64v)))
        below = b.fcmp_ordered("<", b.call(cgutils.get_or_insert_function(
            b.module, ir.FunctionType(f64v, [f64v]), f"llvm.fabs.v{self.width}f64"), [exact]),
            self.splat(ir.Constant(ir.DoubleType(), 2.0 ** -126 - 2.0 ** -151), f64v))
        tiny = b.or_(b.icmp_unsigned("<", magnitude, self._bits(0x00800000)),
                     b.and_(b.icmp_unsigned("==", magnitude, self._bits(0x00800000)), below))
        return self._to_f32(b.select(tiny, b.and_(rbits, self._bits(0x80000000)), rbits))


#: Reduction steps per iteration of a kernel's inner loop (the rest of ``k`` one at a time): half the
#: loop's counting and address arithmetic per FMA (docs/engine-measurements.md, "Fourth session").
UNROLL = 2


def _emit(builder: ir.IRBuilder, rows: int, vecs: int, width: int, ptrs: dict, ints: dict, bf16: bool,
          native: bool, rounding: bool = False) -> None:
    """Emit the block ``rows`` x ``vecs`` of ``width`` lanes at the builder's position (see the
    module docstring): accumulators loaded from c, a tap loop around a reduction loop, stored
    (``rounding``: from zero, stored as rounded bf16 bits).
    ``ptrs``: c (float* or i16*), a, b (float* or i16*), ta, tb (i64*); ``ints``: the i64 arguments."""
    ops = _Ops(builder, width, bf16, native)
    vec, i64 = ops.acc, ir.IntType(64)
    const = lambda v: ir.Constant(i64, v)  # noqa: E731
    lanes = 2 if bf16 else 1            # b values per accumulator lane and step
    stored = ir.VectorType(ir.IntType(16), width) if rounding else vec
    caddr = [[builder.bitcast(builder.gep(ptrs["c"], [builder.add(ints["coff"], builder.add(
        builder.mul(ints["ldc"], const(r)), const(v * width)))]), stored.as_pointer())
        for v in range(vecs)] for r in range(rows)]
    zero = const(0)
    if rounding:
        init = [ir.Constant(vec, None)] * (rows * vecs)
    else:
        load, start = builder.append_basic_block("load_c"), builder.append_basic_block("start")
        before = builder.block
        builder.cbranch(builder.icmp_signed("!=", ints["accumulate"], zero), load, start)
        builder.position_at_end(load)
        loaded = [builder.load(p, align=4) for row in caddr for p in row]
        builder.branch(start)
        builder.position_at_end(start)
        init = [builder.phi(vec) for _ in loaded]
        for value, phi in zip(loaded, init):
            phi.add_incoming(value, load)
            phi.add_incoming(ir.Constant(vec, None), before)
    entry, choose = builder.block, builder.append_basic_block("choose")
    done = builder.append_basic_block("done")
    builder.cbranch(builder.and_(builder.icmp_signed(">", ints["ntaps"], zero),
                                 builder.icmp_signed(">", ints["k"], zero)), choose, done)
    builder.position_at_end(choose)
    if bf16 and not native:   # the stand-in: one loop, a step an iteration (its IR is ~15x the instruction's)
        nests = [_loop_nest(builder, ops, rows, vecs, width, ptrs, ints, ints["lda"], init, choose, done, 1)]
        builder.position_at_end(choose)
        builder.branch(nests[0][0])
    else:                     # rows adjacent (packed panels, a weights gradient's x): no row arithmetic
        nests = [_loop_nest(builder, ops, rows, vecs, width, ptrs, ints, lda, init, choose, done, UNROLL)
                 for lda in (const(lanes), ints["lda"])]
        builder.position_at_end(choose)
        builder.cbranch(builder.icmp_signed("==", ints["lda"], const(lanes)), nests[0][0], nests[1][0])
    builder.position_at_end(done)
    outs = [builder.phi(vec) for _ in init]
    for j, out in enumerate(outs):
        out.add_incoming(init[j], entry)
        for _, last, accs in nests:
            out.add_incoming(accs[j], last)
    for j, out in enumerate(outs):
        value = _rounded(builder, out, width) if rounding else out
        builder.store(value, caddr[j // vecs][j % vecs], align=2 if rounding else 4)


def _loop_nest(builder: ir.IRBuilder, ops: "_Ops", rows: int, vecs: int, width: int, ptrs: dict, ints: dict,
               lda: ir.Value, init: list, before: ir.Block, done: ir.Block, unroll: int
               ) -> tuple[ir.Block, ir.Block, list]:
    """:func:`_emit`'s loops over the taps and the reduction (``unroll`` steps an iteration, then
    the rest one at a time) with row stride ``lda`` (a constant where the rows are adjacent: the
    rows' addresses are then offsets of one register, no arithmetic per step), entered from
    ``before``, left to ``done``: (its first block, its last block, the accumulators there)."""
    vec, i64 = ops.acc, ir.IntType(64)
    const = lambda v: ir.Constant(i64, v)  # noqa: E731
    lanes = 2 if ops.bf16 else 1
    tloop, iloop = builder.append_basic_block("taps"), builder.append_basic_block("reduce")
    mid = builder.append_basic_block("reduce_rest")
    tail = builder.append_basic_block("reduce_one") if unroll > 1 else None
    tnext = builder.append_basic_block("next_tap")

    def steps(i: ir.Value, accs: list, count: int) -> list:
        """The accumulators after ``count`` reduction steps from step ``i``."""
        for u in range(count):
            iu = builder.add(i, const(u)) if u else i
            arow = builder.add(abase, builder.mul(iu, ints["astep"]))
            brow = builder.add(bbase, builder.mul(iu, ints["bstep"]))
            bvs = [ops.operand_b(builder.load(builder.bitcast(
                builder.gep(ptrs["b"], [builder.add(brow, const(v * width * lanes))]), ops.b_vec.as_pointer()),
                align=2 if ops.bf16 else 4)) for v in range(vecs)]
            new = []
            for r in range(rows):
                at = builder.gep(ptrs["a"], [builder.add(arow, builder.mul(lda, const(r)))])
                av = ops.operand_a(builder.load(builder.bitcast(at, ops.a_elem.as_pointer()), align=2 if ops.bf16 else 4))
                new += [ops.step(accs[r * vecs + v], av, bvs[v]) for v in range(vecs)]
            accs = new
        return accs

    builder.position_at_end(tloop)
    t = builder.phi(i64)
    t_accs = [builder.phi(vec) for _ in init]
    abase = builder.add(ints["aoff"], builder.load(builder.gep(ptrs["ta"], [t])))
    bbase = builder.add(ints["boff"], builder.load(builder.gep(ptrs["tb"], [t])))
    builder.cbranch(builder.icmp_signed(">=", ints["k"], const(unroll)), iloop, mid)

    builder.position_at_end(iloop)
    i = builder.phi(i64)
    accs = [builder.phi(vec) for _ in init]
    new = steps(i, accs, unroll)
    inext = builder.add(i, const(unroll))
    builder.cbranch(builder.icmp_signed("<=", builder.add(inext, const(unroll)), ints["k"]), iloop, mid)

    builder.position_at_end(mid)
    i_mid = builder.phi(i64)
    accs_mid = [builder.phi(vec) for _ in init]
    if tail is None:                   # one step an iteration: no rest
        builder.branch(tnext)
    else:
        builder.cbranch(builder.icmp_signed("<", i_mid, ints["k"]), tail, tnext)
        builder.position_at_end(tail)
        i1 = builder.phi(i64)
        accs1 = [builder.phi(vec) for _ in init]
        new1 = steps(i1, accs1, 1)
        i1next = builder.add(i1, const(1))
        builder.cbranch(builder.icmp_signed("<", i1next, ints["k"]), tail, tnext)

    builder.position_at_end(tnext)
    accs_t = [builder.phi(vec) for _ in init]
    tplus = builder.add(t, const(1))
    builder.cbranch(builder.icmp_signed("<", tplus, ints["ntaps"]), tloop, done)
    for j in range(len(init)):
        t_accs[j].add_incoming(init[j], before)
        t_accs[j].add_incoming(accs_t[j], tnext)
        accs[j].add_incoming(t_accs[j], tloop)
        accs[j].add_incoming(new[j], iloop)
        accs_mid[j].add_incoming(t_accs[j], tloop)
        accs_mid[j].add_incoming(new[j], iloop)
        accs_t[j].add_incoming(accs_mid[j], mid)
        if tail is not None:
            accs1[j].add_incoming(accs_mid[j], mid)
            accs1[j].add_incoming(new1[j], tail)
            accs_t[j].add_incoming(new1[j], tail)
    t.add_incoming(const(0), before)
    t.add_incoming(tplus, tnext)
    i.add_incoming(const(0), tloop)
    i.add_incoming(inext, iloop)
    i_mid.add_incoming(const(0), tloop)
    i_mid.add_incoming(inext, iloop)
    if tail is not None:
        i1.add_incoming(i_mid, mid)
        i1.add_incoming(i1next, tail)
    return tloop, tnext, accs_t


def _rounded(builder: ir.IRBuilder, value: ir.Value, width: int) -> ir.Value:
    """bf16 bits of an f32 vector, each rounded to nearest even (``(u + 0x7FFF + odd) >> 16``, a
    carry into inf on overflow), a NaN made quiet (``u >> 16 | 0x40``)."""
    i32 = ir.VectorType(ir.IntType(32), width)
    splat = lambda v: ir.Constant(i32, [v] * width)  # noqa: E731
    u = builder.bitcast(value, i32)
    high = builder.lshr(u, splat(16))
    even = builder.lshr(builder.add(builder.add(u, splat(0x7FFF)), builder.and_(high, splat(1))), splat(16))
    nan = builder.fcmp_unordered("uno", value, value)
    bits = builder.select(nan, builder.or_(high, splat(0x40)), even)
    return builder.trunc(bits, ir.VectorType(ir.IntType(16), width))


_ARRAYS = (("c", 4), ("a", 7), ("b", 11), ("ta", 14), ("tb", 15))
_INTS = (("coff", 5), ("ldc", 6), ("aoff", 8), ("lda", 9), ("astep", 10), ("boff", 12), ("bstep", 13),
         ("ntaps", 16), ("k", 17), ("accumulate", 18))


def _constant(value: ir.Value, name: str) -> int:
    if not isinstance(value, ir.Constant):
        raise errors.NumbaValueError(f"microkernel.run: {name} must be a compile-time constant (a closure "
                                     f"variable of the caller, see microkernel.kernel_call)")
    return int(value.constant)


#: The bf16 kernels (``run``'s ``native``, :func:`.isa.bf16_kernel`): the dot instruction's stand-in,
#: the instruction, and for :data:`.tiles.TILE_BLOCKS` the AMX tiles' stand-in and the tiles.
DOT_STANDIN, DOT, TILES_STANDIN, TILES = 0, 1, 2, 3


@intrinsic
def run(typingctx, width, rows, vecs, native, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k,
        accumulate):
    """The kernel of ``width`` (8 or 16) and block ``rows`` x ``vecs`` (compile-time constants,
    one of :data:`BLOCKS`) on f32 ``a``/``b``, or bf16 bits (uint16) ``a``/``b`` (see the module
    docstring): ``native`` (a constant: a bool, or one of :data:`DOT_STANDIN`... :data:`TILES`)
    picks the bf16 kernel: the AVX512_BF16 instruction where the host has it (True, ``DOT``),
    else the stand-in; ``TILES``/``TILES_STANDIN`` with a block of :data:`.tiles.TILE_BLOCKS`: AMX
    tiles (:mod:`.tiles`) where the host has them, else their stand-in.
    (:func:`.isa.bf16_kernel` says which the engine uses). A uint16 ``c`` takes the block
    rounded to bf16 (rounded stores, the module docstring)."""
    kinds = {a.dtype, b.dtype} if all(isinstance(t, types.Array) for t in (c, a, b, ta, tb)) else set()
    if kinds not in ({types.float32}, {types.uint16}) or c.dtype not in (types.float32, types.uint16):
        raise errors.TypingError("microkernel.run: c must be a float32 (or, rounded, uint16) array and a, b "
                                 f"both float32 or both uint16 (bf16 bits), got {c}, {a}, {b}")
    if ta.layout != "C" or tb.layout != "C":     # read through their data pointers
        raise errors.TypingError(f"microkernel.run: the offset tables must be C-contiguous, got {ta}, {tb}")
    i64t = types.int64
    flag = types.boolean if isinstance(native, (types.Boolean, types.BooleanLiteral)) else i64t
    sig = types.void(i64t, i64t, i64t, flag, c, i64t, i64t, a, i64t, i64t, i64t, b, i64t, i64t, ta, tb, i64t, i64t, i64t)
    bf16 = kinds == {types.uint16}

    def codegen(context, builder, signature, argv):
        width_, rows_, vecs_, mode = (_constant(argv[j], name)
                                      for j, name in enumerate(("width", "rows", "vecs", "native")))
        on_tiles = bf16 and mode >= TILES_STANDIN and width_ == 16 and (rows_, vecs_) in tiles.TILE_BLOCKS
        if not on_tiles and (rows_, vecs_) not in BLOCKS.get(width_, ()):
            raise errors.NumbaValueError(f"microkernel.run: no {rows_}x{vecs_} block of width {width_}: "
                                         f"expected one of {BLOCKS}")
        ptrs = {name: cgutils.create_struct_proxy(signature.args[j])(context, builder, value=argv[j]).data
                for name, j in _ARRAYS}
        ints = {name: argv[j] for name, j in _INTS}
        dot = bf16 and mode in (DOT, TILES) and isa.bf16_host()
        if on_tiles:
            tiles.emit(builder, rows_, vecs_, ptrs, ints, c.dtype == types.uint16, mode == TILES and isa.tiles_permitted(),
                       dot, _emit, lambda b: _Ops(b, 16, True, False))
        else:
            _emit(builder, rows_, vecs_, width_, ptrs, ints, bf16, dot, rounding=c.dtype == types.uint16)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint the cache line of ``arr[index]`` into L2 (``prefetcht1``: ``llvm.prefetch``, read,
    locality 2): a stream the caller will read soon, fetched while the kernels compute."""
    if not isinstance(arr, types.Array):
        raise errors.TypingError(f"microkernel.prefetch: arr must be an array, got {arr}")

    def codegen(context, builder, signature, argv):
        data = cgutils.create_struct_proxy(signature.args[0])(context, builder, value=argv[0]).data
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(builder.gep(data, [argv[1]]), i8p), ir.Constant(i32, 0),
                          ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, types.int64), codegen


@intrinsic
def stream_line(typingctx, out, at, src, src_at):
    """Store the 64 bytes of ``src`` from byte ``src_at`` (any alignment) at byte ``at`` of
    ``out`` (a cache line) with a non-temporal store: the line is written to memory without being
    read into the caches first (a zeroing pass over 51 MB: 2.8-3.1 -> 1.2 ms on the Xeon with
    AMX). ``out`` and ``src`` are uint8 arrays; ``src`` None (``out`` itself, never read):
    zeros. The caller ends its stores with :func:`store_fence`."""
    if not isinstance(out, types.Array) or out.dtype != types.uint8:
        raise errors.TypingError(f"microkernel.stream_line: out must be a uint8 array, got {out}")
    zeros = isinstance(src, types.NoneType)

    def codegen(context, builder, signature, argv):
        line = ir.VectorType(ir.IntType(32), 16)
        data = cgutils.create_struct_proxy(signature.args[0])(context, builder, value=argv[0]).data
        if zeros:
            value = ir.Constant(line, None)
        else:
            from_ = cgutils.create_struct_proxy(signature.args[2])(context, builder, value=argv[2]).data
            value = builder.load(builder.bitcast(builder.gep(from_, [argv[3]]), line.as_pointer()), align=1)
        store = builder.store(value, builder.bitcast(builder.gep(data, [argv[1]]), line.as_pointer()), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(out, types.int64, src, types.int64), codegen


@intrinsic
def store_fence(typingctx):
    """A full fence (``mfence`` on x86): the non-temporal stores before it are visible to every
    thread before any store after it (the pool's join that follows is not enough for them)."""
    def codegen(context, builder, signature, argv):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


def _width(value: ir.Value, intrinsic_name: str) -> int:
    """The vector width an intrinsic was given (a constant: one of :data:`WIDTHS`)."""
    w = _constant(value, "width")
    if w not in WIDTHS:
        raise errors.NumbaValueError(f"microkernel.{intrinsic_name}: width {w}, expected one of {WIDTHS}")
    return w


@intrinsic
def transpose32(typingctx, width, src, soff, sld, dst, doff, dld):
    """A ``width`` x ``width`` transpose of 32-bit units (``width`` a constant: 8 or 16): unit
    ``j`` of source row ``i`` (the ``width`` units from element ``soff + i*sld`` of ``src``) is
    stored as unit ``i`` of destination row ``j`` (from element ``doff + j*dld`` of ``dst``);
    offsets and strides count each array's own elements (uint16 data: a unit is a pair). In
    registers: ``log2(width)`` rounds of block swaps between row pairs (``shufflevector``)."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        raise errors.TypingError("microkernel.transpose32: src and dst must be arrays")

    def codegen(context, builder, signature, argv):
        w = _width(argv[0], "transpose32")
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vec = ir.VectorType(i32, w)

        def address(array_type, array, offset, stride, row):
            return _address(context, builder, array_type, array,
                            builder.add(offset, builder.mul(stride, ir.Constant(i64, row))), vec)

        rows = [builder.load(address(signature.args[1], argv[1], argv[2], argv[3], i), align=1) for i in range(w)]
        b = w // 2
        while b:
            for i in range(w):
                if i & b:
                    continue
                j = i + b
                low = [k if not k & b else w + k - b for k in range(w)]
                high = [k + b if not k & b else w + k for k in range(w)]
                rows[i], rows[j] = (builder.shuffle_vector(rows[i], rows[j], ir.Constant(ir.VectorType(i32, w), low)),
                                    builder.shuffle_vector(rows[i], rows[j], ir.Constant(ir.VectorType(i32, w), high)))
            b //= 2
        for j in range(w):
            builder.store(rows[j], address(signature.args[4], argv[4], argv[5], argv[6], j), align=1)
        return context.get_dummy_value()

    return types.void(types.int64, src, types.int64, types.int64, dst, types.int64, types.int64), codegen


@intrinsic
def copy32(typingctx, width, src, soff, dst, doff):
    """``width`` (a constant: 8 or 16) 32-bit units from element ``soff`` of ``src`` to element
    ``doff`` of ``dst`` (each array's own elements, of either sign, from its first element's
    address: any strides): one vector load and store (a copy loop of a count known only at run
    time, and arrays that may overlap, stays scalar)."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        raise errors.TypingError("microkernel.copy32: src and dst must be arrays")

    def codegen(context, builder, signature, argv):
        w = _width(argv[0], "copy32")
        vec = ir.VectorType(ir.IntType(32), w)
        value = builder.load(_address(context, builder, signature.args[1], argv[1], argv[2], vec), align=1)
        builder.store(value, _address(context, builder, signature.args[3], argv[3], argv[4], vec), align=1)
        return context.get_dummy_value()

    return types.void(types.int64, src, types.int64, dst, types.int64), codegen


@intrinsic
def pairs32(typingctx, width, src, first, second, dst, doff):
    """``width`` (a constant: 8 or 16) 16-bit values from element ``first`` of ``src`` and as
    many from element ``second``, stored interleaved as ``width`` pairs (value i of the first,
    then of the second) from element ``doff`` of ``dst`` (arrays of 16-bit values, any strides,
    offsets in their elements): the bf16 dot instruction's pairs, one vector load of each row,
    one store."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        raise errors.TypingError("microkernel.pairs32: src and dst must be arrays")

    def codegen(context, builder, signature, argv):
        w = _width(argv[0], "pairs32")
        half, unit = ir.VectorType(ir.IntType(16), w), ir.VectorType(ir.IntType(32), w)
        lo, hi = (builder.zext(builder.load(_address(context, builder, signature.args[1], argv[1], argv[j], half),
                                            align=1), unit) for j in (2, 3))
        value = builder.or_(lo, builder.shl(hi, ir.Constant(unit, [16] * w)))
        builder.store(value, _address(context, builder, signature.args[4], argv[4], argv[5], unit), align=1)
        return context.get_dummy_value()

    return types.void(types.int64, src, types.int64, types.int64, dst, types.int64), codegen


@numba.njit(inline="always")
def pair_units(width, src, first, second, dst, doff):  # pragma: no cover - compiled
    """:func:`pairs32` for a ``width`` (8 or 16) known only when the caller runs."""
    if width == 16:
        pairs32(16, src, first, second, dst, doff)
    else:
        pairs32(8, src, first, second, dst, doff)


def _address(context, builder: ir.IRBuilder, array_type, array: ir.Value, offset: ir.Value,
             vec: ir.VectorType) -> ir.Value:
    """A ``vec`` pointer to element ``offset`` of ``array`` (counted in its own elements)."""
    data = cgutils.create_struct_proxy(array_type)(context, builder, value=array).data
    item = context.get_abi_sizeof(context.get_data_type(array_type.dtype))
    byte = builder.gep(builder.bitcast(data, ir.IntType(8).as_pointer()),
                       [builder.mul(offset, ir.Constant(ir.IntType(64), item))])
    return builder.bitcast(byte, vec.as_pointer())


@numba.njit(inline="always")
def copy_units(width, src, soff, dst, doff):  # pragma: no cover - compiled
    """:func:`copy32` for a ``width`` (8 or 16) known only when the caller runs."""
    if width == 16:
        copy32(16, src, soff, dst, doff)
    else:
        copy32(8, src, soff, dst, doff)


@numba.njit(inline="always")
def transpose_tile(width, src, soff, sld, dst, doff, dld):  # pragma: no cover - compiled
    """:func:`transpose32` for a ``width`` (8 or 16) known only when the caller runs."""
    if width == 16:
        transpose32(16, src, soff, sld, dst, doff, dld)
    else:
        transpose32(8, src, soff, sld, dst, doff, dld)


def cached_njit(**options) -> Callable:
    """:func:`convgrad.kernel_cache.njit` (``numba.njit(cache=True, **options)``, safe for
    processes compiling at once) whose disk cache is also keyed on this module's and
    :mod:`convgrad.casts`' source (:data:`SOURCE_DIGEST`): an edited kernel invalidates the
    callers' cached code, which numba alone would not notice (it checks only the caller's own
    source file). Should numba's cache internals change, the callers compile without a disk
    cache (never a stale kernel)."""
    def wrap(fn: Callable) -> Callable:
        dispatcher = kernel_cache.njit(**options)(fn)
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is not None:
            cache_file._source_stamp = (cache_file._source_stamp, SOURCE_DIGEST)
        return dispatcher
    return wrap


def cached_cfunc(signature: types.Type) -> Callable:
    """``numba.cfunc(signature, cache=True)``, its disk cache also keyed on :data:`SOURCE_DIGEST`
    and safe for processes compiling at once (as :func:`cached_njit`); compiled without a disk
    cache should numba's internals change."""
    def wrap(fn: Callable) -> Any:
        try:
            from numba.core.ccallback import CFunc
            compiled = CFunc(fn, signature, {}, {})
            compiled.enable_caching()
            cache_file = compiled._cache._cache_file
            cache_file._source_stamp = (cache_file._source_stamp, SOURCE_DIGEST)
            kernel_cache.guard(cache_file)
        except (AttributeError, ImportError, TypeError):
            return numba.cfunc(signature)(fn)
        kernel_cache.quiet(compiled.compile)()
        return compiled
    return wrap


def address_of(function: Any, signature: tuple) -> int:
    """The address of numba function ``function`` compiled for ``signature`` (numba's calling
    convention: :func:`call_at` calls it)."""
    function.compile(signature)
    compiled = function.overloads[signature]
    return compiled.library.get_pointer_to_function(compiled.fndesc.mangled_name)


@intrinsic
def call_at(typingctx, address, *args):
    """``f(*args)`` of the numba-compiled function ``f`` at ``address`` (numba's calling
    convention, no result): 1 where ``f`` raised an exception, else 0."""
    argtypes = tuple(args)

    def codegen(context, builder, signature, argv):
        values = cgutils.unpack_tuple(builder, argv[1], len(argtypes))
        fnty = context.call_conv.get_function_type(types.void, argtypes)
        status, _ = context.call_conv.call_function(builder, builder.inttoptr(argv[0], fnty.as_pointer()), types.void,
                                                    argtypes, values)
        return builder.zext(status.is_error, ir.IntType(64))

    return types.int64(address, types.StarArgTuple.from_types(argtypes)), codegen


def _each(address, items, *args):  # pragma: no cover - compiled
    """``body(item, *args)`` for every ``item < items`` in numba's pool, ``body`` the serial
    function at ``address``: the number of items whose call raised."""
    failed = 0
    for item in numba.prange(items):
        failed += call_at(address, np.int64(item), *args)
    return failed


_EACH = cached_njit(parallel=True)(_each)


_NDARRAY = np.ndarray


class parallel_items:  # noqa: N801 - used as a function: ``drive = parallel_items(body)``
    """``drive(items, *args)``: ``body(item, *args)`` for every ``item < items`` in numba's pool.

    ``body`` is compiled here, serially, per the dtypes, dimensions and C-contiguity of the arrays
    (typed 'A' layout, a depthwise driver ran 1-6 % slower) and the types of the other arguments,
    and called through its address from one parallel loop (:func:`_each`, compiled once per
    argument types): a kernel variant's driver compiles without numba's parallel-loop passes (a
    depthwise driver 0.9-1.6 s against 2.2-3.2, Zen 3, 2026-11-27), at the cost of one direct call
    per item (readonly and writable arrays, C and any layout, share one calling convention)."""

    __slots__ = ("function", "body", "addresses", "options")

    def __init__(self, body: Callable, **options: object):
        """``options``: numba's, for compiling ``body`` (e.g. ``fastmath``)."""
        self.function, self.body, self.options = body, None, options  # compiled at the first call: after
        self.addresses: dict[tuple, int] = {}                         # pool.py chose the layer

    def __call__(self, items: int, *args: object) -> None:
        key = tuple([(a.dtype, a.ndim, a.flags.c_contiguous) if a.__class__ is _NDARRAY else a.__class__
                     for a in args])                                             # 4-5 µs for 22 arguments
        address = self.addresses.get(key)
        if address is None:
            if self.body is None:
                from numba.np.ufunc import parallel
                parallel._launch_threads()  # the pool's symbols, which a body loaded from the disk cache links
                self.body = cached_njit(**self.options)(self.function)
            signature = (types.int64, *(types.Array(numba.from_dtype(a.dtype), a.ndim, "C" if a.flags.c_contiguous
                                                    else "A") if a.__class__ is _NDARRAY else numba.typeof(a)
                                        for a in args))
            address = self.addresses[key] = address_of(self.body, signature)
        failed = _EACH(address, items, *args)
        if failed:
            raise RuntimeError(f"{self.function.__qualname__}: {failed} of {items} items raised an exception in "
                               "compiled code (a bug of convgrad's: please report it)")


@functools.cache
def kernel_call(width: int, rows: int, vecs: int, native: bool = True) -> Callable:
    """:func:`run` of one variant, callable from Python: ``f(c, coff, ldc, a, aoff, lda, astep, b,
    boff, bstep, ta, tb, ntaps, k, accumulate=1)`` (tests; compiled for this variant only;
    ``native`` False: the bf16 stand-in even where the host has the instruction)."""
    @cached_njit()
    def call(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k, accumulate=1):  # pragma: no cover
        run(width, rows, vecs, native, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k, accumulate)
    return call


def kernel_ir(width: int, rows: int, vecs: int, bf16: bool = False, native: bool = False, on_tiles: bool = False) -> str:
    """LLVM IR text of one kernel as a function ``kernel(c, a, b, ta, tb, coff, ldc, aoff, lda,
    astep, boff, bstep, ntaps, k, accumulate)``: for reading its assembly for another CPU (``native``: the
    AVX512_BF16 instruction, whatever this host has; ``on_tiles``: a bf16 tile block, on AMX
    tiles with ``native``)."""
    module = ir.Module(name=f"kernel_{width}_{rows}x{vecs}")
    f32p, i16p, i64 = ir.FloatType().as_pointer(), ir.IntType(16).as_pointer(), ir.IntType(64)
    operand = i16p if bf16 else f32p
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [f32p, operand, operand, i64.as_pointer(),
                                                            i64.as_pointer()] + [i64] * len(_INTS)), "kernel")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    ptrs = dict(zip(("c", "a", "b", "ta", "tb"), fn.args[:5]))
    ints = dict(zip((name for name, _ in _INTS), fn.args[5:]))
    if on_tiles:
        tiles.emit(builder, rows, vecs, ptrs, ints, False, native, native, _emit, lambda b: _Ops(b, 16, True, False))
    else:
        _emit(builder, rows, vecs, width, ptrs, ints, bf16, native)
    builder.ret_void()
    return str(module)


@functools.cache
def _spin(width: int, rows: int, vecs: int) -> Callable:
    @kernel_cache.njit(parallel=True)
    def spin(c, a, b, depth, reps, threads):  # pragma: no cover - compiled
        """``reps`` kernel calls per thread on its own packed panels (``depth`` x block, in L1)."""
        vw = vecs * width
        one = np.zeros(1, np.int64)
        for p in numba.prange(threads):
            for _ in range(reps):
                run(width, rows, vecs, False, c, p * rows * vw, vw, a, p * depth * rows, 1, rows, b, p * depth * vw, vw,
                    one, one, 1, depth, 1)
    return spin


def _best_rate(step: Callable[[int], None], flop_per_rep: float, seconds: float) -> float:
    """GFLOP/s of the fastest of a few timed ``step(reps)`` runs (after a warm-up), each long
    enough to time (the thread wake-up excluded): at least one, however long the short runs took
    (on a loaded machine waking the threads can take as long as the whole budget)."""
    step(1)
    reps, best, spent = 1000, 0.0, 0.0
    while spent < seconds or not best:
        start = time.perf_counter()
        step(reps)
        elapsed = time.perf_counter() - start
        spent += elapsed
        if elapsed < seconds / 4:
            reps *= 4
            continue
        best = max(best, flop_per_rep * reps / elapsed / 1e9)
    return best


def fma_peak(width: int, threads: int, seconds: float = 0.3) -> float:
    """GFLOP/s of the 6x2 (``W`` = 8) or 14x2 (``W`` = 16) kernel with its panels in L1
    (256-deep), on ``threads`` threads at once: loads and broadcasts included."""
    rows, vecs = BLOCKS[width][1]
    depth = 256
    c = np.zeros(threads * rows * vecs * width, np.float32)
    a = np.random.default_rng(0).standard_normal(threads * depth * rows).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(threads * depth * vecs * width).astype(np.float32)
    spin = _spin(width, rows, vecs)
    return _best_rate(lambda reps: spin(c, a, b, depth, reps, threads),
                      2 * rows * vecs * width * depth * threads, seconds)


@intrinsic
def _chains(typingctx, width, x, reps):
    """``_CHAINS[width]`` independent chains of ``reps`` FMAs of ``width`` f32 lanes (no loads),
    returning the sum of their lanes (so that nothing is dead code); ``width`` a constant."""
    def codegen(context, builder, signature, argv):
        w = _constant(argv[0], "width")
        vec, i64 = ir.VectorType(ir.FloatType(), w), ir.IntType(64)
        ops = _Ops(builder, w, False, False)
        mul = ops.splat(argv[1], vec)
        add = ops.splat(builder.fmul(argv[1], ir.Constant(ir.FloatType(), 0.5)), vec)
        init = [ops.splat(builder.fadd(argv[1], ir.Constant(ir.FloatType(), float(j))), vec)
                for j in range(_CHAINS[w])]
        entry, loop, done = (builder.block, builder.append_basic_block("chains"),
                             builder.append_basic_block("chains_done"))
        builder.cbranch(builder.icmp_signed(">", argv[2], ir.Constant(i64, 0)), loop, done)
        builder.position_at_end(loop)
        i = builder.phi(i64)
        accs = [builder.phi(vec) for _ in init]
        new = [builder.call(ops.fma, [acc, mul, add]) for acc in accs]
        inext = builder.add(i, ir.Constant(i64, 1))
        builder.cbranch(builder.icmp_signed("<", inext, argv[2]), loop, done)
        i.add_incoming(ir.Constant(i64, 0), entry)
        i.add_incoming(inext, loop)
        for acc, first, nxt in zip(accs, init, new):
            acc.add_incoming(first, entry)
            acc.add_incoming(nxt, loop)
        builder.position_at_end(done)
        outs = [builder.phi(vec) for _ in init]     # phis first: LLVM wants them on top
        total = ir.Constant(ir.FloatType(), 0.0)
        for out, first, nxt in zip(outs, init, new):
            out.add_incoming(first, entry)
            out.add_incoming(nxt, loop)
            for lane in range(w):
                total = builder.fadd(total, builder.extract_element(out, ir.Constant(ir.IntType(32), lane)))
        return total

    return types.float32(types.int64, types.float32, types.int64), codegen


@functools.cache
def _register_spin(width: int) -> Callable:
    @kernel_cache.njit(parallel=True)
    def spin(out, reps):  # pragma: no cover - compiled
        for p in numba.prange(out.shape[0]):
            out[p] = _chains(width, np.float32(0.999), reps)
    return spin


def register_peak(width: int, threads: int, seconds: float = 0.3) -> float:
    """GFLOP/s of independent FMA chains of ``width`` f32 lanes in registers (no loads) on
    ``threads`` threads at once: the core's FMA throughput, the ceiling of every kernel."""
    out = np.zeros(threads, np.float32)
    spin = _register_spin(width)
    return _best_rate(lambda reps: spin(out, reps), 2 * width * _CHAINS[width] * threads, seconds)
