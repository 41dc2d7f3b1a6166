"""The micro-kernel's bf16 blocks on AMX tiles (``amx_bf16`` family): ``tdpbf16ps``, f32 sums.

A tile block ``R x V`` (:data:`TILE_BLOCKS`: R = 16 or 32 rows, V vectors of 16 f32 lanes)
computes the same batch-reduce step as :func:`.microkernel.run`'s bf16 kernel (its docstring
gives the sum) with ``R/16 x V`` accumulator tiles of 16 rows x 16 f32, ``R/16`` tiles of ``a``
(16 rows x 16 pairs along K: 64 bytes a row, rows ``lda`` apart) and ``V`` tiles of ``b`` (16
pairs along K x 16 interleaved lane pairs: rows ``bstep`` apart), all of one shape (16 rows x
64 bytes), 8 tiles at most. Per tap, the steps ``i < k16 = k - k % 16`` run on the tiles, 16 at
a time; the last ``k % 16`` steps of every tap then run on the vector kernel (the dot
instruction, ``VDPBF16PS``) over the stored accumulators: oneDNN's brgemm kernels do the same
with a tail tile configuration. Tiles need ``a``'s pairs of consecutive steps adjacent (``astep``
2, a row-major A); any other call (a transposed A, ``k`` < 16) runs whole on the vector kernel,
in row blocks that fit the 32 vector registers.

``TDPBF16PS`` as measured on a Sapphire Rapids (docs/engine-measurements.md; not the SDM's
pseudo-code, which adds each product to the accumulator in turn): for each row and lane, the 16
even products (a pair's first element) are summed in order of ``k`` from -0, each sum rounded to
f32 (RNE), the 16 odd products likewise, then the two sums are added and rounded, and that is
added to the accumulator and rounded; denormal inputs (operands and accumulator) count as zeros
of their sign and every rounded result below 2^-126 becomes a zero of its sign (so an underflow
whose even and odd sums differ in sign gives +0). Where the host lacks AMX (and in the emulated
twins of the native tests) a plain-IR stand-in computes that bit for bit: tiles in a stack
buffer, loads and stores row by row, the sums by fused multiply-adds (one rounding each).

Linux hands the tile state to a process that asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``, :func:`.isa.tiles_permitted`), once; each kernel call loads its tile
configuration (``ldtilecfg``: another library's kernels on the same thread may have loaded theirs).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

__all__ = ["TILE_BLOCKS", "ROWS", "PAIRS", "emit"]

#: Tile blocks (rows R, vectors V): R/16 * V accumulators + R/16 + V operand tiles <= 8.
TILE_BLOCKS: tuple[tuple[int, int], ...] = ((32, 2), (16, 3), (16, 2), (16, 1))
ROWS = 16    #: rows of a tile
PAIRS = 16   #: bf16 pairs along K in a tile row (64 bytes)
#: Rows of the vector kernel's blocks for ``V`` vectors (R*V + V + 1 <= 31 zmm registers).
_VECTOR_ROWS = {1: 16, 2: 14, 3: 8}


def _stack(builder: ir.IRBuilder, ty: ir.Type) -> ir.Value:
    """Stack memory for ``ty`` in the function's entry block, not zeroed: written before it is
    read (``cgutils.alloca_once`` stores a zero aggregate there, which LLVM splits per element:
    2.4 s of a stand-in tile block's 2.6 s of optimisation for an 8 KiB buffer)."""
    with builder.goto_entry_block():
        return builder.alloca(ty)


class _Tiles:
    """The tile instructions: AMX's (``native``) or their plain-IR stand-in on a stack buffer."""

    def __init__(self, builder: ir.IRBuilder, native: bool, ops: object):
        self.b, self.native, self.ops = builder, native, ops
        self.i8, self.i64 = ir.IntType(8), ir.IntType(64)
        i8p = self.i8.as_pointer()
        module = builder.module
        if native:
            def fn(name: str, args: list) -> ir.Function:
                return cgutils.get_or_insert_function(module, ir.FunctionType(ir.VoidType(), args), name)
            self._cfg = fn("llvm.x86.ldtilecfg", [i8p])
            self._stcfg = fn("llvm.x86.sttilecfg", [i8p])
            self._load = fn("llvm.x86.tileloadd64", [self.i8, i8p, self.i64])
            self._store = fn("llvm.x86.tilestored64", [self.i8, i8p, self.i64])
            self._zero = fn("llvm.x86.tilezero", [self.i8])
            self._dot = fn("llvm.x86.tdpbf16ps", [self.i8, self.i8, self.i8])
        else:
            self.buffer = _stack(builder, ir.ArrayType(self.i8, 8 * ROWS * 64))
        self.row = ir.VectorType(ir.IntType(32), 16)

    def configure(self) -> None:
        """Load the configuration: palette 1, tiles 0-7 of 16 rows x 64 bytes."""
        if not self.native:
            return
        name = "convgrad_tile_config"
        config = self.b.module.globals.get(name)
        if config is None:
            data = [1] + [0] * 15 + sum(([64, 0] if t < 8 else [0, 0] for t in range(16)), []) + \
                [ROWS if t < 8 else 0 for t in range(16)]
            config = cgutils.global_constant(self.b.module, name, ir.Constant(ir.ArrayType(self.i8, 64), data))
            config.align = 64
        b = self.b
        ours = b.bitcast(config, self.i8.as_pointer())
        current = _stack(b, ir.ArrayType(self.i8, 64))       # sttilecfg writes all 64 bytes
        current.align = 64
        b.call(self._stcfg, [b.bitcast(current, self.i8.as_pointer())])
        wide = ir.VectorType(self.i64, 8)
        same = b.icmp_unsigned("==", b.load(b.bitcast(current, wide.as_pointer()), align=64),
                               b.load(b.bitcast(config, wide.as_pointer()), align=64))
        reduce_and = cgutils.get_or_insert_function(
            b.module, ir.FunctionType(ir.IntType(1), [ir.VectorType(ir.IntType(1), 8)]), "llvm.vector.reduce.and.v8i1")
        all_same = b.call(reduce_and, [same])
        with b.if_then(b.not_(all_same)):
            b.call(self._cfg, [ours])

    def _tile_row(self, t: int, r: ir.Value | int) -> ir.Value:
        b = self.b
        r = ir.Constant(self.i64, r) if isinstance(r, int) else r
        at = b.add(ir.Constant(self.i64, t * ROWS * 64), b.mul(r, ir.Constant(self.i64, 64)))
        return b.gep(b.bitcast(self.buffer, self.i8.as_pointer()), [at])

    def load(self, t: int, ptr: ir.Value, stride: ir.Value) -> None:
        """Tile ``t`` = 16 rows of 64 bytes from byte pointer ``ptr``, ``stride`` bytes apart."""
        b = self.b
        if self.native:
            b.call(self._load, [ir.Constant(self.i8, t), ptr, stride])
            return
        for r in range(ROWS):
            src = b.gep(ptr, [b.mul(stride, ir.Constant(self.i64, r))])
            row = b.load(b.bitcast(src, self.row.as_pointer()), align=1)
            b.store(row, b.bitcast(self._tile_row(t, r), self.row.as_pointer()), align=1)

    def store(self, t: int, ptr: ir.Value, stride: ir.Value) -> None:
        """Tile ``t``'s 16 rows to byte pointer ``ptr``, ``stride`` bytes apart."""
        b = self.b
        if self.native:
            b.call(self._store, [ir.Constant(self.i8, t), ptr, stride])
            return
        for r in range(ROWS):
            row = b.load(b.bitcast(self._tile_row(t, r), self.row.as_pointer()), align=1)
            b.store(row, b.bitcast(b.gep(ptr, [b.mul(stride, ir.Constant(self.i64, r))]), self.row.as_pointer()),
                    align=1)

    def zero(self, t: int) -> None:
        b = self.b
        if self.native:
            b.call(self._zero, [ir.Constant(self.i8, t)])
            return
        for r in range(ROWS):
            b.store(ir.Constant(self.row, None), b.bitcast(self._tile_row(t, r), self.row.as_pointer()), align=1)

    def dot(self, c: int, a: int, bt: int) -> None:
        """Tile ``c`` += the products of tiles ``a`` (rows x pairs) and ``bt`` (pairs x lane pairs),
        as TDPBF16PS sums them (module docstring)."""
        b = self.b
        if self.native:
            b.call(self._dot, [ir.Constant(self.i8, t) for t in (c, a, bt)])
            return
        ops, acc_t = self.ops, ir.VectorType(ir.FloatType(), 16)
        pair_t = ir.VectorType(ir.IntType(16), 32)
        sums = [cgutils.alloca_once(b, acc_t) for _ in range(2)]      # the even and the odd products' sums
        negative_zero = ir.Constant(acc_t, [-0.0] * 16)
        with cgutils.for_range(b, ir.Constant(self.i64, ROWS)) as m:
            crow = b.bitcast(self._tile_row(c, m.index), acc_t.as_pointer())
            for slot in sums:
                b.store(negative_zero, slot)
            with cgutils.for_range(b, ir.Constant(self.i64, PAIRS)) as kk:
                pair = b.load(b.bitcast(b.gep(self._tile_row(a, m.index), [b.mul(kk.index, ir.Constant(self.i64, 4))]),
                                        ir.IntType(32).as_pointer()), align=1)
                lanes = b.load(b.bitcast(self._tile_row(bt, kk.index), pair_t.as_pointer()), align=1)
                (a_odd, a_even), (b_odd, b_even) = ops.operand_a(pair), ops.operand_b(lanes)
                for slot, x, y in ((sums[0], a_even, b_even), (sums[1], a_odd, b_odd)):
                    b.store(self._flush(b.call(ops.fma, [x, y, b.load(slot)])), slot)
            pairs = self._flush(b.fadd(b.load(sums[0]), b.load(sums[1])))
            acc = ops._daz(b.bitcast(b.load(crow, align=1), ops.bits))
            b.store(self._flush(b.fadd(acc, pairs)), crow, align=1)

    def _flush(self, value: ir.Value) -> ir.Value:
        """``value`` (16 f32 lanes) with results below 2^-126 as zeros of their sign."""
        b, bits_t = self.b, ir.VectorType(ir.IntType(32), 16)
        bits = b.bitcast(value, bits_t)
        splat = lambda v: ir.Constant(bits_t, [v] * 16)  # noqa: E731
        tiny = b.icmp_unsigned("<", b.and_(bits, splat(0x7FFFFFFF)), splat(0x00800000))
        return b.bitcast(b.select(tiny, b.and_(bits, splat(0x80000000)), bits), value.type)


def emit(builder: ir.IRBuilder, rows: int, vecs: int, ptrs: dict, ints: dict, rounding: bool, native: bool,
         dot_native: bool, vector: object, ops_for: object) -> None:
    """Emit the tile block ``rows`` x ``vecs`` (module docstring) at the builder's position:
    tiles where ``astep`` is 2 and ``k`` >= 16, the vector kernel (``vector``: :func:`.microkernel._emit`)
    for the steps past the last 16 and for any other call. ``ptrs``/``ints`` as ``vector`` takes
    them (bf16 ``a``/``b``; ``c`` f32, or bf16 bits with ``rounding``); ``native``: AMX (else
    the stand-in), ``dot_native``: the dot instruction for the vector steps (else its stand-in);
    ``ops_for(builder)``: the stand-in's :class:`.microkernel._Ops`."""
    b, i64 = builder, ir.IntType(64)
    const = lambda v: ir.Constant(i64, v)  # noqa: E731
    tiles = _Tiles(b, native, None if native else ops_for(b))
    strips = rows // ROWS
    c_tile = lambda s, v: s * vecs + v  # noqa: E731
    a_tile = lambda s: strips * vecs + s  # noqa: E731
    b_tile = lambda v: strips * vecs + strips + v  # noqa: E731
    i8p = ir.IntType(8).as_pointer()

    def vectors(target: dict, values: dict, with_rounding: bool) -> None:
        """The whole block on the vector kernel, in row blocks that fit the registers."""
        step = _VECTOR_ROWS[vecs]
        for r0 in range(0, rows, step):
            part = dict(values, coff=b.add(values["coff"], b.mul(values["ldc"], const(r0))),
                        aoff=b.add(values["aoff"], b.mul(values["lda"], const(r0))))
            vector(b, min(step, rows - r0), vecs, 16, target, part, True, dot_native, rounding=with_rounding)

    use_tiles = b.and_(b.and_(b.icmp_signed("==", ints["astep"], const(2)),
                              b.icmp_signed(">=", ints["k"], const(PAIRS))),
                       b.icmp_signed(">", ints["ntaps"], const(0)))
    with b.if_else(use_tiles) as (then, otherwise):
        with then:
            if rounding:   # the block's f32 sums on the stack, rounded into c at the end
                sums = _stack(b, ir.ArrayType(ir.FloatType(), rows * vecs * 16))
                target = dict(ptrs, c=b.bitcast(sums, ir.FloatType().as_pointer()))
                tints = dict(ints, coff=const(0), ldc=const(vecs * 16))
            else:
                target, tints = ptrs, ints
            cbytes = b.bitcast(target["c"], i8p)
            cstride = b.mul(tints["ldc"], const(4))

            def c_at(s: int, v: int) -> ir.Value:
                at = b.add(tints["coff"], b.add(b.mul(tints["ldc"], const(s * ROWS)), const(v * 16)))
                return b.gep(cbytes, [b.mul(at, const(4))])

            tiles.configure()
            if rounding:
                for s in range(strips):
                    for v in range(vecs):
                        tiles.zero(c_tile(s, v))
            else:
                with b.if_else(b.icmp_signed("!=", ints["accumulate"], const(0))) as (load, start):
                    with load:
                        for s in range(strips):
                            for v in range(vecs):
                                tiles.load(c_tile(s, v), c_at(s, v), cstride)
                    with start:
                        for s in range(strips):
                            for v in range(vecs):
                                tiles.zero(c_tile(s, v))
            k16 = b.and_(ints["k"], const(-PAIRS))
            abytes, bbytes = b.bitcast(ptrs["a"], i8p), b.bitcast(ptrs["b"], i8p)
            astride, bstride = b.mul(ints["lda"], const(2)), b.mul(ints["bstep"], const(2))
            with cgutils.for_range(b, ints["ntaps"]) as t:
                abase = b.add(ints["aoff"], b.load(b.gep(ptrs["ta"], [t.index])))
                bbase = b.add(ints["boff"], b.load(b.gep(ptrs["tb"], [t.index])))
                with cgutils.for_range(b, b.udiv(k16, const(PAIRS))) as j:
                    for s in range(strips):
                        at = b.add(abase, b.add(b.mul(ints["lda"], const(s * ROWS)), b.mul(j.index, const(2 * PAIRS))))
                        tiles.load(a_tile(s), b.gep(abytes, [b.mul(at, const(2))]), astride)
                    for v in range(vecs):
                        at = b.add(bbase, b.add(b.mul(j.index, b.mul(ints["bstep"], const(PAIRS))), const(v * 32)))
                        tiles.load(b_tile(v), b.gep(bbytes, [b.mul(at, const(2))]), bstride)
                    for s in range(strips):
                        for v in range(vecs):
                            tiles.dot(c_tile(s, v), a_tile(s), b_tile(v))
            for s in range(strips):
                for v in range(vecs):
                    tiles.store(c_tile(s, v), c_at(s, v), cstride)
            with b.if_then(b.icmp_signed("<", k16, ints["k"])):      # each tap's last k % 16 steps
                vectors(target, dict(tints, aoff=b.add(ints["aoff"], b.mul(k16, ints["astep"])),
                                     boff=b.add(ints["boff"], b.mul(k16, ints["bstep"])),
                                     k=b.sub(ints["k"], k16), accumulate=const(1)), False)
            if rounding:
                _round_out(b, rows, vecs, target["c"], ptrs["c"], ints, native)
        with otherwise:
            vectors(ptrs, ints, rounding)


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no such type): the result of the native conversion."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


def _round_out(b: ir.IRBuilder, rows: int, vecs: int, sums: ir.Value, c: ir.Value, ints: dict,
               native: bool) -> None:
    """``c``'s block (bf16 bits, rows ``ldc`` apart from ``coff``) = the rounded f32 ``sums`` (packed
    rows): natively by ``VCVTNEPS2BF16`` (round to nearest even, NaN made quiet; it reads denormal
    inputs as zeros, and the tiles' and the dot instruction's sums hold none: both flush results
    below 2^-126), else by :func:`.microkernel._rounded`'s integer steps (the same bits here)."""
    from .microkernel import _rounded
    i64 = ir.IntType(64)
    acc_t, out_t = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(16), 16)
    convert = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VectorType(_BFloat(), 16), [acc_t]),
                                             "llvm.x86.avx512bf16.cvtneps2bf16.512") if native else None
    for r in range(rows):
        for v in range(vecs):
            value = b.load(b.bitcast(b.gep(sums, [ir.Constant(i64, (r * vecs + v) * 16)]), acc_t.as_pointer()), align=4)
            at = b.add(ints["coff"], b.add(b.mul(ints["ldc"], ir.Constant(i64, r)), ir.Constant(i64, v * 16)))
            bits = b.bitcast(b.call(convert, [value]), out_t) if native else _rounded(b, value, 16)
            b.store(bits, b.bitcast(b.gep(c, [at]), out_t.as_pointer()), align=2)
