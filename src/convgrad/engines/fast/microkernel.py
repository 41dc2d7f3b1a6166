"""Register-blocked f32 micro-kernels, emitted as LLVM IR from numba ``@intrinsic``\\ s.

One kernel of block ``R x V`` and vector width ``W`` holds ``R*V`` accumulators of ``W`` f32
lanes in vector registers and computes, for rows ``r < R``, vectors ``v < V``, lanes ``l < W``::

    c[coff + r*ldc + v*W + l] += sum_{t < ntaps} sum_{i < k}
                                 a[aoff + ta[t] + r*lda + i*astep] * b[boff + tb[t] + i*bstep + v*W + l]

``a`` is broadcast (one value per row), ``b`` read as ``V`` vectors, every product added by one
fused multiply-add (``llvm.fma.v<W>f32``) into its accumulator, in the order ``t`` then ``i``
(ascending). The accumulators are loaded from ``c`` once and stored once per call. ``ta``/``tb``
are offset tables (the kernel taps of a convolution, or rows of positions): implicit GEMM, the
operands read where they lie. A 16-wide kernel on an AVX2 host is legalised by LLVM into pairs of
8-wide instructions (correct; fast only with AVX-512).

``BLOCKS`` lists the register blocks compiled per width (``R*V + V + 1 <= 15`` registers on
AVX2); :func:`run` dispatches on ``(W, R, V)`` at run time, so one compiled function serves every
block and family (compiled once, cached on disk by numba).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["BLOCKS", "WIDTHS", "block_for", "run", "call", "fma_peak"]

#: Register blocks (rows R, vectors V). Measured on AVX2 (Zen 3, W=8, panels in L1, one thread):
#: 8x1 58, 6x2 82, 4x3 82 GFLOP/s; 3x4 only 36 (12 accumulators + 4 operands + a broadcast spill
#: out of 16 registers), so it is not used.
BLOCKS = ((8, 1), (6, 2), (4, 3))
WIDTHS = (8, 16)


def block_for(channels: int, width: int) -> int:
    """The index in ``BLOCKS`` of the block for ``channels`` output channels of vectors of
    ``width``: one or two vectors if that is all there is, else the one of 2 or 3 vectors that
    wastes fewer lanes on the channel tail (2 on a tie: 6x2 keeps more rows in flight)."""
    vectors = -(-channels // width)
    if vectors <= 2:
        return vectors - 1
    waste = {v: -(-vectors // v) * v - vectors for v in (2, 3)}
    return 1 if waste[2] <= waste[3] else 2


def _make(rows: int, vecs: int, width: int):
    """The intrinsic of one block shape and width (see the module docstring)."""

    @intrinsic
    def kernel(typingctx, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k):
        i64t = types.int64
        sig = types.void(c, i64t, i64t, a, i64t, i64t, i64t, b, i64t, i64t, ta, tb, i64t, i64t)

        def codegen(context, builder, signature, argv):
            (c_, coff_, ldc_, a_, aoff_, lda_, astep_, b_, boff_, bstep_, ta_, tb_, ntaps_, k_) = argv
            data = {name: cgutils.create_struct_proxy(signature.args[j])(context, builder, value=argv[j]).data
                    for name, j in (("c", 0), ("a", 3), ("b", 7), ("ta", 10), ("tb", 11))}
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            vec = ir.VectorType(f32, width)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                                 f"llvm.fma.v{width}f32")
            const = lambda v: ir.Constant(i64, v)  # noqa: E731
            cptr, aptr = data["c"], data["a"]
            bptr, taptr, tbptr = data["b"], data["ta"], data["tb"]
            caddr = [[builder.bitcast(builder.gep(cptr, [builder.add(coff_, builder.add(
                builder.mul(ldc_, const(r)), const(v * width)))]), vec.as_pointer())
                for v in range(vecs)] for r in range(rows)]
            init = [builder.load(p, align=4) for row in caddr for p in row]
            entry = builder.block
            tloop = builder.append_basic_block("taps")
            iloop = builder.append_basic_block("reduce")
            tnext = builder.append_basic_block("next_tap")
            done = builder.append_basic_block("done")
            zero = const(0)
            go = builder.and_(builder.icmp_signed(">", ntaps_, zero), builder.icmp_signed(">", k_, zero))
            builder.cbranch(go, tloop, done)

            builder.position_at_end(tloop)
            t = builder.phi(i64)
            t_accs = [builder.phi(vec) for _ in init]
            abase = builder.add(aoff_, builder.load(builder.gep(taptr, [t])))
            bbase = builder.add(boff_, builder.load(builder.gep(tbptr, [t])))
            builder.branch(iloop)

            builder.position_at_end(iloop)
            i = builder.phi(i64)
            accs = [builder.phi(vec) for _ in init]
            arow = builder.add(abase, builder.mul(i, astep_))
            brow = builder.add(bbase, builder.mul(i, bstep_))
            bvs = [builder.load(builder.bitcast(builder.gep(bptr, [builder.add(brow, const(v * width))]),
                                                vec.as_pointer()), align=4) for v in range(vecs)]
            new = []
            for r in range(rows):
                av = builder.load(builder.gep(aptr, [builder.add(arow, builder.mul(lda_, const(r)))]))
                splat = builder.insert_element(ir.Constant(vec, None), av, ir.Constant(i32, 0))
                splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(i32, width), [0] * width))
                new += [builder.call(fma, [splat, bvs[v], accs[r * vecs + v]]) for v in range(vecs)]
            inext = builder.add(i, const(1))
            builder.cbranch(builder.icmp_signed("<", inext, k_), iloop, tnext)

            builder.position_at_end(tnext)
            tplus = builder.add(t, const(1))
            builder.cbranch(builder.icmp_signed("<", tplus, ntaps_), tloop, done)

            builder.position_at_end(done)
            outs = [builder.phi(vec) for _ in init]
            for j, out in enumerate(outs):
                out.add_incoming(init[j], entry)
                out.add_incoming(new[j], tnext)
                t_accs[j].add_incoming(init[j], entry)
                t_accs[j].add_incoming(new[j], tnext)
                accs[j].add_incoming(t_accs[j], tloop)
                accs[j].add_incoming(new[j], iloop)
            t.add_incoming(zero, entry)
            t.add_incoming(tplus, tnext)
            i.add_incoming(zero, tloop)
            i.add_incoming(inext, iloop)
            for j, out in enumerate(outs):
                builder.store(out, caddr[j // vecs][j % vecs], align=4)
            return context.get_dummy_value()

        return sig, codegen

    return kernel


_k8_0, _k8_1, _k8_2 = (_make(r, v, 8) for r, v in BLOCKS)
_k16_0, _k16_1, _k16_2 = (_make(r, v, 16) for r, v in BLOCKS)


@numba.njit(inline="always")
def run(width, block, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k):  # pragma: no cover
    """The kernel of ``width`` (8 or 16) and ``BLOCKS[block]`` (see the module docstring)."""
    if width == 8:
        if block == 0:
            _k8_0(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)
        elif block == 1:
            _k8_1(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)
        else:
            _k8_2(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)
    else:
        if block == 0:
            _k16_0(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)
        elif block == 1:
            _k16_1(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)
        else:
            _k16_2(c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)


@numba.njit(cache=True)
def call(width, block, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k):  # pragma: no cover
    """:func:`run` callable from Python (tests)."""
    run(width, block, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k)


@numba.njit(parallel=True, cache=True)
def _spin(width, block, c, a, b, depth, reps, threads):  # pragma: no cover - compiled
    """``reps`` kernel calls per thread on its own packed panels (``depth`` x block, in L1)."""
    rows, vecs = BLOCKS_ARRAY[block, 0], BLOCKS_ARRAY[block, 1]
    vw = vecs * width
    one = np.zeros(1, np.int64)
    for p in numba.prange(threads):
        for _ in range(reps):
            run(width, block, c, p * rows * vw, vw, a, p * depth * rows, 1, rows, b, p * depth * vw, vw,
                one, one, 1, depth)


def fma_peak(width: int, threads: int, seconds: float = 0.3) -> float:
    """GFLOP/s of the 6x2 kernel of ``width`` with its panels in L1 (256-deep), on ``threads``
    threads at once: the FMA peak the convolutions can approach (best of a few timed runs)."""
    import time
    block, depth = 1, 256
    rows, vecs = BLOCKS[block]
    c = np.zeros(threads * rows * vecs * width, np.float32)
    a = np.random.default_rng(0).standard_normal(threads * depth * rows).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(threads * depth * vecs * width).astype(np.float32)
    _spin(width, block, c, a, b, depth, 1, threads)
    reps, best, spent = 1000, 0.0, 0.0
    while spent < seconds:
        start = time.perf_counter()
        _spin(width, block, c, a, b, depth, reps, threads)
        elapsed = time.perf_counter() - start
        spent += elapsed
        if elapsed < seconds / 4:   # too short to time (thread wake-up): longer runs
            reps *= 4
            continue
        best = max(best, 2 * rows * vecs * width * depth * reps * threads / elapsed / 1e9)
    return best


BLOCKS_ARRAY = np.array(BLOCKS, np.int64)
