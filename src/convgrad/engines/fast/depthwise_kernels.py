"""Register-blocked depthwise kernels (f32), emitted as LLVM IR from numba ``@intrinsic`` s.

A depthwise convolution (one input and one output channel per group) has no reduction over
channels: with channels-last (NXC) data every product is an elementwise one of ``W``-lane vectors
of channels. Along the innermost spatial axis, tap ``t`` of position ``p`` reads the source at
``i_t(p) = p*mul + tk[t]``, which is inside the source where ``0 <= i_t(p) < size``; ``ts[t]``
is the tap's row offset (its outer axes), ``xstep``/``sstep`` the positions' stride (elements). Lanes
``l < lanes`` of one vector of channels (the rest masked: a channel tail) at element offsets:

- :func:`reduce` (weights gradient): ``taps`` x ``vecs`` accumulators in registers while the
  positions ``p0 <= p < p1`` stream by, one ``dy`` load per vector and one ``x`` load per FMA::

      acc[aoff + tw[t] + v*W + l] += sum_p x[xoff + ts[t] + i_t(p)*xstep + v*W + l]
                                          * dy[yoff + p*ystep + v*W + l]

- :func:`gather` (forward, and backward data per stride phase): ``rows`` positions'
  accumulators in registers, a runtime loop over the ``nrows`` kernel rows ``t`` and the
  ``taps`` taps ``j`` of a row unrolled (source position ``(p0 + r)*mul + tk0 + j*step``), each
  distinct source vector loaded once (stride 1: ``rows + taps - 1`` loads for ``rows*taps``
  FMAs) and one weight load per tap::

      out[ooff + (p0 + r)*ostep + l] = sum_{t, j} src[soff + ts[t] + ((p0 + r)*mul + tk0 + j*step)*sstep + l]
                                                  * w[woff + tw[t] + j*wstep + l]

``masked`` kernels (a constant of :func:`reduce`; a runtime branch of :func:`gather`, taken by
a block with a read outside the source) test every tap of every position (a tap outside the
source adds nothing: padding is no part of the sums, so an Inf or NaN elsewhere never meets a
padded zero); the others assume every tap inside (the interior of a row). ``width``,
``taps``/``rows``, ``vecs``, ``step``, ``mul`` and ``masked`` are compile-time constants (closure
variables of the calling driver); the drivers run through :class:`.microkernel.parallel_items`. A
16-wide kernel on an AVX2 host is legalised by LLVM (correct, not fast).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic

from ...casts import F16_BITS, F32_VALUES
from . import microkernel
from .geometry import tap
from .microkernel import _constant, _rounded
from .tuning import TUNING

__all__ = ["reduce", "gather"]

_I64, _I32, _I16, _F32 = ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.FloatType()


class _Vectors:
    """Loads, stores and FMAs of ``width`` f32 lanes, the lanes at and above ``lanes`` masked.
    An array of 16-bit elements (``kind``: bf16 or f16 bits) is widened as it is loaded (exact)
    and rounded to nearest even as it is stored (bf16: :func:`.microkernel._rounded`, a NaN made
    quiet; f16: ``fptrunc``)."""

    def __init__(self, builder: ir.IRBuilder, width: int, lanes: ir.Value, kind: int = F32_VALUES,
                 stream: bool = False):
        self.b, self.width, self.kind, self.stream = builder, width, kind, stream
        self.vec, self.half = ir.VectorType(_F32, width), ir.VectorType(_I16, width)
        module = builder.module
        mask_t = ir.VectorType(ir.IntType(1), width)
        self.fma = cgutils.get_or_insert_function(module, ir.FunctionType(self.vec, [self.vec] * 3),
                                                  f"llvm.fma.v{width}f32")
        self._load, self._store = {}, {}
        for vec, name in ((self.vec, f"v{width}f32"), (self.half, f"v{width}i16")):
            ptr_t = vec.as_pointer()
            self._load[vec] = cgutils.get_or_insert_function(
                module, ir.FunctionType(vec, [ptr_t, _I32, mask_t, vec]), f"llvm.masked.load.{name}.p0")
            self._store[vec] = cgutils.get_or_insert_function(
                module, ir.FunctionType(ir.VoidType(), [vec, ptr_t, _I32, mask_t]), f"llvm.masked.store.{name}.p0")
        iota = ir.Constant(ir.VectorType(_I64, width), list(range(width)))
        self.full = ir.Constant(mask_t, [1] * width)
        self.tail = builder.icmp_signed("<", iota, self.splat(lanes, ir.VectorType(_I64, width)))
        self.whole = builder.icmp_signed(">=", lanes, ir.Constant(_I64, width))
        self.zero = ir.Constant(self.vec, None)

    def splat(self, value: ir.Value, vec: ir.VectorType) -> ir.Value:
        b = self.b
        one = b.insert_element(ir.Constant(vec, None), value, ir.Constant(_I32, 0))
        return b.shuffle_vector(one, one, ir.Constant(ir.VectorType(_I32, vec.count), [0] * vec.count))

    def _vec(self, base: ir.Value) -> ir.VectorType:
        return self.half if base.type.pointee == _I16 else self.vec

    def _ptr(self, base: ir.Value, offset: ir.Value) -> ir.Value:
        return self.b.bitcast(self.b.gep(base, [offset]), self._vec(base).as_pointer())

    def load(self, base: ir.Value, offset: ir.Value, tail: bool = True) -> ir.Value:
        """The f32 vector at ``base[offset:]`` (the masked lanes zero with ``tail``)."""
        vec, b = self._vec(base), self.b
        value = b.call(self._load[vec], [self._ptr(base, offset), ir.Constant(_I32, 2 if vec is self.half else 4),
                                         self.tail if tail else self.full, ir.Constant(vec, None)])
        if vec is self.vec:
            return value
        if self.kind == F16_BITS:
            return b.fpext(b.bitcast(value, ir.VectorType(ir.HalfType(), self.width)), self.vec)
        wide = b.shl(b.zext(value, ir.VectorType(_I32, self.width)), ir.Constant(ir.VectorType(_I32, self.width),
                                                                                [16] * self.width))
        return b.bitcast(wide, self.vec)

    def store(self, value: ir.Value, base: ir.Value, offset: ir.Value, tail: bool = True,
              where: ir.Value | None = None) -> None:
        """Store ``value`` at ``base[offset:]`` (the masked lanes with ``tail``; nothing unless ``where``)."""
        vec, b = self._vec(base), self.b
        if vec is not self.vec:
            value = (b.bitcast(b.fptrunc(value, ir.VectorType(ir.HalfType(), self.width)), vec) if self.kind == F16_BITS
                     else _rounded(b, value, self.width))
        ptr, size = self._ptr(base, offset), 2 if vec is self.half else 4
        whole = self.whole if tail else ir.Constant(ir.IntType(1), 1)
        if where is not None:
            whole = b.and_(whole, where)
        with b.if_else(whole, likely=True) as (plain, masked):   # a masked store is microcoded on AVX2 CPUs
            with plain:                                           # (AMD Zen 1-3: one per ~20 cycles)
                if self.stream:          # past the caches (the caller: whole lines, vectors aligned)
                    b.store(value, ptr, align=self.width * size).set_metadata(
                        "nontemporal", b.module.add_metadata([ir.Constant(_I32, 1)]))
                else:
                    b.store(value, ptr, align=size)
            with masked:
                mask = self.tail if tail else self.full
                if where is not None:
                    mask = b.select(where, mask, ir.Constant(mask.type, [0] * self.width))
                b.call(self._store[vec], [value, ptr, ir.Constant(_I32, size), mask])


def _loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, init: list[ir.Value],
          body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]], unroll: bool = True) -> list[ir.Value]:
    """``for i in range(start, stop): state = body(i, state)``, the state (vectors) carried in
    phis; returns the final state."""
    before = b.block
    head, end = b.append_basic_block("loop"), b.append_basic_block("loop_end")
    b.cbranch(b.icmp_signed("<", start, stop), head, end)
    b.position_at_end(head)
    i = b.phi(_I64)
    state = [b.phi(v.type) for v in init]
    new = body(i, state)
    nxt = b.add(i, ir.Constant(_I64, 1))
    latch = b.block
    back = b.cbranch(b.icmp_signed("<", nxt, stop), head, end)
    if not unroll:
        module = b.module
        loop_id = module.add_metadata([None, module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])])
        loop_id.operands = (loop_id, *loop_id.operands[1:])
        back.set_metadata("llvm.loop", loop_id)
    b.position_at_end(end)
    out = [b.phi(v.type) for v in init]
    i.add_incoming(start, before)
    i.add_incoming(nxt, latch)
    for phi, final, first, last in zip(state, out, init, new):
        phi.add_incoming(first, before)
        phi.add_incoming(last, latch)
        final.add_incoming(first, before)
        final.add_incoming(last, latch)
    return out


def _choose(b: ir.IRBuilder, cond: ir.Value, then: Callable[[], list[ir.Value]],
            otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
    """``then() if cond else otherwise()``: the code of both, their values merged in phis."""
    with b.if_else(cond) as (yes, no):
        with yes:
            first, first_end = then(), b.block
        with no:
            second, second_end = otherwise(), b.block
    merged = []
    for x, y in zip(first, second):
        phi = b.phi(x.type)
        phi.add_incoming(x, first_end)
        phi.add_incoming(y, second_end)
        merged.append(phi)
    return merged


def _tap_read(b: ir.IRBuilder, p: ir.Value, mul: ir.Value, tk: ir.Value, size: ir.Value,
              masked: bool) -> tuple[ir.Value, ir.Value | None]:
    """(innermost source index of a tap at position p, whether it is inside): a tap outside reads
    index 0 instead (any address inside will do; its product is dropped)."""
    index = b.add(b.mul(p, mul), tk)
    if not masked:
        return index, None
    inside = b.icmp_unsigned("<", index, size)
    return b.select(inside, index, ir.Constant(_I64, 0)), inside


def _data(context, builder, signature, argv, j: int) -> ir.Value:
    return cgutils.create_struct_proxy(signature.args[j])(context, builder, value=argv[j]).data


def _check(name: str, arrays: dict[str, types.Type], data: tuple[str, ...]) -> None:
    """Tables int64, ``data`` arrays float32 or uint16 (16-bit bits), the others float32."""
    for label, t in arrays.items():
        want = (types.int64,) if label in ("tw", "ts", "tk") else \
            (types.float32, types.uint16) if label in data else (types.float32,)
        if not isinstance(t, types.Array) or t.dtype not in want:
            raise errors.TypingError(f"depthwise_kernels.{name}: {label} must be a {' or '.join(map(str, want))} "
                                     f"array, got {t}")


@intrinsic
def reduce(typingctx, width, taps, vecs, acc, aoff, tw, x, xoff, ts, tk, xstep, dy, yoff, ystep, span, mul, size,
           lanes, kind, window):
    """The weights-gradient kernel (module docstring): ``taps`` x ``vecs`` accumulators of
    ``width`` lanes (the last vector's lanes from ``lanes`` on masked) over the positions
    ``span = (p0, lo, hi, p1)``: masked in [p0, lo) and [hi, p1), every tap inside in [lo, hi).
    ``x`` and ``dy`` of uint16 hold the bits of ``kind`` (a constant: :data:`convgrad.casts.BF16_BITS` or :data:`~convgrad.casts.F16_BITS`).
    ``window`` (a constant) > 1: the taps are groups of ``window`` taps of one kernel row reading
    consecutive positions (``tk[g*window + j] = tk[g*window] + j``, ``mul`` = 1), and [lo, hi)
    slides a window of x vectors along the row: one x load (and widening) per group and
    position, not one per tap."""
    _check("reduce", {"acc": acc, "tw": tw, "x": x, "ts": ts, "tk": tk, "dy": dy}, ("x", "dy"))
    i64 = types.int64
    sig = types.void(i64, i64, i64, acc, i64, tw, x, i64, ts, tk, i64, dy, i64, i64, types.UniTuple(i64, 4), i64, i64,
                     i64, i64, i64)

    def codegen(context, b, signature, argv):
        w, n_taps, n_vecs = (_constant(argv[j], name) for j, name in enumerate(("width", "taps", "vecs")))
        span = _constant(argv[19], "window")
        accp, twp, xp, tsp, tkp, dyp = (_data(context, b, signature, argv, j) for j in (3, 5, 6, 8, 9, 11))
        aoff_, xoff_, xstep_, yoff_, ystep_, mul_, size_, lanes_ = (argv[j] for j in (4, 7, 10, 12, 13, 15, 16, 17))
        bounds = [b.extract_value(argv[14], j) for j in range(4)]
        ops = _Vectors(b, w, lanes_, _constant(argv[18], "kind"))
        last = n_vecs - 1
        table = [[b.load(b.gep(p, [ir.Constant(_I64, t)])) for t in range(n_taps)] for p in (twp, tsp, tkp)]
        slots = [b.add(aoff_, off) for off in table[0]]
        rows = [b.add(xoff_, off) for off in table[1]]
        vec_off = [ir.Constant(_I64, v * w) for v in range(n_vecs)]
        accs = [ops.load(accp, b.add(slots[t], vec_off[v]), v == last) for t in range(n_taps) for v in range(n_vecs)]

        def body(masked: bool) -> Callable[[ir.Value, list[ir.Value]], list[ir.Value]]:
            def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                ybase = b.add(yoff_, b.mul(p, ystep_))
                dys = [ops.load(dyp, b.add(ybase, vec_off[v]), v == last) for v in range(n_vecs)]
                new = []
                for t in range(n_taps):
                    index, inside = _tap_read(b, p, mul_, table[2][t], size_, masked)
                    xbase = b.add(rows[t], b.mul(index, xstep_))
                    for v in range(n_vecs):
                        a = accs[t * n_vecs + v]
                        r = b.call(ops.fma, [ops.load(xp, b.add(xbase, vec_off[v]), v == last), dys[v], a])
                        new.append(r if inside is None else b.select(inside, r, a))
                return new
            return step

        def sliding(p: ir.Value, state: list[ir.Value]) -> list[ir.Value]:
            """One position of [lo, hi): per group its window's next x vectors, then the FMAs."""
            accs, held = state[:n_taps * n_vecs], state[n_taps * n_vecs:]
            ybase = b.add(yoff_, b.mul(p, ystep_))
            dys = [ops.load(dyp, b.add(ybase, vec_off[v]), v == last) for v in range(n_vecs)]
            new, carry = list(accs), []
            for g in range(n_taps // span):
                t0 = g * span
                xbase = b.add(rows[t0], b.mul(b.add(b.add(p, table[2][t0]), ir.Constant(_I64, span - 1)), xstep_))
                seen = held[g * (span - 1) * n_vecs:(g + 1) * (span - 1) * n_vecs] + \
                    [ops.load(xp, b.add(xbase, vec_off[v]), v == last) for v in range(n_vecs)]
                for j in range(span):
                    for v in range(n_vecs):
                        i = (t0 + j) * n_vecs + v
                        new[i] = b.call(ops.fma, [seen[j * n_vecs + v], dys[v], new[i]])
                carry += seen[n_vecs:]
            return new + carry

        accs = _loop(b, bounds[0], bounds[1], accs, body(True))
        if span > 1:   # the windows' first vectors, read at lo (inside the source; at 0 if [lo, hi) is empty)
            held = []
            for g in range(n_taps // span):
                for j in range(span - 1):
                    index = b.select(b.icmp_signed("<", bounds[1], bounds[2]),
                                     b.add(b.add(bounds[1], table[2][g * span]), ir.Constant(_I64, j)),
                                     ir.Constant(_I64, 0))
                    xbase = b.add(rows[g * span], b.mul(index, xstep_))
                    held += [ops.load(xp, b.add(xbase, vec_off[v]), v == last) for v in range(n_vecs)]
            accs = _loop(b, bounds[1], bounds[2], accs + held, sliding)[:n_taps * n_vecs]
        else:
            accs = _loop(b, bounds[1], bounds[2], accs, body(False))
        accs = _loop(b, bounds[2], bounds[3], accs, body(True))
        for t in range(n_taps):
            for v in range(n_vecs):
                ops.store(accs[t * n_vecs + v], accp, b.add(slots[t], vec_off[v]), v == last)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def gather(typingctx, width, rows, taps, step, mul, out, ooff, ostep, src, soff, sstep, ts, w, woff, wstep, tw, nrows,
           span, tk0, size, lanes, kind, vecs, stream):
    """The forward / backward-data kernel (module docstring): ``rows`` positions from ``p0`` of
    ``vecs`` adjacent vectors of ``width`` lanes (the last one's lanes from ``lanes`` on masked),
    the ``taps`` taps of each of the ``nrows`` kernel rows unrolled, each distinct source vector
    loaded once; positions from ``count`` are not written (``span = (p0, count)``); ``nrows`` = 0
    writes zeros. A block whose reads all lie inside the source runs unmasked, any other one
    tests each source position.
    ``src`` and ``out`` of uint16 hold the bits of ``kind`` (a constant: :data:`convgrad.casts.BF16_BITS` or
    :data:`~convgrad.casts.F16_BITS`): read exactly, and ``out`` rounded once as it is stored.
    ``stream`` (a constant): whole vectors stored non-temporally (the caller has each on a
    boundary of its size, and a position's ``vecs`` vectors whole cache lines)."""
    _check("gather", {"out": out, "src": src, "ts": ts, "w": w, "tw": tw}, ("out", "src"))
    i64 = types.int64
    sig = types.void(i64, i64, i64, i64, i64, out, i64, i64, src, i64, i64, ts, w, i64, i64, tw, i64,
                     types.UniTuple(i64, 2), i64, i64, i64, i64, i64, i64)

    def codegen(context, b, signature, argv):
        width_, n_rows, n_taps, step_, mul_ = (_constant(argv[j], name) for j, name in
                                               enumerate(("width", "rows", "taps", "step", "mul")))
        n_vecs, last = _constant(argv[22], "vecs"), _constant(argv[22], "vecs") - 1
        outp, srcp, tsp, wp, twp = (_data(context, b, signature, argv, j) for j in (5, 8, 11, 12, 15))
        ooff_, ostep_, soff_, sstep_, woff_, wstep_, nrows_, tk0_, size_, lanes_ = (
            argv[j] for j in (6, 7, 9, 10, 13, 14, 16, 18, 19, 20))
        p0_, count = (b.extract_value(argv[17], j) for j in range(2))
        ops = _Vectors(b, width_, lanes_, _constant(argv[21], "kind"), bool(_constant(argv[23], "stream")))
        const = functools.partial(ir.Constant, _I64)
        # source position (p0 + r)*mul + tk0 + j*step of tap j at position r: ``reads[e]`` the
        # (r, j) at offset e = r*mul + j*step from p0*mul + tk0
        reads: dict[int, list[tuple[int, int]]] = {}
        for r in range(n_rows):
            for j in range(n_taps):
                reads.setdefault(r * mul_ + j * step_, []).append((r, j))
        offsets = sorted(reads)
        first = b.add(b.mul(p0_, const(mul_)), tk0_)
        lo, hi = (b.add(first, const(e)) for e in (offsets[0], offsets[-1])) if offsets else (first, first)
        inner = b.and_(b.icmp_signed(">=", lo, const(0)), b.icmp_signed("<", hi, size_))

        def block(masked: bool, tail: bool) -> list[ir.Value]:
            """The sums of the block, each source position tested if ``masked``, the lanes from
            ``lanes`` on masked if ``tail``."""
            index = {e: b.add(first, const(e)) for e in offsets}
            inside = {e: b.icmp_unsigned("<", i, size_) for e, i in index.items()} if masked else {}
            where = {e: ops.splat(v, ops.tail.type) for e, v in inside.items()}
            src_off = {e: b.mul(b.select(inside[e], i, const(0)) if masked else i, sstep_)
                       for e, i in index.items()}

            def body(t: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                row, wrow = b.add(soff_, b.load(b.gep(tsp, [t]))), b.add(woff_, b.load(b.gep(twp, [t])))
                weights = [[ops.load(wp, b.add(b.add(wrow, b.mul(const(j), wstep_)), const(v * width_)),
                                     tail and v == last) for v in range(n_vecs)] for j in range(n_taps)]
                new = list(accs)
                for e in offsets:
                    for v in range(n_vecs):
                        source = ops.load(srcp, b.add(b.add(row, src_off[e]), const(v * width_)), tail and v == last)
                        for r, j in reads[e]:
                            a = new[r * n_vecs + v]
                            f = b.call(ops.fma, [source, weights[j][v], a])
                            new[r * n_vecs + v] = b.select(where[e], f, a) if masked else f
                return new

            # not unrolled on 8-wide vectors: AVX2's 16 registers spilled the sums and pointers of two
            # kernel rows (the 16-wide kernels keep LLVM's unrolling, as measured on the Zen 4)
            return _loop(b, const(0), nrows_, [ops.zero] * (n_rows * n_vecs), body, unroll=width_ != 8)

        versions = [functools.partial(_choose, b, inner, functools.partial(block, False, tail),
                                      functools.partial(block, True, tail)) for tail in (False, True)]
        if n_vecs > 1:   # whole vectors only (the drivers' contract): no channel tail to compile
            sums = versions[0]()
        else:
            sums = _choose(b, b.icmp_signed("==", lanes_, const(width_)), *versions)
        for r in range(n_rows):
            p = b.add(p0_, const(r))
            for v in range(n_vecs):
                ops.store(sums[r * n_vecs + v], outp, b.add(b.add(ooff_, b.mul(p, ostep_)), const(v * width_)),
                          v == last, where=b.icmp_signed("<", p, count))
        return context.get_dummy_value()

    return sig, codegen


# -- drivers: numba loops (parallel in numba's pool) around the kernels ---------------------------------
def reduce_block(kernel: tuple[int, int, int], channels: int, width: int, slide: bool = False) -> tuple[int, int, int]:
    """(taps, vecs, window) of the weights-gradient kernel. With ``slide`` (stride and dilation 1
    along the innermost axis, a kernel wider than 1 there): of all the taps and one kernel row of
    taps, whose accumulators and sliding windows (a vector per tap each, and a dy vector) fit the
    vector registers (32 zmm or 16 ymm) for as many vectors as fit, the one of more accumulators
    (all the taps on a tie), ``window`` the kernel's width (a 3x3 row of 4 vectors ran MobileNet's
    stride-1 layers of 128-1024 channels 1.25-1.5x faster than all taps of one vector on a Zen 5:
    each call reads whole 256-byte runs of channels). Otherwise (``window`` 0)
    all the taps, else one kernel row, whose accumulators fit for a cache line of channels (64
    bytes: two 8-wide vectors, where the channels have them; the line's dy vectors and one x
    vector beside them), else the first of those or one tap that fits for one vector. Then as
    many vectors (up to 4, and up to the channels' full vectors) as fit. (On 8-wide vectors, all
    3x3 taps of one vector ran MobileNet's stride-2 weights gradients 1.3-4.2x slower than a
    kernel row of three vectors: the other half of each line was fetched again by the next call.)
    But on 16 lanes, from 8 vectors of channels, a kernel row of 4 vectors: whole 256-byte runs
    of a position's channels (MobileNet's stride-2 layers of 128-512 channels 0.83-0.88x the time
    of all 9 taps of 3 vectors and their one-vector tails on a Zen 5; 64 channels 1.05-1.18x slower)."""
    regs = 32 if width == 16 else 16
    k0, k1, k2 = kernel
    fit = min(4, max(1, channels // width))
    if slide and k2 > 1:
        options = [(t, max(1, min(fit, regs // (2 * t + 1)))) for t in (k0 * k1 * k2, k2) if 2 * t + 1 <= regs]
        if options:
            return *max(options, key=lambda option: option[0] * option[1]), k2
    if width == 16 and k2 > 1 and channels >= 8 * width and 4 * (k2 + 1) + 1 <= regs:
        return k2, 4, 0
    line = min(fit, max(1, 16 // width))
    taps = next((t for t in (k0 * k1 * k2, k2) if line * (t + 1) + 1 <= regs), None) or \
        next(t for t in (k0 * k1 * k2, k2, 1) if t + 2 <= regs or t == 1)
    return taps, max(1, min(fit, (regs - 1) // (taps + 1))), 0


@functools.cache
def weights_driver(width: int, kind: int, taps: int, vecs: int, window: int, aligned: bool) -> Callable:
    """``drive(parts, x, dy, acc, xshape, yshape, kshape, stride, dilation, pad, parts, head)``: adds
    to ``acc[part, k, c]`` (flat, (parts, K + 1, C); row K a scratch row) the weights gradient of
    the rows ``part`` owns, for C-contiguous flat NXC ``x`` (xshape, 5-D) and ``dy`` (yshape): f32,
    or uint16 bits of ``kind``; ``window`` > 1: the kernel's width, with stride and dilation 1
    along the innermost axis (:func:`reduce`); the shapes int64 (:class:`.microkernel.parallel_items`).
    Per row and group of taps: the ``head`` channels (0 unless ``aligned``) in one vector, blocks
    of ``vecs`` vectors from there, then the rest: with ``aligned`` one block whose last vector
    is short where it needs ``vecs`` vectors, else single vectors."""
    block = width * vecs

    def part_of(part, x, dy, acc, xshape, yshape, kshape, stride, dilation, pad, parts,
                head):  # pragma: no cover - compiled
        n_, i0_, i1_, i2_, c_ = xshape
        o0_, o1_, o2_ = yshape[1], yshape[2], yshape[3]
        k0_, k1_, k2_ = kshape
        ntaps = k0_ * k1_ * k2_
        rows = n_ * o0_ * o1_
        full = head + (c_ - head) // block * block     # the channels of whole blocks end there
        ts, tk, tw = np.empty(taps, np.int64), np.empty(taps, np.int64), np.empty(taps, np.int64)
        aoff = part * (ntaps + 1) * c_
        for row in range(part * rows // parts, (part + 1) * rows // parts):
            n, o0, o1 = row // (o0_ * o1_), row // o1_ % o0_, row % o1_
            yoff = row * o2_ * c_
            for first in range(0, ntaps, taps):
                used, lo_k, hi_k = 0, 0, 0
                for j in range(taps):
                    t = first + j
                    k0, k1, k2 = t // (k1_ * k2_), t // k2_ % k1_, t % k2_
                    i0 = tap(o0, k0, stride[0], dilation[0], pad[0], i0_, False)
                    i1 = tap(o1, k1, stride[1], dilation[1], pad[1], i1_, False)
                    inside = i0 >= 0 and i1 >= 0
                    ts[j] = ((n * i0_ + i0) * i1_ + i1) * i2_ * c_ if inside else n * i0_ * i1_ * i2_ * c_
                    tw[j] = t * c_ if inside else ntaps * c_  # a tap in the padding sums into the scratch row
                    tk[j] = k2 * dilation[2] - pad[2]
                    used += inside
                    lo_k, hi_k = min(lo_k, tk[j]) if j else tk[j], max(hi_k, tk[j]) if j else tk[j]
                if used == 0:
                    continue
                lo = min(o2_, max(0, -(lo_k // stride[2])))
                hi = max(lo, min(o2_, (i2_ - 1 - hi_k) // stride[2] + 1))
                if head:
                    reduce(width, taps, 1, acc, aoff, tw, x, 0, ts, tk, c_, dy, yoff, c_,
                           (0, lo, hi, o2_), stride[2], i2_, head, kind, window)
                for c in range(head, full, block):
                    reduce(width, taps, vecs, acc, aoff + c, tw, x, c, ts, tk, c_, dy, yoff + c, c_,
                           (0, lo, hi, o2_), stride[2], i2_, width, kind, window)
                if aligned and c_ - full > (vecs - 1) * width:     # a block whose last vector is short
                    reduce(width, taps, vecs, acc, aoff + full, tw, x, full, ts, tk, c_, dy, yoff + full, c_,
                           (0, lo, hi, o2_), stride[2], i2_, c_ - full - (vecs - 1) * width, kind, window)
                    continue
                for c in range(full, c_, width):
                    reduce(width, taps, 1, acc, aoff + c, tw, x, c, ts, tk, c_, dy, yoff + c, c_,
                           (0, lo, hi, o2_), stride[2], i2_, min(width, c_ - c), kind, window)

    return microkernel.parallel_items(part_of)


def axis_taps(out_size: int, kernel: int, stride: int, dilation: int, pad: int, size: int,
              transposed: bool) -> np.ndarray:
    """``(out_size, kernel)`` int64: where tap k of position a reads along one axis (-1: nowhere),
    :func:`.geometry.tap` for every (a, k)."""
    a, k = np.arange(out_size)[:, None], np.arange(kernel)[None, :]
    if transposed:
        t = a + pad - k * dilation
        return np.where((t >= 0) & (t % stride == 0) & (t // stride < size), t // stride, -1)
    i = a * stride + k * dilation - pad
    return np.where((i >= 0) & (i < size), i, -1)


def gather_phases(out_size: int, kernel: int, stride: int, dilation: int, pad: int,
                  transposed: bool) -> tuple[np.ndarray, int, int, int, int]:
    """The innermost axis' taps per phase: (rows ``(r, kfirst, taps, tk0, count)``, step, mul,
    period P, phase count). Forward: one phase, positions ``p`` read ``p*S + tk0 + j*D`` through
    the taps ``k = j``. Data gradient (``transposed``): position ``r + S*m`` reads ``dy[m + tk0 +
    j*step]`` through the taps ``k = kfirst + j*P`` (the k with ``r + PB - k*D`` a multiple of S;
    ``P = S/g``, ``step = -D/g``, ``g = gcd(S, D)``). Phases at or beyond ``out_size`` are left out."""
    if not transposed:
        return np.array([[0, 0, kernel, -pad, out_size]], np.int64), dilation, stride, 1, 1
    g = math.gcd(stride, dilation)
    period, rows = stride // g, []
    for r in range(min(stride, out_size)):
        ks = [k for k in range(kernel) if (r + pad - k * dilation) % stride == 0]
        kfirst = ks[0] if ks else 0
        rows.append((r, kfirst, len(ks), (r + pad - kfirst * dilation) // stride, -(-(out_size - r) // stride)))
    return np.array(rows, np.int64), -(dilation // g), 1, period, stride


def gather_block(count: int, taps: int, width: int, channels: int) -> tuple[int, int]:
    """(rows, vecs) of a :func:`gather` block for rows of ``count`` positions. Where
    ``TUNING.gather_vectors[width]`` allows several vectors and the channels are whole vectors, a
    block is one position of as many adjacent vectors as divide them (that number halved until
    it does, at least 2): on 8-wide vectors, half a cache line each, blocks of several positions
    of one vector ran 1.2-2.6x slower (docs/engine-measurements.md). Otherwise ``vecs`` is 2
    where the channels are exactly two vectors (so that a block reads and writes whole positions,
    and a block of at least 4 positions still fits; else 1: more positions per block beat wider
    blocks on more channels on 16-wide vectors), then ``rows`` positions: the fewest padded
    positions, then the largest block, with ``rows`` x ``vecs`` accumulators, ``taps`` x ``vecs``
    weights and ``vecs`` + 1 more within the vector registers (32 zmm or 16 ymm), at most 16."""
    vectors, vecs = channels // width if channels % width == 0 else 0, TUNING.gather_vectors.get(width, 1)
    while vecs > 1 and vectors % vecs:
        vecs //= 2
    if vecs > 1 and vectors:
        return 1, vecs
    regs = 32 if width == 16 else 16
    vecs = 2 if channels == 2 * width and (regs - 3 * taps - 3) // 2 >= 4 else 1
    top = max(4, min(16, (regs - vecs * (taps + 1) - 1) // vecs))
    return min(range(4, top + 1), key=lambda r: (-(-count // r) * r, -r)), vecs


@functools.cache
def gather_driver(width: int, kind: int, rows: int, vecs: int, taps: tuple[int, ...], step: int, mul: int,
                  aligned: bool, stream: bool) -> Callable:
    """``drive(chunks, src, w, out, sshape, oshape, kshape, outer0, outer1, phases, spread, head)``:
    fills ``out`` (flat, oshape 5-D) from ``src`` (flat, sshape) and ``w`` (flat, blocked by channels):
    per row of ``out`` the kernel rows ``(k0, k1)`` that read the source (``outer0[a0, k0]``,
    ``outer1[a1, k1]``: :func:`axis_taps`), per phase (``phases``: :func:`gather_phases`, whose
    ``taps`` are among ``taps``) its positions ``r + P'*m`` (``spread = (P', P, B)``: phase count,
    tap period and the weights' block of channels: ``w`` is (C/B, K0, K1, K2, B)) in blocks of
    ``rows``; rows in ``chunks`` parallel chunks; ``vecs`` > 1 only where the channels are
    ``vecs`` whole vectors (:func:`gather_block`); with ``aligned`` (one vector a block) the
    first ``head`` channels in a vector of their own, the others from there (else ``head`` 0);
    ``stream``: :func:`gather`'s. ``src`` f32, or uint16
    bits of ``kind``; ``out`` f32, or uint16 bits of ``kind`` rounded as they are stored; ``w``
    f32; the tables int64 (:class:`.microkernel.parallel_items`)."""
    wide, narrow = max(taps), min(taps)
    single = wide == narrow   # one kernel to compile
    streams = int(stream)     # a compile-time constant of :func:`gather`

    def chunk_of(chunk, chunks, src, w, out, sshape, oshape, kshape, outer0, outer1, phases,
                 spread, head):  # pragma: no cover - compiled
        n_, s0_, s1_, s2_, c_ = sshape
        a0_, a1_, a2_ = oshape[1], oshape[2], oshape[3]
        k0_, k1_, k2_ = kshape
        lines = n_ * a0_ * a1_
        wb = spread[2]                    # w's channel stride: C, or a block's channels (w blocked)
        ostep, wstep = spread[0] * c_, spread[1] * wb
        ts, tw = np.empty(k0_ * k1_, np.int64), np.empty(k0_ * k1_, np.int64)
        for line in range(chunk * lines // chunks, (chunk + 1) * lines // chunks):
            n, a0, a1 = line // (a0_ * a1_), line // a1_ % a0_, line % a1_
            used = 0
            for k0 in range(k0_):
                b0 = outer0[a0, k0]
                for k1 in range(k1_):
                    b1 = outer1[a1, k1]
                    if b0 >= 0 and b1 >= 0:
                        ts[used], tw[used] = ((n * s0_ + b0) * s1_ + b1) * s2_ * c_, (k0 * k1_ + k1) * k2_ * wb
                        used += 1
            for m in range(0, phases[0, 4], rows):  # the phases' blocks in turn: the writes move along the row
                for ph in range(phases.shape[0]):
                    r, kfirst, ntaps, tk0, count = phases[ph]
                    if m >= count:
                        continue
                    nrows, span = (used if ntaps else 0), (m, count)
                    ooff = (line * a2_ + r) * c_
                    if aligned:          # the channels before the first vector boundary (vecs = 1)
                        if single or ntaps == wide:
                            gather(width, rows, wide, step, mul, out, ooff, ostep, src, 0, c_, ts, w,
                                   kfirst * wb, wstep, tw, nrows, span, tk0, s2_, head, kind, vecs, streams)
                        else:
                            gather(width, rows, narrow, step, mul, out, ooff, ostep, src, 0, c_, ts, w,
                                   kfirst * wb, wstep, tw, nrows, span, tk0, s2_, head, kind, vecs, streams)
                    for c in range(head if aligned else 0, c_, width * vecs):   # ``vecs`` vectors of channels at a time
                        lanes = min(width, c_ - c - (vecs - 1) * width)
                        woff = c // wb * k0_ * k1_ * k2_ * wb + c % wb     # channel c's weights
                        if single or ntaps == wide:
                            gather(width, rows, wide, step, mul, out, ooff + c, ostep, src, c, c_, ts, w,
                                   woff + kfirst * wb, wstep, tw, nrows, span, tk0, s2_, lanes, kind, vecs, streams)
                        else:
                            gather(width, rows, narrow, step, mul, out, ooff + c, ostep, src, c, c_, ts, w,
                                   woff + kfirst * wb, wstep, tw, nrows, span, tk0, s2_, lanes, kind, vecs, streams)

    return microkernel.parallel_items(chunk_of)
