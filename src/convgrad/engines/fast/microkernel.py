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
AVX2); :func:`run` switches on ``(W, block)`` at run time among all of them, so one compiled
caller serves every block and family (compiled once, cached on disk by numba: numba checks only
the caller's own source file, so after editing this module delete the callers' caches, the
``jit.*`` files in ``__pycache__``).
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


def _emit(builder: ir.IRBuilder, rows: int, vecs: int, width: int, ptrs: dict, ints: dict) -> None:
    """Emit the block ``rows`` x ``vecs`` of ``width`` lanes at the builder's position (see the
    module docstring): accumulators loaded from c, a tap loop around a reduction loop, stored."""
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(f32, width)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{width}f32")
    const = lambda v: ir.Constant(i64, v)  # noqa: E731
    caddr = [[builder.bitcast(builder.gep(ptrs["c"], [builder.add(ints["coff"], builder.add(
        builder.mul(ints["ldc"], const(r)), const(v * width)))]), vec.as_pointer())
        for v in range(vecs)] for r in range(rows)]
    init = [builder.load(p, align=4) for row in caddr for p in row]
    entry = builder.block
    tloop, iloop = builder.append_basic_block("taps"), builder.append_basic_block("reduce")
    tnext, done = builder.append_basic_block("next_tap"), builder.append_basic_block("done")
    zero = const(0)
    builder.cbranch(builder.and_(builder.icmp_signed(">", ints["ntaps"], zero),
                                 builder.icmp_signed(">", ints["k"], zero)), tloop, done)

    builder.position_at_end(tloop)
    t = builder.phi(i64)
    t_accs = [builder.phi(vec) for _ in init]
    abase = builder.add(ints["aoff"], builder.load(builder.gep(ptrs["ta"], [t])))
    bbase = builder.add(ints["boff"], builder.load(builder.gep(ptrs["tb"], [t])))
    builder.branch(iloop)

    builder.position_at_end(iloop)
    i = builder.phi(i64)
    accs = [builder.phi(vec) for _ in init]
    arow = builder.add(abase, builder.mul(i, ints["astep"]))
    brow = builder.add(bbase, builder.mul(i, ints["bstep"]))
    bvs = [builder.load(builder.bitcast(builder.gep(ptrs["b"], [builder.add(brow, const(v * width))]),
                                        vec.as_pointer()), align=4) for v in range(vecs)]
    new = []
    for r in range(rows):
        av = builder.load(builder.gep(ptrs["a"], [builder.add(arow, builder.mul(ints["lda"], const(r)))]))
        splat = builder.insert_element(ir.Constant(vec, None), av, ir.Constant(i32, 0))
        splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(i32, width), [0] * width))
        new += [builder.call(fma, [splat, bvs[v], accs[r * vecs + v]]) for v in range(vecs)]
    inext = builder.add(i, const(1))
    builder.cbranch(builder.icmp_signed("<", inext, ints["k"]), iloop, tnext)

    builder.position_at_end(tnext)
    tplus = builder.add(t, const(1))
    builder.cbranch(builder.icmp_signed("<", tplus, ints["ntaps"]), tloop, done)

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


@intrinsic
def run(typingctx, width, block, c, coff, ldc, a, aoff, lda, astep, b, boff, bstep, ta, tb, ntaps, k):
    """The kernel of ``width`` (8 or 16) and ``BLOCKS[block]`` (see the module docstring): a
    switch over every compiled variant, so one compiled caller serves them all."""
    i64t = types.int64
    sig = types.void(i64t, i64t, c, i64t, i64t, a, i64t, i64t, i64t, b, i64t, i64t, ta, tb, i64t, i64t)

    def codegen(context, builder, signature, argv):
        ptrs = {name: cgutils.create_struct_proxy(signature.args[j])(context, builder, value=argv[j]).data
                for name, j in (("c", 2), ("a", 5), ("b", 9), ("ta", 12), ("tb", 13))}
        ints = dict(zip(("coff", "ldc", "aoff", "lda", "astep", "boff", "bstep", "ntaps", "k"),
                        (argv[j] for j in (3, 4, 6, 7, 8, 10, 11, 14, 15))))
        i64 = ir.IntType(64)
        end = builder.append_basic_block("kernel_end")
        key = builder.add(builder.mul(argv[0], ir.Constant(i64, len(BLOCKS))), argv[1])
        switch = builder.switch(key, end)
        for width_ in WIDTHS:
            for index, (rows, vecs) in enumerate(BLOCKS):
                case = builder.append_basic_block(f"kernel_{width_}_{rows}x{vecs}")
                switch.add_case(ir.Constant(i64, width_ * len(BLOCKS) + index), case)
                builder.position_at_end(case)
                _emit(builder, rows, vecs, width_, ptrs, ints)
                builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


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
